"""The scripted model server's turns for agent harnesses: ``fn:<name>`` tools (a harness's own function
tools), the HTTP failures an SDK sorts into retryable and not (429, 529, 400, 401), and ``times`` (a
failure served only to the first N requests that reach it)."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

from ale_iac.errors import ConfigError
from ale_iac.llm.plan import plan_from
from tests.llm.conftest import MakeServer
from tests.llm.helpers import anthropic_client, claude_messages, codex_input, openai_client, plan

EXEC_SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
CLAUDE_EXEC = [{"name": "exec", "description": "Run a command.", "input_schema": EXEC_SCHEMA}]
OPENAI_EXEC = [{"type": "function", "name": "exec", "parameters": EXEC_SCHEMA, "strict": False}]


def claude(url: str, prompt: str, results: int = 0, tools: Any = CLAUDE_EXEC) -> Any:
    client = anthropic_client(url, "sk-test")
    messages = claude_messages(prompt, results)
    return client.messages.create(model="m", max_tokens=100, messages=messages, tools=tools)  # type: ignore[arg-type]


def codex(url: str, prompt: str, results: int = 0, tools: Any = OPENAI_EXEC) -> Any:
    client = openai_client(url + "/v1", "sk-test")
    return client.responses.create(model="m", input=codex_input(prompt, results), tools=tools)  # type: ignore[arg-type]


def test_a_function_tool_is_called_by_its_own_name_on_both_apis(make_server: MakeServer) -> None:
    server = make_server(plan(("list", [{"tool": "fn:exec", "arguments": {"command": "ls"}}, {"text": "ok"}])))
    first = claude(server.base_url, "list")
    (call,) = first.content
    assert (call.type, call.name, call.input) == ("tool_use", "exec", {"command": "ls"})
    reply = codex(server.base_url, "list")
    (item,) = reply.output
    assert (item.type, item.name, item.arguments) == ("function_call", "exec", '{"command": "ls"}')
    assert [r.tool for r in server.requests] == ["exec", "exec"]
    # not offered: a plan error, never a call of something else
    with pytest.raises(anthropic.BadRequestError):
        claude(server.base_url, "list", tools=[{**CLAUDE_EXEC[0], "name": "run"}])
    assert server.plan_errors and "fn:exec" in server.plan_errors[0] and "run" in server.plan_errors[0]


def test_fn_names_are_checked() -> None:
    with pytest.raises(ConfigError, match="is not a tool"):
        plan_from({"scripts": [{"match": "a", "turns": [{"tool": "fn:bad name"}]}]})
    with pytest.raises(ConfigError, match="times"):
        plan_from({"scripts": [{"match": "a", "turns": [{"fail": "http_429", "times": 0}]}]})


@pytest.mark.parametrize(
    ("mode", "status", "anthropic_error", "openai_error"),
    [
        ("http_429", 429, anthropic.RateLimitError, openai.RateLimitError),
        ("http_529", 529, anthropic.InternalServerError, openai.InternalServerError),
        ("http_400", 400, anthropic.BadRequestError, openai.BadRequestError),
        ("http_401", 401, anthropic.AuthenticationError, openai.AuthenticationError),
    ],
)
def test_http_failures_have_their_status_on_both_apis(
    make_server: MakeServer, mode: str, status: int, anthropic_error: type, openai_error: type
) -> None:
    server = make_server(plan(("fail", [{"fail": mode}])))
    with pytest.raises(anthropic_error) as a_info:
        claude(server.base_url, "fail")
    assert a_info.value.status_code == status
    with pytest.raises(openai_error) as o_info:
        codex(server.base_url, "fail")
    assert o_info.value.status_code == status
    assert [(r.status, r.served) for r in server.requests] == [(status, f"fail:{mode}")] * 2
    if status == 529:
        assert a_info.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]


def test_times_fails_the_first_requests_then_skips_the_turn(make_server: MakeServer) -> None:
    turns = [{"fail": "http_429", "times": 2}, {"tool": "fn:exec", "arguments": {"command": "ls"}}, {"text": "done"}]
    server = make_server(plan(("flaky", turns)))
    for _ in range(2):
        with pytest.raises(anthropic.RateLimitError):
            claude(server.base_url, "flaky")
    (call,) = claude(server.base_url, "flaky").content
    assert call.name == "exec"
    assert claude(server.base_url, "flaky", results=1).content[0].text == "done"
    # still spent for a new conversation on the other API
    assert codex(server.base_url, "flaky").output[0].name == "exec"
    served = [(r.served, r.turn) for r in server.requests]
    assert served == [("fail:http_429", 0), ("fail:http_429", 0), ("tool", 1), ("text", 2), ("tool", 1)]


def test_a_failure_without_times_is_served_on_every_retry(make_server: MakeServer) -> None:
    server = make_server(plan(("flaky", [{"fail": "http_529"}, {"text": "never"}])))
    for _ in range(3):
        with pytest.raises(anthropic.InternalServerError):
            claude(server.base_url, "flaky")
    assert [r.served for r in server.requests] == ["fail:http_529"] * 3
