"""A scripted model API on 127.0.0.1: the model stand-in that drives the real agent CLIs in tests,
and ``ale-iac model-server`` for dry-running a deployer without a vendor.

It speaks the two wire APIs the CLIs use, as they send them (``tests/agents/`` runs the real CLIs against it):

* Anthropic Messages, ``POST /v1/messages`` (Claude Code adds ``?beta=true`` and always streams), and
  ``POST /v1/messages/count_tokens``; base URL ``http://127.0.0.1:PORT``;
* OpenAI Responses, ``POST /v1/responses`` (Codex); base URL ``http://127.0.0.1:PORT/v1``.

``stream: true`` gets server-sent events as the vendors send them, ``stream: false`` one JSON body.
``HEAD`` on any path answers 200 (Claude Code's probe). What it answers comes from a :class:`Plan`
(``ale_iac.llm.plan``): the first script whose regex is found in the prompt, and in it the turn whose
index is the number of tool results already in the conversation, so the server keeps no conversation
state. When the plan cannot be followed (no script matches, a tool the request does not offer, no turn
left), the answer is an HTTP 400 error whose message starts with :data:`PLAN_ERROR`, which the CLIs
report as a failed run and the run's gateway records per unit; the error is also kept in
:attr:`ScriptedModelServer.plan_errors`. Every request is recorded
(:attr:`ScriptedModelServer.requests`); credentials never are, only whether they were there (and, when
the server is given the key to expect, whether they matched it).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from types import TracebackType
from typing import Any, Final, Literal

from ale_iac.clock import utc_now
from ale_iac.llm import _serving as serving
from ale_iac.llm.plan import (
    NO_USAGE,
    SHELL,
    FailMode,
    FailTurn,
    Plan,
    Script,
    TextTurn,
    ToolTurn,
    Usage,
)

Api = Literal["anthropic", "openai"]
AuthSeen = Literal["absent", "present", "ok", "wrong"]
"""What the server saw of credentials: none; some (no key expected); all equal to the expected key; not."""
Then = Literal["end", "hang", "drop"]

MESSAGES: Final = "/v1/messages"
COUNT_TOKENS: Final = "/v1/messages/count_tokens"
RESPONSES: Final = "/v1/responses"
AUTH_HEADERS: Final = ("x-api-key", "authorization")
PLAN_ERROR: Final = "plan error: "
"""How the message of a plan error's HTTP 400 answer starts (the run reads it back from its gateway's record)."""
PLAN_ERROR_STATUS: Final = 400
"""A client error: no CLI or SDK retries it, so a plan error ends the agent's run at once."""
CLAUDE_SHELL: Final = "Bash"
CODEX_SHELLS: Final = ("exec_command", "shell_command", "shell")
"""Codex's native shell tool, newest first: ``exec_command {cmd}`` (0.171: unified exec, the default),
``shell_command {command: str}``, ``shell {command: [argv]}`` (older releases)."""


@dataclass(frozen=True)
class ServedRequest:
    """One request as the server saw and answered it.

    ``served`` is ``tool``, ``text``, ``fail:<mode>``, ``plan_error``, ``count_tokens``, ``head``,
    ``refused``, ``not_found``, ``bad_request`` or ``method_not_allowed``; ``tool`` is the tool name
    sent (``namespace/name`` for a Responses namespace tool); tokens are what the answer reported;
    ``headers`` are the names of the request's headers, never their values."""

    t: str
    api: Api | None
    method: str
    path: str
    status: int
    served: str
    model: str | None = None
    stream: bool | None = None
    offered: tuple[str, ...] = ()
    script: int | None = None
    turn: int | None = None
    tool: str | None = None
    arguments: dict[str, Any] | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    auth: AuthSeen = "absent"
    auth_headers: tuple[str, ...] = ()
    headers: tuple[str, ...] = ()
    query: str = ""
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Offered:
    """The tools a request offers, keyed by (namespace or None, name), with their argument names."""

    params: dict[tuple[str | None, str], frozenset[str] | None]
    display: tuple[str, ...]

    def has(self, namespace: str | None, name: str) -> bool:
        return (namespace, name) in self.params


