"""What the scripted model server answers: the plan's turn chosen for a request (or a plan error), written as the
vendor's wire format (one JSON body, or the server-sent events a streaming client expects)."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from ale_iac.llm import _serving as serving
from ale_iac.llm.plan import NO_USAGE, SHELL, FailMode, FailTurn, Plan, Script, TextTurn, ToolTurn, Usage
from ale_iac.llm.scripted_requests import Api, Offered, offered_tools, prompt_of, task_text_of, tool_results_in

Then = Literal["end", "hang", "drop"]
PLAN_ERROR: Final = "plan error: "
"""How the message of a plan error's HTTP 400 answer starts (the run reads it back from its gateway's record)."""
PLAN_ERROR_STATUS: Final = 400
"""A client error: no CLI or SDK retries it, so a plan error ends the agent's run at once."""
CLAUDE_SHELL: Final = "Bash"
CODEX_SHELLS: Final = ("exec_command", "shell_command", "shell")
"""Codex's native shell tool, newest first: ``exec_command {cmd}`` (0.171: unified exec, the default),
``shell_command {command: str}``, ``shell {command: [argv]}`` (older releases)."""


@dataclass(frozen=True)
class Reply:
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


def _only_known(arguments: dict[str, Any], known: frozenset[str] | None) -> dict[str, Any]:
    return dict(arguments) if known is None else {k: v for k, v in arguments.items() if k in known}


def _resolve_tool(api: Api, turn: ToolTurn, offered: Offered) -> tuple[str | None, str, dict[str, Any]] | None:
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


def _not_offered(turn: ToolTurn, offered: Offered) -> str:
    listed = ", ".join(offered.display) or "none"
    message = f"the plan calls {turn.tool}, which this request does not offer (tools offered: {listed})"
    if any(name in {"ToolSearch", "tool_search", "<tool_search>"} for name in offered.display):
        message += (
            "; the CLI defers MCP tools behind tool search (Claude Code: set ENABLE_TOOL_SEARCH=false; "
            "Codex: use a model name it does not know)"
        )
    return message


def choose_reply(plan: Plan, api: Api, body: dict[str, Any], failed: dict[tuple[int, int], int] | None = None) -> Reply:
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
        return Reply("text", last.usage, text=last.text, script=index, turn=script.turns.index(last))
    number, turn = live[number]
    if isinstance(turn, TextTurn):
        return Reply("text", turn.usage, text=turn.text, script=index, turn=number)
    if isinstance(turn, FailTurn):
        if turn.times is not None:
            failed[(index, number)] = failed.get((index, number), 0) + 1
        status = turn.http_status or 200
        return Reply("fail", NO_USAGE, fail=turn.fail, status=status, script=index, turn=number)
    offered = offered_tools(api, body)
    resolved = _resolve_tool(api, turn, offered)
    if resolved is None:
        return _error_reply(f"script {index} turn {number}: " + _not_offered(turn, offered), index, number)
    namespace, name, arguments = resolved
    return Reply("tool", turn.usage, name=name, namespace=namespace, arguments=arguments, script=index, turn=number)


def _error_reply(message: str, script: int | None = None, turn: int | None = None) -> Reply:
    return Reply("text", NO_USAGE, status=PLAN_ERROR_STATUS, script=script, turn=turn, plan_error=message)


# --- writing answers --------------------------------------------------------------------------


def _id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def _anthropic_block(reply: Reply) -> dict[str, Any]:
    if reply.kind == "tool":
        return {"type": "tool_use", "id": _id("toolu_"), "name": reply.name, "input": reply.arguments}
    return {"type": "text", "text": reply.text}


def anthropic_events(reply: Reply, model: str) -> tuple[list[bytes], Then]:
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


def anthropic_message(reply: Reply, model: str) -> dict[str, Any]:
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


def _responses_item(reply: Reply) -> dict[str, Any]:
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
    reply: Reply, model: str, response_id: str | None = None, item: dict[str, Any] | None = None
) -> dict[str, Any]:
    response = _response_object(response_id or _id("resp_"), model, "completed")
    response["output"] = [item or _responses_item(reply)]
    response["usage"] = _responses_usage(reply.usage)
    return response


def responses_events(reply: Reply, model: str) -> tuple[list[bytes], Then]:
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


def error_body(api: Api, status: int, message: str) -> dict[str, Any]:
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
