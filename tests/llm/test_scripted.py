"""The scripted model server, driven by the vendors' official SDKs (and plain httpx where an SDK hides
what is checked): tool calls, answers, failures, usage, and what it records."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anthropic
import httpx
import openai
import pytest

from ale_iac.llm.scripted import ScriptedModelServer, ServedRequest
from ale_iac.llm.scripted_replies import PLAN_ERROR
from ale_iac.llm.scripted_requests import prompt_of, task_text_of
from tests.llm.conftest import MakeServer
from tests.llm.helpers import (
    CLAUDE_TOOLS,
    CODEX_TOOLS,
    RUN_COMMAND_SCHEMA,
    anthropic_client,
    claude_messages,
    codex_input,
    openai_client,
    plan,
)

STREAMING = pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])


def ask_claude(server_url: str, messages: list[dict[str, Any]], *, stream: bool, tools: Any = CLAUDE_TOOLS) -> Any:
    client = anthropic_client(server_url, "sk-test")
    if not stream:
        return client.messages.create(model="scripted", max_tokens=100, messages=messages, tools=tools)  # type: ignore[arg-type]
    with client.messages.stream(model="scripted", max_tokens=100, messages=messages, tools=tools) as events:  # type: ignore[arg-type]
        return events.get_final_message()


def ask_codex(server_url: str, items: list[dict[str, Any]], *, stream: bool, tools: Any = CODEX_TOOLS) -> Any:
    client = openai_client(server_url + "/v1", "sk-test")
    if not stream:
        return client.responses.create(model="scripted", input=items, tools=tools)  # type: ignore[arg-type]
    events = list(client.responses.create(model="scripted", input=items, tools=tools, stream=True))  # type: ignore[arg-type]
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert done == events[-1].response.output
    return events[-1].response


def error_message(exc: anthropic.APIStatusError | openai.APIStatusError) -> str:
    """The ``error.message`` of an error answer, as either SDK parsed it."""
    body: Any = exc.body
    body = body.get("error", body) if isinstance(body, dict) else {}
    return str(body.get("message"))


@STREAMING
def test_claude_code_gets_the_mcp_tool_then_bash_then_the_answer(server: ScriptedModelServer, stream: bool) -> None:
    first = ask_claude(server.base_url, claude_messages("please list the files"), stream=stream)
    assert first.stop_reason == "tool_use"
    (call,) = first.content
    assert (call.type, call.name, call.input) == ("tool_use", "mcp__vm__run_command", {"command": "ls"})
    assert (first.usage.input_tokens, first.usage.output_tokens) == (11, 3)

    second = ask_claude(server.base_url, claude_messages("please list the files", results=1), stream=stream)
    (shell,) = second.content
    assert (shell.name, shell.input) == ("Bash", {"command": "pwd", "timeout": 5})  # timeout: Bash takes it

    third = ask_claude(server.base_url, claude_messages("please list the files", results=2), stream=stream)
    assert third.stop_reason == "end_turn"
    assert [(b.type, b.text) for b in third.content] == [("text", "Two files.")]
    assert (third.usage.input_tokens, third.usage.output_tokens) == (17, 5)

    records = server.requests
    assert [(r.api, r.served, r.turn, r.tool, r.stream) for r in records] == [
        ("anthropic", "tool", 0, "mcp__vm__run_command", stream),
        ("anthropic", "tool", 1, "Bash", stream),
        ("anthropic", "text", 2, None, stream),
    ]
    assert records[0].offered == ("Bash", "mcp__vm__run_command")
    assert server.usage_served() == {"requests": 3, "input_tokens": 11 + 13 + 17, "output_tokens": 3 + 4 + 5}
    assert server.plan_errors == []


@STREAMING
def test_codex_gets_the_namespaced_mcp_tool_then_exec_command_then_the_answer(
    server: ScriptedModelServer, stream: bool
) -> None:
    first = ask_codex(server.base_url, codex_input("please list the files"), stream=stream)
    (call,) = first.output
    assert (call.type, call.namespace, call.name) == ("function_call", "mcp__vm", "run_command")
    assert json.loads(call.arguments) == {"command": "ls"}
    assert (first.usage.input_tokens, first.usage.output_tokens, first.usage.total_tokens) == (11, 3, 14)

    second = ask_codex(server.base_url, codex_input("please list the files", results=1), stream=stream)
    (shell,) = second.output
    assert (shell.name, getattr(shell, "namespace", None)) == ("exec_command", None)
    assert json.loads(shell.arguments) == {"cmd": "pwd"}  # exec_command has no timeout: left out

    third = ask_codex(server.base_url, codex_input("please list the files", results=2), stream=stream)
    assert third.output_text == "Two files."
    assert third.usage.output_tokens == 5

    assert [(r.api, r.served, r.turn, r.tool) for r in server.requests] == [
        ("openai", "tool", 0, "mcp__vm/run_command"),
        ("openai", "tool", 1, "exec_command"),
        ("openai", "text", 2, None),
    ]
    assert "mcp__vm/run_command" in server.requests[0].offered
    assert server.usage_served() == {"requests": 3, "input_tokens": 41, "output_tokens": 12}
    assert server.plan_errors == []


def test_the_turn_comes_from_the_request_so_conversations_can_interleave(server: ScriptedModelServer) -> None:
    # Nine requests at once, at every turn, in no particular order: each gets its own turn.
    wanted = [2, 0, 1, 1, 2, 0, 0, 2, 1]

    def one(results: int) -> str:
        reply = ask_claude(server.base_url, claude_messages("list the files", results=results), stream=True)
        block = reply.content[0]
        return str(block.name if block.type == "tool_use" else block.text)

    with ThreadPoolExecutor(max_workers=len(wanted)) as pool:
        got = list(pool.map(one, wanted))
    expected = {0: "mcp__vm__run_command", 1: "Bash", 2: "Two files."}
    assert got == [expected[n] for n in wanted]
    assert sorted(r.turn or 0 for r in server.requests) == sorted(wanted)


def test_a_tool_the_request_does_not_offer_is_a_plan_error(server: ScriptedModelServer) -> None:
    with pytest.raises(anthropic.BadRequestError) as refused:
        ask_claude(server.base_url, claude_messages("list the files"), stream=True, tools=CLAUDE_TOOLS[:1])
    assert error_message(refused.value).startswith(PLAN_ERROR)
    (error,) = server.plan_errors
    assert "mcp:vm.run_command" in error and "tools offered: Bash" in error
    assert error in error_message(refused.value)
    assert (server.requests[0].served, server.requests[0].status) == ("plan_error", 400)


def test_deferred_tools_get_a_hint(server: ScriptedModelServer) -> None:
    deferred = [{"name": "ToolSearch", "description": "x", "input_schema": {"type": "object", "properties": {}}}]
    with pytest.raises(anthropic.BadRequestError):
        ask_claude(server.base_url, claude_messages("list the files"), stream=False, tools=deferred)
    (error,) = server.plan_errors
    assert "ENABLE_TOOL_SEARCH=false" in error


def test_older_codex_tool_shapes_are_mapped(make_server: MakeServer) -> None:
    shell_then_mcp = plan(
        (
            "go",
            [{"tool": "shell", "arguments": {"command": "echo hi"}}, {"tool": "mcp:vm.run_command", "arguments": {}}],
        )
    )
    server = make_server(shell_then_mcp)
    older = [
        {"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {"command": {}}}},
        {"type": "function", "name": "mcp__vm__run_command", "parameters": RUN_COMMAND_SCHEMA},
    ]
    shell = ask_codex(server.base_url, codex_input("go"), stream=True, tools=older).output[0]
    assert (shell.name, json.loads(shell.arguments)) == ("shell", {"command": ["bash", "-lc", "echo hi"]})
    flat = ask_codex(server.base_url, codex_input("go", results=1), stream=True, tools=older).output[0]
    assert (flat.name, getattr(flat, "namespace", None)) == ("mcp__vm__run_command", None)
    assert server.plan_errors == []


def test_no_matching_script_and_no_turn_left_are_plan_errors_both_apis_refuse(make_server: MakeServer) -> None:
    """A plan error is an HTTP 400 (no SDK retries it) saying why; the prompt it quotes is the task's own
    text, not the blocks the CLI wraps its context in."""
    server = make_server(plan(("only tools", [{"tool": "shell", "arguments": {"command": "ls"}}])))
    with pytest.raises(anthropic.BadRequestError) as claude_refused:
        ask_claude(server.base_url, claude_messages("something else"), stream=True)
    assert error_message(claude_refused.value) == f"{PLAN_ERROR}no script matches the prompt 'something else'"
    with pytest.raises(openai.BadRequestError) as codex_refused:
        ask_codex(server.base_url, codex_input("another thing"), stream=True)
    assert error_message(codex_refused.value) == f"{PLAN_ERROR}no script matches the prompt 'another thing'"
    with pytest.raises(anthropic.BadRequestError) as past:
        ask_claude(server.base_url, claude_messages("only tools", results=1), stream=True)
    assert "no text turn" in error_message(past.value)
    assert len(server.plan_errors) == 3
    assert server.usage_served()["input_tokens"] == 0


def test_the_task_text_leaves_out_the_clis_own_blocks() -> None:
    reminder = "<system-reminder>\nAs you answer, use this context: today is Monday.\n</system-reminder>\n"
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": reminder + "Count the errors."}]}]}
    assert task_text_of("anthropic", body) == "Count the errors."
    assert task_text_of("openai", {"input": codex_input("Count the <b>warnings</b>.")}) == "Count the <b>warnings</b>."
    only_blocks = {"messages": [{"role": "user", "content": reminder}]}
    assert task_text_of("anthropic", only_blocks) == prompt_of("anthropic", only_blocks)


def test_past_the_end_the_last_answer_is_served_again(server: ScriptedModelServer) -> None:
    reply = ask_codex(server.base_url, codex_input("list the files", results=5), stream=True)
    assert reply.output_text == "Two files."
    assert server.requests[0].turn == 2 and server.plan_errors == []


def test_http_500_fails_both_apis(server: ScriptedModelServer) -> None:
    with pytest.raises(anthropic.InternalServerError):
        ask_claude(server.base_url, claude_messages("fail with 500"), stream=True)
    with pytest.raises(openai.InternalServerError):
        ask_codex(server.base_url, codex_input("fail with 500"), stream=False)
    assert [(r.status, r.served) for r in server.requests] == [(500, "fail:http_500")] * 2


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/responses"])
@STREAMING
def test_drop_cuts_the_connection_mid_answer(server: ScriptedModelServer, path: str, stream: bool) -> None:
    body = {"model": "m", "stream": stream, "messages": claude_messages("drop"), "input": codex_input("drop")}
    received = bytearray()
    with (
        pytest.raises(httpx.RemoteProtocolError),
        httpx.stream("POST", server.base_url + path, json=body) as response,
    ):
        assert response.status_code == 200
        for chunk in response.iter_raw():
            received += chunk
    if stream:
        assert received.startswith(b"event: ")
    assert server.requests[0].served == "fail:drop"


def test_hang_starts_a_stream_that_ends_only_when_the_server_stops(make_server: MakeServer) -> None:
    server = make_server()
    body = {"model": "m", "stream": True, "messages": claude_messages("hang")}
    with httpx.stream("POST", server.base_url + "/v1/messages", json=body) as response:
        lines = response.iter_lines()
        assert next(lines) == "event: message_start"
        assert json.loads(next(lines).removeprefix("data: "))["message"]["usage"]["input_tokens"] == 0
        server.stop()  # the hanging answer is cut, not completed
        with pytest.raises(httpx.RemoteProtocolError):
            list(lines)


def test_an_expected_key_is_checked_and_never_recorded(make_server: MakeServer) -> None:
    server = make_server(api_key="sk-expected-1234")
    with pytest.raises(anthropic.AuthenticationError):
        anthropic_client(server.base_url, "sk-wrong-99").messages.create(
            model="m", max_tokens=1, messages=claude_messages("list the files")
        )
    ok = anthropic_client(server.base_url, "sk-expected-1234").messages.create(
        model="m", max_tokens=1, messages=claude_messages("list the files"), tools=CLAUDE_TOOLS
    )
    assert ok.content[0].type == "tool_use"
    assert [(r.served, r.auth) for r in server.requests] == [("refused", "wrong"), ("tool", "ok")]
    assert server.usage_served()["requests"] == 1
    recorded = json.dumps([r.to_dict() for r in server.requests])
    assert "sk-expected" not in recorded and "sk-wrong" not in recorded
    assert server.requests[1].auth_headers == ("authorization",)


def test_other_paths_methods_and_bodies(server: ScriptedModelServer) -> None:
    with httpx.Client(base_url=server.base_url) as client:
        head = client.head("/api/hello")
        assert (head.status_code, head.content) == (200, b"")
        assert client.get("/v1/messages").status_code == 405
        assert client.post("/v1/chat/completions", json={}).status_code == 404
        assert client.post("/v1/responses", content=b"{not json").status_code == 400
        assert client.post("/v1/messages", json={"model": "m"}).status_code == 400
        counted = client.post("/v1/messages/count_tokens", json={"model": "m", "messages": claude_messages("x")})
        assert counted.status_code == 200 and counted.json()["input_tokens"] > 0
        query = client.post(
            "/v1/messages",
            params={"beta": "true"},
            headers={"anthropic-version": "2023-06-01"},
            json={"model": "m", "messages": claude_messages("list the files"), "tools": CLAUDE_TOOLS},
        )
        assert query.json()["content"][0]["name"] == "mcp__vm__run_command"
    served = [r.served for r in server.requests]
    assert served == ["head", "method_not_allowed", "not_found", "bad_request", "bad_request", "count_tokens", "tool"]
    last = server.requests[-1]
    assert last.query == "beta=true" and "anthropic-version" in last.headers and last.auth == "absent"
    assert server.usage_served() == {"requests": 2, "input_tokens": 11, "output_tokens": 3}


def test_each_request_is_reported_as_it_is_served(make_server: MakeServer) -> None:
    seen: list[ServedRequest] = []
    server = make_server(on_request=seen.append)
    ask_codex(server.base_url, codex_input("list the files"), stream=True)
    assert seen == server.requests and seen[0].served == "tool"