@dataclass(frozen=True)
class _Reply:
    """What to answer: a tool call, a text, or a failure."""

    kind: Literal["tool", "text", "fail"]
    usage: Usage = NO_USAGE
    text: str = ""
    name: str = ""
    namespace: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    fail: FailMode | None = None
    status: int = 200
    script: int | None = None
    turn: int | None = None
    plan_error: str | None = None

    @property
    def served(self) -> str:
        if self.plan_error is not None:
            return "plan_error"
        return f"fail:{self.fail}" if self.kind == "fail" else self.kind

    @property
    def wire_tool(self) -> str | None:
        if self.kind != "tool":
            return None
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


# --- reading requests -------------------------------------------------------------------------


def _texts(content: Any) -> Iterator[str]:
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                yield part["text"]


def prompt_of(api: Api, body: dict[str, Any]) -> str:
    """The prompt a plan is matched against: the text of the user messages before the first answer.

    Claude Code puts the prompt in its first user message (after ``<system-reminder>`` blocks); Codex
    sends an ``<environment_context>`` user message first and the prompt in a second one."""
    items = body.get("messages") if api == "anthropic" else body.get("input")
    if isinstance(items, str):
        return items
    texts: list[str] = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        role = item.get("role")
        if item.get("type", "message") != "message" or role == "assistant":
            break
        if role == "user":
            texts.extend(_texts(item.get("content")))
    return "\n".join(texts)


_WRAPPER_BLOCK = re.compile(r"\A\s*<([A-Za-z_][\w-]*)\b[^>]*?(?:/>|>.*?</\1\s*>)", re.S)
"""A block a CLI wraps its own context in (``<system-reminder>...</system-reminder>``,
``<environment_context/>``), at the start of a text."""


def task_text_of(api: Api, body: dict[str, Any]) -> str:
    """The task's own words in the prompt: the last user text before the first answer, without the
    blocks the CLI wraps its own context in (Claude Code's ``<system-reminder>``, Codex's
    ``<environment_context>``); the whole prompt if nothing else is left."""
    items = body.get("messages") if api == "anthropic" else body.get("input")
    if isinstance(items, str):
        return items
    last = ""
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        if item.get("type", "message") != "message" or item.get("role") == "assistant":
            break
        if item.get("role") != "user":
            continue
        for text in _texts(item.get("content")):
            rest = text
            while found := _WRAPPER_BLOCK.match(rest):
                rest = rest[found.end() :]
            last = rest.strip() or last
    return last or prompt_of(api, body)


def tool_results_in(api: Api, body: dict[str, Any]) -> int:
    """How many tool results the conversation holds: the index of the turn to serve."""
    if api == "anthropic":
        return sum(
            1
            for message in body.get("messages") or []
            if isinstance(message, dict) and isinstance(message.get("content"), list)
            for block in message["content"]
            if isinstance(block, dict) and block.get("type") == "tool_result"
        )
    items = body.get("input")
    if not isinstance(items, list):
        return 0
    return sum(1 for item in items if isinstance(item, dict) and str(item.get("type", "")).endswith("_output"))


def _properties(schema: Any) -> frozenset[str] | None:
    props = schema.get("properties") if isinstance(schema, dict) else None
    return frozenset(props) if isinstance(props, dict) else None


def offered_tools(api: Api, body: dict[str, Any]) -> _Offered:
    params: dict[tuple[str | None, str], frozenset[str] | None] = {}
    display: list[str] = []
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        if api == "anthropic":
            name = tool.get("name")
            if isinstance(name, str):
                params[(None, name)] = _properties(tool.get("input_schema"))
                display.append(name)
        elif tool.get("type") == "namespace":
            namespace = str(tool.get("name"))
            for child in tool.get("tools") or []:
                if isinstance(child, dict) and isinstance(child.get("name"), str):
                    params[(namespace, child["name"])] = _properties(child.get("parameters"))
                    display.append(f"{namespace}/{child['name']}")
        elif isinstance(tool.get("name"), str):
            params[(None, tool["name"])] = _properties(tool.get("parameters"))
            display.append(tool["name"])
        else:
            display.append(f"<{tool.get('type')}>")
    return _Offered(params, tuple(display))


# --- choosing the answer ----------------------------------------------------------------------


def _only_known(arguments: dict[str, Any], known: frozenset[str] | None) -> dict[str, Any]:
    return dict(arguments) if known is None else {k: v for k, v in arguments.items() if k in known}


