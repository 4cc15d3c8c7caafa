"""The model gateway between the vendors' SDKs and a scripted upstream that checks the real key: what
is forwarded, what is refused, usage and latency per grant, streaming, revoking and closing."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import signal
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from ale_iac.errors import AleIacError
from ale_iac.llm.gateway import ModelGateway
from ale_iac.llm.scripted import ScriptedModelServer
from tests.llm.conftest import MakeServer
from tests.llm.helpers import (
    CLAUDE_TOOLS,
    CODEX_TOOLS,
    anthropic_client,
    claude_messages,
    codex_input,
    openai_client,
    plan,
    unix_client,
)

REAL_KEY = "sk-real-key-of-the-run-0123456789"
STREAMING = pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])


@pytest.fixture
def upstream(make_server: MakeServer) -> ScriptedModelServer:
    """The vendor stand-in: it refuses any key but the real one."""
    return make_server(api_key=REAL_KEY)


def claude(url: str, token: str, results: int = 0, *, stream: bool = True, prompt: str = "list the files") -> Any:
    client = anthropic_client(url, token)
    messages: Any = claude_messages(prompt, results)
    if not stream:
        return client.messages.create(model="m", max_tokens=100, messages=messages, tools=CLAUDE_TOOLS)  # type: ignore[arg-type]
    with client.messages.stream(model="m", max_tokens=100, messages=messages, tools=CLAUDE_TOOLS) as events:  # type: ignore[arg-type]
        return events.get_final_message()


def codex(url: str, token: str, results: int = 0, *, stream: bool = True, prompt: str = "list the files") -> Any:
    client = openai_client(url, token)
    items: Any = codex_input(prompt, results)
    if not stream:
        return client.responses.create(model="m", input=items, tools=CODEX_TOOLS)  # type: ignore[arg-type]
    events = list(client.responses.create(model="m", input=items, tools=CODEX_TOOLS, stream=True))  # type: ignore[arg-type]
    return events[-1].response


def totals(usage: dict[str, Any]) -> dict[str, int]:
    return {key: usage[key] for key in ("requests", "input_tokens", "output_tokens")}


@STREAMING
def test_claude_code_through_the_gateway(upstream: ScriptedModelServer, gateway: ModelGateway, stream: bool) -> None:
    grant = gateway.grant("unit-1", api="anthropic", upstream_base_url=upstream.base_url, api_key=REAL_KEY)
    url = grant.base_url(gateway.tcp_root)
    assert url == gateway.tcp_root
    first = claude(url, grant.token, stream=stream)
    assert (first.content[0].name, first.content[0].input) == ("mcp__vm__run_command", {"command": "ls"})
    assert claude(url, grant.token, 1, stream=stream).content[0].name == "Bash"
    last = claude(url, grant.token, 2, stream=stream)
    assert last.content[0].text == "Two files." and last.usage.output_tokens == 5

    # Upstream saw the real key, in Anthropic's header, and nothing else: the agent's token never left the gateway.
    assert [(r.auth, r.auth_headers) for r in upstream.requests] == [("ok", ("x-api-key",))] * 3
    usage = gateway.usage("unit-1")
    assert totals(usage) == upstream.usage_served() == {"requests": 3, "input_tokens": 41, "output_tokens": 12}
    assert (usage["api"], usage["upstream"], usage["errors"], usage["refused"]) == (
        "anthropic",
        upstream.base_url,
        0,
        0,
    )
    assert [(c["path"], c["status"], c["input_tokens"], c["output_tokens"]) for c in usage["calls"]] == [
        ("/v1/messages", 200, 11, 3),
        ("/v1/messages", 200, 13, 4),
        ("/v1/messages", 200, 17, 5),
    ]
    assert all(c["ttfb_ms"] is not None and c["total_ms"] >= c["ttfb_ms"] for c in usage["calls"])
    assert usage["latency"]["ttfb"]["count"] == usage["latency"]["total"]["count"] == 3
    recorded = json.dumps(usage)
    assert REAL_KEY not in recorded and grant.token not in recorded
    assert grant.token not in repr(grant)


@STREAMING
def test_codex_through_the_gateway(upstream: ScriptedModelServer, gateway: ModelGateway, stream: bool) -> None:
    grant = gateway.grant("unit-1", api="openai", upstream_base_url=upstream.base_url + "/v1", api_key=REAL_KEY)
    url = grant.base_url(gateway.tcp_root)
    assert url == gateway.tcp_root + "/v1"
    first = codex(url, grant.token, stream=stream)
    assert (first.output[0].namespace, first.output[0].name) == ("mcp__vm", "run_command")
    assert codex(url, grant.token, 1, stream=stream).output[0].name == "exec_command"
    assert codex(url, grant.token, 2, stream=stream).output_text == "Two files."
    assert [(r.path, r.auth, r.auth_headers) for r in upstream.requests] == [
        ("/v1/responses", "ok", ("authorization",))
    ] * 3
    usage = gateway.usage("unit-1")
    assert totals(usage) == upstream.usage_served() == {"requests": 3, "input_tokens": 41, "output_tokens": 12}
    assert usage["api"] == "openai" and usage["errors"] == 0


def test_a_wrong_or_missing_token_is_refused(upstream: ScriptedModelServer, gateway: ModelGateway) -> None:
    grant = gateway.grant("unit-1", api="anthropic", upstream_base_url=upstream.base_url, api_key=REAL_KEY)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        claude(gateway.tcp_root, grant.token + "x")
    assert "invalid gateway token" in str(caught.value)
    with pytest.raises(anthropic.AuthenticationError):
        claude(gateway.tcp_root, REAL_KEY)  # the real key is no token either
    missing = httpx.post(gateway.tcp_root + "/v1/messages", json={"model": "m", "messages": []})
    assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"
    assert gateway.refused == 3
    assert upstream.requests == []
    assert gateway.usage("unit-1")["requests"] == 0


def test_a_unix_socket_serves_its_own_grant_only(
    upstream: ScriptedModelServer, gateway: ModelGateway, tmp_path: Path
) -> None:
    mine = gateway.grant("unit-1", api="anthropic", upstream_base_url=upstream.base_url, api_key=REAL_KEY)
    other = gateway.grant("unit-2", api="anthropic", upstream_base_url=upstream.base_url, api_key=REAL_KEY)
    path = tmp_path / "gw.sock"
    mine.attach_unix(path)
    assert stat.S_ISSOCK(os.lstat(path).st_mode) and stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    body = {"model": "m", "max_tokens": 5, "messages": claude_messages("list the files"), "tools": CLAUDE_TOOLS}
    with unix_client(str(path)) as client:
        ok = client.post("/v1/messages", headers={"x-api-key": mine.token}, json=body)
        assert ok.status_code == 200 and ok.json()["content"][0]["name"] == "mcp__vm__run_command"
        refused = client.post("/v1/messages", headers={"authorization": f"Bearer {other.token}"}, json=body)
        assert refused.status_code == 401
    assert gateway.usage("unit-1")["refused"] == 1
    assert gateway.usage("unit-1")["requests"] == 1
    assert gateway.usage("unit-2")["refused"] == 0 and gateway.refused == 0
    assert len(upstream.requests) == 1


def test_a_stale_socket_is_replaced_and_anything_else_kept(gateway: ModelGateway, tmp_path: Path) -> None:
    grant = gateway.grant("unit-1", api="openai", upstream_base_url=None, api_key=None)
    stale = tmp_path / "stale.sock"
    leftover = socket.socket(socket.AF_UNIX)
    leftover.bind(str(stale))
    leftover.close()
    grant.attach_unix(stale)
    with unix_client(str(stale)) as client:
        assert client.head("/").status_code == 200
    regular = tmp_path / "file"
    regular.write_text("mine")
    with pytest.raises(AleIacError, match="not a socket"):
        grant.attach_unix(regular)
    assert regular.read_text() == "mine"


def test_only_the_model_endpoints_are_served(upstream: ScriptedModelServer, gateway: ModelGateway) -> None:
    grant = gateway.grant("unit-1", api="anthropic", upstream_base_url=upstream.base_url, api_key=REAL_KEY)
    auth = {"x-api-key": grant.token}
    with httpx.Client(base_url=gateway.tcp_root, headers=auth) as client:
        head = client.head("/api/hello")
        assert (head.status_code, head.content) == (200, b"")
        assert client.get("/v1/messages").status_code == 405
        assert client.post("/v1/models", json={}).status_code == 404
        assert client.post("/v1/responses", json={}).status_code == 404  # an Anthropic grant
        assert client.post("/", json={}).status_code == 404
    host, port = gateway.tcp_root.removeprefix("http://").split(":")
    for path in ("/v1/messages/../../v1/responses", "//example.com/v1/messages", "/v1/messages/", "/v1//messages"):
        connection = http.client.HTTPConnection(host, int(port))
        connection.request("POST", path, body=b"{}", headers={**auth, "content-type": "application/json"})
        assert connection.getresponse().status == 404, path
        connection.close()
    assert upstream.requests == []


def test_the_request_is_forwarded_unchanged_but_for_credentials_and_hop_headers(
    upstream: ScriptedModelServer, gateway: ModelGateway
) -> None:
    grant = gateway.grant("unit-1", api="anthropic", upstream_base_url=upstream.base_url, api_key=REAL_KEY)
    headers = {
        "x-api-key": grant.token,
        "authorization": f"Bearer {grant.token}",
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "claude-code-20250219",
        "connection": "keep-alive, x-hop",
        "x-hop": "1",
        "te": "trailers",
    }
    body = {"model": "m", "max_tokens": 5, "messages": claude_messages("list the files"), "tools": CLAUDE_TOOLS}
    reply = httpx.post(gateway.tcp_root + "/v1/messages?beta=true", headers=headers, json=body)
    assert reply.status_code == 200 and reply.headers["content-type"] == "application/json"
    (seen,) = upstream.requests
    assert seen.query == "beta=true" and seen.path == "/v1/messages"
    assert {"anthropic-version", "anthropic-beta", "x-api-key"} <= set(seen.headers)
    assert not {"x-hop", "te", "authorization"} & set(seen.headers)
    assert (seen.auth, seen.tool) == ("ok", "mcp__vm__run_command")


def test_count_tokens_and_no_key(make_server: MakeServer, gateway: ModelGateway) -> None:
    keyless = make_server()
    grant = gateway.grant("unit-1", api="anthropic", upstream_base_url=keyless.base_url, api_key=None)
    counted = anthropic_client(gateway.tcp_root, grant.token).messages.count_tokens(
        model="m", messages=claude_messages("hi")
    )
    assert counted.input_tokens > 0
    (seen,) = keyless.requests
    assert (seen.path, seen.auth) == ("/v1/messages/count_tokens", "absent")
    usage = gateway.usage("unit-1")
    assert (usage["requests"], usage["input_tokens"], usage["calls"][0]["path"]) == (
        1,
        0,
        "/v1/messages/count_tokens",
    )


def test_an_unreachable_upstream_is_a_502(gateway: ModelGateway) -> None:
    with socket.socket() as bound:  # bound, never listening: connections to it are refused
        bound.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{bound.getsockname()[1]}"
        grant = gateway.grant("unit-1", api="openai", upstream_base_url=down + "/v1", api_key=REAL_KEY)
        with pytest.raises(openai.InternalServerError) as caught:
            codex(grant.base_url(gateway.tcp_root), grant.token)
    assert caught.value.status_code == 502 and "could not reach the upstream" in str(caught.value)
    usage = gateway.usage("unit-1")
    assert (usage["requests"], usage["errors"]) == (1, 1)
    (call,) = usage["calls"]
    assert call["status"] == 502 and call["error"].startswith("upstream unreachable")
    assert call["ttfb_ms"] is None and usage["latency"]["ttfb"]["count"] == 0


def test_upstream_errors_and_broken_streams_are_counted(upstream: ScriptedModelServer, gateway: ModelGateway) -> None:
    grant = gateway.grant("unit-1", api="anthropic", upstream_base_url=upstream.base_url, api_key=REAL_KEY)
    with pytest.raises(anthropic.InternalServerError):
        claude(gateway.tcp_root, grant.token, prompt="fail with 500")
    body = {"model": "m", "stream": True, "messages": claude_messages("drop")}
    with (
        pytest.raises(httpx.RemoteProtocolError),
        httpx.stream("POST", gateway.tcp_root + "/v1/messages", headers={"x-api-key": grant.token}, json=body) as r,
    ):
        for _ in r.iter_raw():
            pass
    usage = gateway.usage("unit-1")
    assert (usage["requests"], usage["errors"]) == (2, 2)
    assert [c["status"] for c in usage["calls"]] == [500, 200]
    assert usage["calls"][0]["error"] == "upstream answered HTTP 500"
    assert usage["calls"][0]["upstream_error"] == "scripted failure (http_500)"
    assert usage["calls"][1]["error"].startswith("upstream stream broke")
    assert usage["calls"][1]["upstream_error"] is None


def test_a_plan_error_of_the_upstream_is_in_the_units_record(
    upstream: ScriptedModelServer, gateway: ModelGateway
) -> None:
    """The upstream's own error message is kept per call: that is how a run reads a plan error back per unit."""
    grant = gateway.grant("unit-1", api="openai", upstream_base_url=upstream.base_url + "/v1", api_key=REAL_KEY)
    with pytest.raises(openai.BadRequestError):
        codex(grant.base_url(gateway.tcp_root), grant.token, prompt="nothing the plan knows")
    (call,) = gateway.usage("unit-1")["calls"]
    assert (call["status"], call["error"]) == (400, "upstream answered HTTP 400")
    assert call["upstream_error"] == "plan error: no script matches the prompt 'nothing the plan knows'"


