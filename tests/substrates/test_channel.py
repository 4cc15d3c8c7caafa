"""The model channel, both halves for real: the unit's forwarder (``python -m ale_iac.substrates.authproxy``
with ``--model-listen``, a process of its own standing in for the unit) and the host's
:class:`~ale_iac.substrates.channel.ModelChannel`, carrying an agent's calls to the run's model gateway
(the unit's grant, on a Unix socket) and on to a small streaming upstream."""

from __future__ import annotations

import asyncio
import http.server
import json
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from ale_iac.llm.gateway import Grant, ModelGateway
from ale_iac.substrates.channel import ModelChannel, ModelChannelError
from ale_iac.substrates.relay import unix_connector

TOKEN = secrets.token_urlsafe(32)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Upstream(http.server.BaseHTTPRequestHandler):
    """A model API stand-in: every POST is answered with a short SSE stream carrying usage."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        events = [
            {"type": "message_start", "message": {"usage": {"input_tokens": 7, "output_tokens": 1}}},
            {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "hello"}},
            {"type": "message_delta", "usage": {"output_tokens": 3}},
        ]
        body = b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Unit:
    """The forwarder standing in for a unit: its endpoint, its model port and its process."""

    endpoint: str
    model_url: str
    process: subprocess.Popen[str]


def start_unit(tmp_path: Path, *, model: bool = True) -> Unit:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    argv = [sys.executable, "-m", "ale_iac.substrates.authproxy", "--listen", "127.0.0.1:0"]
    argv += ["--upstream", "127.0.0.1:9", "--token-file", str(token_file)]
    argv += ["--model-listen", "127.0.0.1:0", "--pair-timeout", "1"] if model else []
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    endpoint = "http://" + process.stdout.readline().split(" on ")[1].strip()
    model_url = "http://" + process.stdout.readline().split(" on ")[1].strip() if model else ""
    return Unit(endpoint, model_url, process)


@pytest.fixture
def unit(tmp_path: Path) -> Iterator[Unit]:
    started = start_unit(tmp_path)
    try:
        yield started
    finally:
        started.process.kill()
        started.process.wait()


@pytest.fixture
def gateway() -> Iterator[ModelGateway]:
    with ModelGateway() as gw:
        yield gw


@pytest.fixture
def grant(gateway: ModelGateway, upstream: str, tmp_path: Path) -> Grant:
    grant = gateway.grant("u1", api="anthropic", upstream_base_url=upstream, api_key="sk-real-key")
    grant.attach_unix(tmp_path / "gateway.sock")
    return grant


@pytest.fixture
async def channel(unit: Unit, grant: Grant, tmp_path: Path) -> AsyncIterator[ModelChannel]:
    opened = ModelChannel(unit.endpoint, TOKEN, unix_connector(str(tmp_path / "gateway.sock")))
    await opened.open()
    try:
        yield opened
    finally:
        await opened.aclose()


async def call(model_url: str, token: str) -> httpx.Response:
    """One model call as an agent in the unit makes it (a connection of its own)."""
    async with httpx.AsyncClient(timeout=30) as client:
        body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        return await client.post(f"{model_url}/v1/messages", json=body, headers={"x-api-key": token})


def tasks() -> set[asyncio.Task[object]]:
    """The loop's tasks but the test's own (and the test runner's, which wait on it)."""
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task() and "TestRunner" not in repr(t)}


def channel_sockets(unit: Unit) -> tuple[int, int]:
    """(TCP connections of this process to the unit's endpoint, Unix socket connections of this process):
    the channel's two kinds of connections. The gateway's keep-alive pool to its upstream is neither."""
    port = int(unit.endpoint.rsplit(":", 1)[1])
    me = psutil.Process()
    to_unit = sum(1 for c in me.net_connections(kind="tcp") if c.raddr and c.raddr.port == port)
    return to_unit, len(me.net_connections(kind="unix"))