def _resolve_tool(api: Api, turn: ToolTurn, offered: _Offered) -> tuple[str | None, str, dict[str, Any]] | None:
    """(namespace, name, arguments) of the offered tool a logical tool turn maps to, or None."""
    if turn.tool == SHELL:
        command: str = turn.arguments["command"]
        rest = {k: v for k, v in turn.arguments.items() if k != "command"}
        if api == "anthropic":
            if offered.has(None, CLAUDE_SHELL):
                known = offered.params[(None, CLAUDE_SHELL)]
                return None, CLAUDE_SHELL, {"command": command, **_only_known(rest, known)}
            return None
        for name in CODEX_SHELLS:
            if offered.has(None, name):
                known = offered.params[(None, name)]
                if name == "exec_command":
                    return None, name, {"cmd": command, **_only_known(rest, known)}
                if name == "shell_command":
                    return None, name, {"command": command, **_only_known(rest, known)}
                return None, name, {"command": ["bash", "-lc", command], **_only_known(rest, known)}
        return None
    function = turn.function_name()
    if function is not None:
        return (None, function, dict(turn.arguments)) if offered.has(None, function) else None
    server, tool = turn.mcp_parts()
    flat = f"mcp__{server}__{tool}"
    if api == "openai" and offered.has(f"mcp__{server}", tool):
        return f"mcp__{server}", tool, dict(turn.arguments)
    if offered.has(None, flat):
        return None, flat, dict(turn.arguments)
    return None


def _not_offered(turn: ToolTurn, offered: _Offered) -> str:
    listed = ", ".join(offered.display) or "none"
    message = f"the plan calls {turn.tool}, which this request does not offer (tools offered: {listed})"
    if any(name in {"ToolSearch", "tool_search", "<tool_search>"} for name in offered.display):
        message += (
            "; the CLI defers MCP tools behind tool search (Claude Code: set ENABLE_TOOL_SEARCH=false; "
            "Codex: use a model name it does not know)"
        )
    return message


def choose_reply(
    plan: Plan, api: Api, body: dict[str, Any], failed: dict[tuple[int, int], int] | None = None
) -> _Reply:
    """The answer the plan gives to this request. ``failed`` counts, per (script, turn), the requests a
    fail turn with ``times`` has failed so far (updated here); such a turn is skipped once spent."""
    prompt = prompt_of(api, body)
    index = plan.script_for(prompt)
    if index is None:
        excerpt = " ".join(task_text_of(api, body).split())[:160]
        return _error_reply(f"no script matches the prompt {excerpt!r}")
    script: Script = plan.scripts[index]
    failed = {} if failed is None else failed
    live = [
        (i, t)
        for i, t in enumerate(script.turns)
        if not (isinstance(t, FailTurn) and t.times is not None and failed.get((index, i), 0) >= t.times)
    ]
    number = tool_results_in(api, body)
    if number >= len(live):
        texts = [t for t in script.turns if isinstance(t, TextTurn)]
        if not texts:
            return _error_reply(
                f"script {index} has {len(script.turns)} turns and no text turn; the conversation "
                f"already holds {number} tool results",
                index,
                number,
            )
        last = texts[-1]
        return _Reply("text", last.usage, text=last.text, script=index, turn=script.turns.index(last))
    number, turn = live[number]
    if isinstance(turn, TextTurn):
        return _Reply("text", turn.usage, text=turn.text, script=index, turn=number)
    if isinstance(turn, FailTurn):
        if turn.times is not None:
            failed[(index, number)] = failed.get((index, number), 0) + 1
        status = turn.http_status or 200
        return _Reply("fail", NO_USAGE, fail=turn.fail, status=status, script=index, turn=number)
    offered = offered_tools(api, body)
    resolved = _resolve_tool(api, turn, offered)
    if resolved is None:
        return _error_reply(f"script {index} turn {number}: " + _not_offered(turn, offered), index, number)
    namespace, name, arguments = resolved
    return _Reply("tool", turn.usage, name=name, namespace=namespace, arguments=arguments, script=index, turn=number)


def _error_reply(message: str, script: int | None = None, turn: int | None = None) -> _Reply:
    return _Reply("text", NO_USAGE, status=PLAN_ERROR_STATUS, script=script, turn=turn, plan_error=message)


# --- writing answers --------------------------------------------------------------------------