def _read_in_background(
    url: str, headers: dict[str, str], body: dict[str, Any]
) -> tuple[queue.Queue[Any], threading.Thread]:
    """Stream a request in a thread; each line, then "END" or the exception, goes to the queue."""
    lines: queue.Queue[Any] = queue.Queue()

    def read() -> None:
        try:
            with httpx.stream("POST", url, headers=headers, json=body, timeout=None) as response:
                for line in response.iter_lines():
                    lines.put(line)
            lines.put("END")
        except httpx.HTTPError as exc:
            lines.put(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return lines, thread


def _rest(lines: queue.Queue[Any]) -> list[Any]:
    out = []
    with contextlib.suppress(queue.Empty):
        while True:
            out.append(lines.get_nowait())
    return out


def test_answers_stream_through_unbuffered_and_revoke_cuts_them(
    upstream: ScriptedModelServer, gateway: ModelGateway
) -> None:
    grant = gateway.grant("unit-1", api="anthropic", upstream_base_url=upstream.base_url, api_key=REAL_KEY)
    body = {"model": "m", "stream": True, "messages": claude_messages("hang")}
    lines, reader = _read_in_background(gateway.tcp_root + "/v1/messages", {"x-api-key": grant.token}, body)
    # The upstream sent its first event and holds the stream open: the agent has it already.
    assert lines.get(timeout=60) == "event: message_start"
    assert upstream.requests[0].served == "fail:hang"
    gateway.revoke("unit-1")
    reader.join(timeout=60)
    assert not reader.is_alive()
    rest = _rest(lines)
    assert isinstance(rest[-1], httpx.RemoteProtocolError), rest
    (call,) = gateway.usage("unit-1")["calls"]
    assert call["error"] == "grant revoked" and call["ttfb_ms"] is not None


def test_revoke_refuses_the_token_and_removes_the_sockets(
    upstream: ScriptedModelServer, gateway: ModelGateway, tmp_path: Path
) -> None:
    grant = gateway.grant("unit-1", api="anthropic", upstream_base_url=upstream.base_url, api_key=REAL_KEY)
    path = tmp_path / "gw.sock"
    grant.attach_unix(path)
    claude(gateway.tcp_root, grant.token)
    with pytest.raises(AleIacError, match="already has a model grant"):
        gateway.grant("unit-1", api="anthropic", upstream_base_url=None, api_key=None)
    gateway.revoke("unit-1")
    gateway.revoke("unit-1")  # idempotent
    gateway.revoke("never-granted")
    assert not path.exists()
    with pytest.raises(anthropic.AuthenticationError):
        claude(gateway.tcp_root, grant.token)
    assert gateway.refused == 1
    with pytest.raises(AleIacError, match="revoked"):
        grant.attach_unix(tmp_path / "again.sock")
    assert not (tmp_path / "again.sock").exists()
    assert gateway.usage("unit-1")["requests"] == 1  # still readable
    again = gateway.grant("unit-1", api="anthropic", upstream_base_url=upstream.base_url, api_key=REAL_KEY)
    assert again.token != grant.token
    claude(gateway.tcp_root, again.token)
    assert gateway.usage("unit-1")["requests"] == 1  # a new grant starts over


def test_concurrent_units_are_accounted_apart(make_server: MakeServer, gateway: ModelGateway) -> None:
    cheap = {"input_tokens": 7, "output_tokens": 1}
    dear = {"input_tokens": 1000, "output_tokens": 300}
    upstream = make_server(
        plan(("cheap", [{"text": "c", "usage": cheap}]), ("dear", [{"text": "d", "usage": dear}])), api_key=REAL_KEY
    )
    a = gateway.grant("a", api="anthropic", upstream_base_url=upstream.base_url, api_key=REAL_KEY)
    b = gateway.grant("b", api="anthropic", upstream_base_url=upstream.base_url, api_key=REAL_KEY)
    jobs = [(a, "cheap")] * 4 + [(b, "dear")] * 3
    with ThreadPool(len(jobs)) as pool:
        pool.map(lambda job: claude(gateway.tcp_root, job[0].token, prompt=job[1]), jobs)
    assert totals(gateway.usage("a")) == {"requests": 4, "input_tokens": 28, "output_tokens": 4}
    assert totals(gateway.usage("b")) == {"requests": 3, "input_tokens": 3000, "output_tokens": 900}
    served = upstream.usage_served()
    assert served["input_tokens"] == 3028 and served["requests"] == 7


def test_grants_check_their_upstream(gateway: ModelGateway) -> None:
    anthropic_default = gateway.grant("a", api="anthropic", upstream_base_url=None, api_key="k")
    openai_default = gateway.grant("o", api="openai", upstream_base_url=None, api_key="k")
    assert gateway.usage("a")["upstream"] == "https://api.anthropic.com"
    assert gateway.usage("o")["upstream"] == "https://api.openai.com"
    assert anthropic_default.base_url("http://x:1/") == "http://x:1"
    assert openai_default.base_url("http://x:1/") == "http://x:1/v1"
    assert anthropic_default.token.startswith("ale-gw-") and anthropic_default.token != openai_default.token
    for bad in ("ftp://host", "not a url", "http://host/v1?x=1"):
        with pytest.raises(AleIacError, match="upstream base URL"):
            gateway.grant("bad", api="openai", upstream_base_url=bad, api_key=None)
    with pytest.raises(KeyError):
        gateway.usage("bad")


def test_close_leaves_no_socket_no_thread_no_listener_and_no_signal_handler(
    upstream: ScriptedModelServer, tmp_path: Path
) -> None:
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    threads = set(threading.enumerate())
    gateway = ModelGateway()
    gateway.start()
    root = gateway.tcp_root
    grant = gateway.grant("unit-1", api="anthropic", upstream_base_url=upstream.base_url, api_key=REAL_KEY)
    sockets = [tmp_path / "one.sock", tmp_path / "two.sock"]
    for path in sockets:
        grant.attach_unix(path)
    claude(root, grant.token)
    body = {"model": "m", "stream": True, "messages": claude_messages("hang")}
    lines, reader = _read_in_background(root + "/v1/messages", {"x-api-key": grant.token}, body)
    assert lines.get(timeout=60) == "event: message_start"
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers

    gateway.close()
    gateway.close()  # idempotent
    reader.join(timeout=60)
    assert isinstance(_rest(lines)[-1], httpx.RemoteProtocolError)
    assert not any(path.exists() for path in sockets)
    assert set(threading.enumerate()) - threads == set()
    with pytest.raises(httpx.ConnectError):
        httpx.head(root)
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
    assert gateway.usage("unit-1")["requests"] == 2
    assert gateway.usage("unit-1")["calls"][-1]["error"] == "gateway closed"


@contextlib.contextmanager
def ThreadPool(workers: int) -> Iterator[Any]:  # noqa: N802 (reads like the executor it wraps)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=workers) as pool:
        yield _Mapper(pool)


class _Mapper:
    def __init__(self, pool: Any) -> None:
        self.pool = pool

    def map(self, fn: Any, items: list[Any]) -> list[Any]:
        return list(self.pool.map(fn, items))