async def until(condition: Callable[[], bool], what: str, limit_s: float = 20.0) -> None:
    """Wait for ``condition()`` to hold (the channel works across processes: nothing is instant)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + limit_s
    while not condition():
        assert loop.time() < end, f"still not: {what}"
        await asyncio.sleep(0.05)


async def test_each_agent_connection_is_paired_and_reaches_only_the_unit_s_grant(
    unit: Unit, grant: Grant, gateway: ModelGateway, tmp_path: Path
) -> None:
    other = gateway.grant("u2", api="anthropic", upstream_base_url="http://127.0.0.1:9", api_key=None)
    before = channel_sockets(unit)
    channel = ModelChannel(unit.endpoint, TOKEN, unix_connector(str(tmp_path / "gateway.sock")), pool=2)
    await channel.open()
    await until(lambda: channel.idle == 2, "two idle reverse connections")
    answers = await asyncio.gather(*(call(unit.model_url, grant.token) for _ in range(7)))  # more than the pool
    assert [a.status_code for a in answers] == [200] * 7
    assert all("hello" in a.text for a in answers)
    refused = await call(unit.model_url, other.token)  # another unit's token: not on this grant's socket
    assert refused.status_code == 401
    usage = gateway.usage("u1")
    assert (usage["requests"], usage["refused"], usage["input_tokens"]) == (7, 1, 49)
    assert channel.carried == 8
    await until(lambda: channel.idle == 2, "the pool replenished")
    await channel.aclose()
    assert channel.reason == "closed" and channel.idle == 0
    assert tasks() == set()
    # The gateway (a thread of this process) closes its side of each connection once it reads our close.
    await until(lambda: channel_sockets(unit) == before, f"no connection left of the channel: {before}")
    assert before[0] == 0


@pytest.mark.parametrize("told", [True, False], ids=["revoke-callback", "found-on-next-call"])
async def test_a_revoked_grant_closes_the_channel(
    told: bool, unit: Unit, grant: Grant, gateway: ModelGateway, channel: ModelChannel
) -> None:
    assert (await call(unit.model_url, grant.token)).status_code == 200
    if told:
        grant.on_revoke(lambda: channel.close_soon("the unit's model grant was revoked"))
    await asyncio.to_thread(gateway.revoke, "u1")
    if not told:  # nobody said: the next agent connection finds the grant's socket gone
        with pytest.raises(httpx.HTTPError):
            await call(unit.model_url, grant.token)
    await asyncio.wait_for(channel.closed.wait(), 20)
    assert "revoked" in str(channel.reason)
    assert tasks() == set()
    with pytest.raises(httpx.HTTPError):  # the unit holds no reverse connection any more: closed after 1 s
        await call(unit.model_url, grant.token)


async def test_a_dead_unit_closes_the_channel(unit: Unit, grant: Grant, channel: ModelChannel) -> None:
    assert (await call(unit.model_url, grant.token)).status_code == 200
    unit.process.send_signal(signal.SIGKILL)
    unit.process.wait()
    await asyncio.wait_for(channel.closed.wait(), 20)
    assert "the unit is gone" in str(channel.reason)
    assert tasks() == set()


async def test_without_the_token_or_a_model_port_there_is_no_channel(tmp_path: Path, grant: Grant) -> None:
    sock = unix_connector(str(tmp_path / "gateway.sock"))
    served = start_unit(tmp_path)
    (tmp_path / "plain").mkdir()
    plain = start_unit(tmp_path / "plain", model=False)
    try:
        with pytest.raises(ModelChannelError, match="401 Unauthorized"):
            await ModelChannel(served.endpoint, secrets.token_urlsafe(32), sock).open()
        with pytest.raises(ModelChannelError, match=r"404 Not Found.*predates the model channel"):
            await ModelChannel(plain.endpoint, TOKEN, sock).open()
    finally:
        for process in (served.process, plain.process):
            process.kill()
            process.wait()


async def test_closing_waits_for_no_peer_that_stopped_reading(unit: Unit, tmp_path: Path) -> None:
    """An agent connection in flight whose gateway side takes nothing more: the channel's close drops the bytes
    it holds for it instead of waiting for them to be read (a teardown hung 60 s on this in a shuffled run)."""
    held: list[asyncio.StreamWriter] = []

    async def never_reads(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    stalled = await asyncio.start_unix_server(never_reads, path=str(tmp_path / "stalled.sock"))
    channel = ModelChannel(unit.endpoint, TOKEN, unix_connector(str(tmp_path / "stalled.sock")))
    await channel.open()
    host, port = unit.model_url.removeprefix("http://").rsplit(":", 1)
    _agent_reader, agent = await asyncio.open_connection(host, int(port))
    try:
        agent.write(b"x" * (16 << 20))  # far more than the socket buffers on the way hold
        await until(
            lambda: any(w.transport.get_write_buffer_size() > 0 for w in channel._writers),
            "the channel holding bytes the gateway side does not take",
        )
        await asyncio.wait_for(channel.aclose("the unit's egress ended"), 20)
        assert channel.closed.is_set() and tasks() == set()
        assert channel.bytes_up > 0
    finally:
        agent.transport.abort()
        for writer in held:
            writer.transport.abort()
        stalled.close()
        await stalled.wait_closed()


async def test_a_connection_that_comes_up_as_the_channel_closes_is_dropped(
    unit: Unit, grant: Grant, tmp_path: Path
) -> None:
    """A reverse connection whose handshake completes after the close began (as one did whose task's cancel
    Python 3.11's ``wait_for`` dropped: the close had aborted the others, and waited on that one for ever) is
    aborted at once, not kept open and waited on."""
    channel = ModelChannel(unit.endpoint, TOKEN, unix_connector(str(tmp_path / "gateway.sock")))
    await channel.open()
    await asyncio.wait_for(channel.aclose(), 20)
    with pytest.raises(ModelChannelError, match="closing"):
        await channel._connect()
    assert channel._writers == set() and tasks() == set()
    await until(lambda: channel_sockets(unit)[0] == 0, "no connection of the channel left to the unit")
