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
import threading
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from types import TracebackType
from typing import Any, Final, Literal

from ale_iac.clock import utc_now
from ale_iac.llm import _serving as serving
from ale_iac.llm.plan import (
    Plan,
)
from ale_iac.llm.scripted_replies import (
    PLAN_ERROR,
    Reply,
    Then,
    anthropic_events,
    anthropic_message,
    choose_reply,
    error_body,
    responses_completed,
    responses_events,
)
from ale_iac.llm.scripted_requests import Api, offered_tools

AuthSeen = Literal["absent", "present", "ok", "wrong"]
"""What the server saw of credentials: none; some (no key expected); all equal to the expected key; not."""

MESSAGES: Final = "/v1/messages"
COUNT_TOKENS: Final = "/v1/messages/count_tokens"
RESPONSES: Final = "/v1/responses"
AUTH_HEADERS: Final = ("x-api-key", "authorization")


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
        seen = _seen_of(scope)
        method, path, api = seen.method, seen.path, seen.api
        if method == "HEAD":
            self._record(replace(seen, api=None, status=200, served="head"))
            await serving.send_bytes(send, 200, b"", "text/plain")
            return
        if api is None:
            await self._refuse(send, seen, "anthropic", 404, "not_found", f"no such endpoint: {method} {path}")
            return
        if method != "POST":
            await self._refuse(send, seen, api, 405, "method_not_allowed", f"{path} takes POST", [("allow", "POST")])
            return
        auth, present = self._auth(serving.header_map(scope))
        seen = replace(seen, auth=auth, auth_headers=present)
        if auth in {"absent", "wrong"} and self._api_key is not None:
            await self._refuse(send, replace(seen, error=f"credentials {auth}"), api, 401, "refused", "invalid API key")
            return
        raw = await serving.read_body(receive)
        body = _json_object(raw)
        if body is None or (path == MESSAGES and not isinstance(body.get("messages"), list)):
            seen = replace(seen, error="body is not a valid request")
            await self._refuse(send, seen, api, 400, "bad_request", "the body is not a valid JSON request")
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
        self._record(_answered(seen, api, body, reply))
        await self._answer(api, model, stream, reply, receive, send)

    async def _refuse(
        self,
        send: serving.Send,
        seen: ServedRequest,
        api: Api,
        status: int,
        served: str,
        message: str,
        headers: Iterable[tuple[str, str]] = (),
    ) -> None:
        """Record a request refused before the plan is asked, and answer it with the API's error body."""
        self._record(replace(seen, status=status, served=served))
        await serving.send_json(send, status, error_body(api, status, message), headers)

    async def _answer(
        self, api: Api, model: str, stream: bool, reply: Reply, receive: serving.Receive, send: serving.Send
    ) -> None:
        if reply.status != 200:
            message = PLAN_ERROR + reply.plan_error if reply.plan_error else f"scripted failure ({reply.fail})"
            await serving.send_json(send, reply.status, error_body(api, reply.status, message))
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


def _seen_of(scope: serving.Scope) -> ServedRequest:
    """What the server records of a request before it reads the body: the method, path, API, header names."""
    path: str = scope["path"]
    return ServedRequest(
        t=utc_now(),
        api=_api_of(path),
        method=scope["method"],
        path=path,
        status=0,
        served="",
        headers=tuple(sorted(serving.header_map(scope))),
        query=scope.get("query_string", b"").decode("latin-1"),
    )


def _answered(seen: ServedRequest, api: Api, body: dict[str, Any], reply: Reply) -> ServedRequest:
    """The record of a request the plan answered."""
    return replace(
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