def _id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def _anthropic_block(reply: _Reply) -> dict[str, Any]:
    if reply.kind == "tool":
        return {"type": "tool_use", "id": _id("toolu_"), "name": reply.name, "input": reply.arguments}
    return {"type": "text", "text": reply.text}


def anthropic_events(reply: _Reply, model: str) -> tuple[list[bytes], Then]:
    message: dict[str, Any] = {
        "id": _id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": reply.usage.input_tokens, "output_tokens": 0},
    }
    events = [serving.sse("message_start", {"type": "message_start", "message": message})]
    if reply.fail == "hang":
        return events, "hang"
    block = _anthropic_block(reply)
    if block["type"] == "tool_use":
        start = {**block, "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
    else:
        start = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": block["text"] if reply.fail is None else "partial answer"}
    events.append(
        serving.sse("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start})
    )
    events.append(serving.sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}))
    if reply.fail == "drop":
        return events, "drop"
    stop_reason = "tool_use" if reply.kind == "tool" else "end_turn"
    events += [
        serving.sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        serving.sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": reply.usage.output_tokens},
            },
        ),
        serving.sse("message_stop", {"type": "message_stop"}),
    ]
    return events, "end"


def anthropic_message(reply: _Reply, model: str) -> dict[str, Any]:
    return {
        "id": _id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [_anthropic_block(reply)],
        "stop_reason": "tool_use" if reply.kind == "tool" else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": reply.usage.input_tokens, "output_tokens": reply.usage.output_tokens},
    }


def _responses_item(reply: _Reply) -> dict[str, Any]:
    if reply.kind == "tool":
        item: dict[str, Any] = {
            "type": "function_call",
            "id": _id("fc_"),
            "call_id": _id("call_"),
            "name": reply.name,
            "arguments": json.dumps(reply.arguments),
            "status": "completed",
        }
        if reply.namespace:
            item["namespace"] = reply.namespace
        return item
    return {
        "type": "message",
        "id": _id("msg_"),
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
    }


def _response_object(response_id: str, model: str, status: str) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": model,
        "output": [],
        "usage": None,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "temperature": None,
        "top_p": None,
    }


def _responses_usage(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


def responses_completed(
    reply: _Reply, model: str, response_id: str | None = None, item: dict[str, Any] | None = None
) -> dict[str, Any]:
    response = _response_object(response_id or _id("resp_"), model, "completed")
    response["output"] = [item or _responses_item(reply)]
    response["usage"] = _responses_usage(reply.usage)
    return response


def responses_events(reply: _Reply, model: str) -> tuple[list[bytes], Then]:
    sequence = iter(range(1_000_000))

    def event(kind: str, **data: Any) -> bytes:
        return serving.sse(kind, {"type": kind, "sequence_number": next(sequence), **data})

    response_id = _id("resp_")
    events = [event("response.created", response=_response_object(response_id, model, "in_progress"))]
    if reply.fail == "hang":
        return events, "hang"
    item = _responses_item(reply)
    if item["type"] == "function_call":
        events += [
            event(
                "response.output_item.added", output_index=0, item={**item, "arguments": "", "status": "in_progress"}
            ),
            event(
                "response.function_call_arguments.delta", item_id=item["id"], output_index=0, delta=item["arguments"]
            ),
            event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=0,
                name=item["name"],
                arguments=item["arguments"],
            ),
        ]
    else:
        text = item["content"][0]["text"] if reply.fail is None else "partial answer"
        empty_part = {"type": "output_text", "text": "", "annotations": []}
        where = {"item_id": item["id"], "output_index": 0, "content_index": 0}
        events += [
            event("response.output_item.added", output_index=0, item={**item, "content": [], "status": "in_progress"}),
            event("response.content_part.added", **where, part=empty_part),
            event("response.output_text.delta", **where, delta=text, logprobs=[]),
        ]
        if reply.fail == "drop":
            return events, "drop"
        events += [
            event("response.output_text.done", **where, text=text, logprobs=[]),
            event("response.content_part.done", **where, part=item["content"][0]),
        ]
    events += [
        event("response.output_item.done", output_index=0, item=item),
        event("response.completed", response=responses_completed(reply, model, response_id, item)),
    ]
    return events, "end"


def _error_body(api: Api, status: int, message: str) -> dict[str, Any]:
    kinds = {
        400: "invalid_request_error",
        401: "authentication_error",
        404: "not_found_error",
        405: "invalid_request_error",
        429: "rate_limit_error",
        529: "overloaded_error",
    }
    kind = kinds.get(status, "api_error")
    if api == "anthropic":
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {
        "error": {"message": message, "type": kind if status < 500 else "server_error", "param": None, "code": None}
    }


# --- the server -------------------------------------------------------------------------------


class ScriptedModelServer:
    """The scripted model API on 127.0.0.1 (an ephemeral port unless ``port`` is given).

    ``api_key``: the key to expect; requests without it, or with another, get 401 (recorded as
    ``auth: wrong``/``absent``); without one any credential, or none, is accepted. ``on_request`` is
    called (on the server's thread) with each request's record."""

    def __init__(
        self,
        plan: Plan,
        *,
        port: int = 0,
        api_key: str | None = None,
        on_request: Callable[[ServedRequest], None] | None = None,
    ) -> None:
        self.plan = plan
        self._port = port
        self._api_key = api_key
        self._on_request = on_request
        self._lock = threading.Lock()
        self._requests: list[ServedRequest] = []
        self._failed: dict[tuple[int, int], int] = {}
        self._loop: serving.LoopThread | None = None
        self._listener: serving.Listener | None = None
        self._stopping: asyncio.Event | None = None

    # lifecycle

    def start(self) -> None:
        """Listen on 127.0.0.1; returns once connections are accepted."""
        if self._loop is not None:
            raise RuntimeError("the scripted model server is already started")
        sock = serving.bind_tcp(self._port)
        self._port = sock.getsockname()[1]
        self._loop = serving.LoopThread(f"scripted-model-server:{self._port}")
        try:
            self._loop.call(self._start(sock))
        except BaseException:
            sock.close()
            self._loop.stop()
            self._loop = None
            raise

    async def _start(self, sock: Any) -> None:
        self._stopping = asyncio.Event()
        self._listener = serving.Listener(self._app, sock)

    def stop(self) -> None:
        """Stop listening, cut hanging streams, and join the server's thread. Idempotent."""
        loop, self._loop = self._loop, None
        if loop is None:
            return
        try:
            loop.call(self._stop())
        finally:
            loop.stop()

    async def _stop(self) -> None:
        if self._stopping is not None:
            self._stopping.set()
        if self._listener is not None:
            await self._listener.stopped()

    def __enter__(self) -> ScriptedModelServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``: Anthropic's base URL; OpenAI's is this plus ``/v1``."""
        if self._loop is None:
            raise RuntimeError("the scripted model server is not started")
        return f"http://{serving.HOST}:{self._port}"

    # what it served

    @property
    def requests(self) -> list[ServedRequest]:
        """Every request so far, in arrival order (a copy)."""
        with self._lock:
            return list(self._requests)

    @property
    def plan_errors(self) -> list[str]:
        """Each time the plan could not be followed (no script matched, a tool not offered, no turn left)."""
        with self._lock:
            return [r.error for r in self._requests if r.served == "plan_error" and r.error]

    def usage_served(self) -> dict[str, int]:
        """Totals over every model request answered: ``requests``, ``input_tokens``, ``output_tokens``."""
        with self._lock:
            answered = [r for r in self._requests if r.api is not None and r.served not in _NOT_ANSWERED]
            return {
                "requests": len(answered),
                "input_tokens": sum(r.input_tokens for r in answered),
                "output_tokens": sum(r.output_tokens for r in answered),
            }

    def _record(self, record: ServedRequest) -> None:
        with self._lock:
            self._requests.append(record)
        if self._on_request is not None:
            self._on_request(record)

    # the ASGI app

    async def _app(self, scope: serving.Scope, receive: serving.Receive, send: serving.Send) -> None:
        if scope["type"] != "http":
            return
        method: str = scope["method"]
        path: str = scope["path"]
        api = _api_of(path)
        headers = serving.header_map(scope)
        seen = ServedRequest(
            t=utc_now(),
            api=api,
            method=method,
            path=path,
            status=0,
            served="",
            headers=tuple(sorted(headers)),
            query=scope.get("query_string", b"").decode("latin-1"),
        )
        if method == "HEAD":
            self._record(replace(seen, api=None, status=200, served="head"))
            await serving.send_bytes(send, 200, b"", "text/plain")
            return
        if api is None:
            self._record(replace(seen, status=404, served="not_found"))
            await serving.send_json(send, 404, _error_body("anthropic", 404, f"no such endpoint: {method} {path}"))
            return
        if method != "POST":
            self._record(replace(seen, status=405, served="method_not_allowed"))
            await serving.send_json(send, 405, _error_body(api, 405, f"{path} takes POST"), [("allow", "POST")])
            return
        auth, present = self._auth(headers)
        seen = replace(seen, auth=auth, auth_headers=present)
        if auth in {"absent", "wrong"} and self._api_key is not None:
            self._record(replace(seen, status=401, served="refused", error=f"credentials {auth}"))
            await serving.send_json(send, 401, _error_body(api, 401, "invalid API key"))
            return
        raw = await serving.read_body(receive)
        body = _json_object(raw)
        if body is None or (path == MESSAGES and not isinstance(body.get("messages"), list)):
            self._record(replace(seen, status=400, served="bad_request", error="body is not a valid request"))
            await serving.send_json(send, 400, _error_body(api, 400, "the body is not a valid JSON request"))
            return
        model = str(body.get("model") or "scripted-model")
        stream = bool(body.get("stream", False))
        seen = replace(seen, model=model, stream=stream)
        if path == COUNT_TOKENS:
            self._record(replace(seen, status=200, served="count_tokens"))
            await serving.send_json(send, 200, {"input_tokens": max(1, len(raw or b"") // 4)})
            return
        with self._lock:
            reply = choose_reply(self.plan, api, body, self._failed)
        self._record(
            replace(
                seen,
                status=reply.status,
                served=reply.served,
                offered=offered_tools(api, body).display,
                script=reply.script,
                turn=reply.turn,
                tool=reply.wire_tool,
                arguments=reply.arguments if reply.kind == "tool" else None,
                input_tokens=reply.usage.input_tokens,
                output_tokens=reply.usage.output_tokens,
                error=reply.plan_error,
            )
        )
        await self._answer(api, model, stream, reply, receive, send)

    async def _answer(
        self, api: Api, model: str, stream: bool, reply: _Reply, receive: serving.Receive, send: serving.Send
    ) -> None:
        if reply.status != 200:
            message = PLAN_ERROR + reply.plan_error if reply.plan_error else f"scripted failure ({reply.fail})"
            await serving.send_json(send, reply.status, _error_body(api, reply.status, message))
            return
        then: Then
        if stream:
            events, then = anthropic_events(reply, model) if api == "anthropic" else responses_events(reply, model)
            await serving.start_response(
                send, 200, [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
            )
            for chunk in events:
                await serving.send_chunk(send, chunk)
        else:
            payload = anthropic_message(reply, model) if api == "anthropic" else responses_completed(reply, model)
            if reply.fail is None:
                await serving.send_json(send, 200, payload)
                return
            then = "drop" if reply.fail == "drop" else "hang"
            await serving.start_response(send, 200, [("content-type", "application/json")])
            if then == "drop":
                await serving.send_chunk(send, json.dumps(payload).encode()[:16])
        if then == "end":
            await serving.end_response(send)
            return
        if then == "hang":
            assert self._stopping is not None
            await serving.first_of(self._stopping.wait(), serving.disconnected(receive))
        raise serving.AbortConnection(then)

    def _auth(self, headers: dict[str, str]) -> tuple[AuthSeen, tuple[str, ...]]:
        present = tuple(name for name in AUTH_HEADERS if name in headers)
        if not present:
            return "absent", present
        if self._api_key is None:
            return "present", present
        expected = self._api_key.encode()
        given = [headers["x-api-key"]] if "x-api-key" in headers else []
        if "authorization" in headers:
            scheme, _, token = headers["authorization"].partition(" ")
            given.append(token.strip() if scheme.lower() == "bearer" else headers["authorization"])
        ok = all(hmac.compare_digest(value.encode(), expected) for value in given)
        return ("ok" if ok else "wrong"), present


def _api_of(path: str) -> Api | None:
    if path in (MESSAGES, COUNT_TOKENS):
        return "anthropic"
    return "openai" if path == RESPONSES else None


_NOT_ANSWERED: Final = frozenset({"head", "refused", "not_found", "bad_request", "method_not_allowed"})


def _json_object(raw: bytes | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
