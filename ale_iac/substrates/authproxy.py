"""An authenticating HTTP forwarder in front of a computer-server (standard library only).

The Cua computer-server has no authentication of its own in local mode: whoever reaches its port
is root in the sandbox. Every sandbox endpoint ale-iac hands out is therefore this forwarder,
which admits a request only with ``Authorization: Bearer <the sandbox's token>``, removes that
header (the token never reaches the sandbox), and passes the request on. Each request of a
keep-alive connection is checked, not only the first; a WebSocket upgrade switches the
connection to a plain byte pipe once its (checked) upgrade request has gone through.

It is substrate-neutral: ``connect`` opens the upstream connection, however that is done. The
``local`` supervisor runs it in a thread that has joined the sandbox's network namespace, so the
upstream is the server's own loopback and the sandbox needs no network device but ``lo``.

Request bodies are forwarded by ``Content-Length``; a chunked request body is refused with 411
(none of ale-iac's clients sends one). Responses are copied through unchanged.

**The model channel** (``model_listener``): the forwarder also serves the agent's model base URL on a
loopback port in the unit, and carries each connection made there back to the host, over a connection the
*host* opened to this endpoint: the unit needs no route to the runner (no outbound network at all). The host
takes the reserved path :data:`CHANNEL_PATH` with an upgrade (``Upgrade:`` :data:`CHANNEL_PROTOCOL`), which
like every request needs the unit's token and never reaches the computer-server; the forwarder answers 101 and
parks the connection, idle. Each agent connection on the model port is paired with one parked connection (in
arrival order; it waits up to :data:`PAIR_TIMEOUT_S` for one, then is closed) and bytes are copied both ways
until both sides are done; there is no framing. The host sees the agent's first bytes, connects to the run's
gateway (the unit's grant only) and opens a new idle connection to replace the paired one. A parked connection
the host closes leaves the pool; at most :data:`MAX_PARKED` are kept.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import hmac
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

AUTH_HEADER: Final = b"authorization"
HEAD_LIMIT: Final = 64 * 1024
"""Largest request head (request line and headers) accepted."""
FIRST_REQUEST_TIMEOUT_S: Final = 30.0
"""A connection that sends no complete request head within this long is closed."""
COPY_CHUNK: Final = 256 * 1024
CHANNEL_PATH: Final = b"/.ale-iac/model-channel"
"""The reserved path of the model channel: taken only with the token and an upgrade, never forwarded."""
CHANNEL_PROTOCOL: Final = b"ale-model-channel"
CHANNEL_ACCEPTED: Final = (
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: " + CHANNEL_PROTOCOL + b"\r\nConnection: Upgrade\r\n\r\n"
)
MODEL_PORT: Final = 4010
"""The model channel's port on the unit's loopback (the agent's model base URL is ``http://127.0.0.1:4010``)."""
EGRESS_PATH: Final = b"/.ale-iac/egress-channel"
"""The egress channel's reserved path: the same pairing as the model channel's, carried by the host to the
unit's egress proxy (``substrates.egress``) instead of the gateway."""
EGRESS_PORT: Final = 4011
"""The egress channel's port on the unit's loopback: ``HTTP_PROXY``/``HTTPS_PROXY`` in the unit point at it."""
MAX_PARKED: Final = 16
"""Most idle host connections the model channel keeps; one more is refused (503)."""
PAIR_TIMEOUT_S: Final = 30.0
"""How long an agent connection on the model port waits for an idle host connection before it is closed."""

Connector = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


def unit_entry(
    *,
    python: str,
    proxy_file: str,
    token_file: str,
    listen: str,
    init: str,
    server_port: int,
    width: int,
    height: int,
    log_file: str = "/var/log/ale/authproxy.log",
) -> list[str]:
    """PID 1 of a container unit (the ``docker`` substrate's and the ``kubernetes`` provider's pods): this
    forwarder in the background, on ``listen``, in front of the computer-server that the image's ``init`` runs on
    the unit's ``127.0.0.1:server_port``, with the model and egress channels on the unit's loopback; ``init``
    then replaces the shell, so it is PID 1 and reaps the forwarder too."""
    proxy = (
        f"{python} {proxy_file} --listen {listen} --upstream 127.0.0.1:{server_port} --token-file {token_file}"
        f" --model-listen 127.0.0.1:{MODEL_PORT} --egress-listen 127.0.0.1:{EGRESS_PORT}"
    )
    start = f"exec {init} --host 127.0.0.1 --port {server_port} --width {int(width)} --height {int(height)}"
    return ["/bin/sh", "-c", f"{proxy} >{log_file} 2>&1 & {start}"]


def bearer_matches(header: bytes, token: bytes) -> bool:
    """Whether an ``Authorization`` header value is ``Bearer <token>`` (compared in constant time)."""
    return hmac.compare_digest(header, b"Bearer " + token)


class _RefusedError(Exception):
    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


def _response(status: str) -> bytes:
    body = f"{status}\n".encode()
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


class _Request:
    """One parsed request head, with the authorization header taken out."""

    def __init__(self, head: bytes, token: bytes) -> None:
        lines = head[:-4].split(b"\r\n")
        self.request_line = lines[0]
        self.headers: list[bytes] = []
        self.authorized = False
        self.content_length = 0
        self.upgrade = False
        self.upgrade_to = b""
        seen_length = False
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise _RefusedError("400 Bad Request")
            key = name.strip().lower()
            value = value.strip()
            if key == AUTH_HEADER:
                self.authorized = bearer_matches(value, token)
                continue
            if key == b"content-length":
                # One length, digits only: two lengths could frame the body differently here and upstream.
                if not value.isdigit() or seen_length:
                    raise _RefusedError("400 Bad Request")
                seen_length = True
                self.content_length = int(value)
            elif key == b"transfer-encoding" and value.lower() != b"identity":
                raise _RefusedError("411 Length Required")
            elif key == b"upgrade":
                self.upgrade = True
                self.upgrade_to = value.lower()
            self.headers.append(line)

    @property
    def path(self) -> bytes:
        parts = self.request_line.split(b" ")
        return parts[1].split(b"?", 1)[0] if len(parts) == 3 else b""

    def encoded(self) -> bytes:
        return b"\r\n".join([self.request_line, *self.headers]) + b"\r\n\r\n"


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limit: int | None = None) -> None:
    """Copy ``limit`` bytes (or everything until EOF) from ``reader`` to ``writer``."""
    left = limit
    while left is None or left > 0:
        chunk = await reader.read(COPY_CHUNK if left is None else min(COPY_CHUNK, left))
        if not chunk:
            if left:
                raise ConnectionError("the peer closed in the middle of a request body")
            return
        writer.write(chunk)
        await writer.drain()
        if left is not None:
            left -= len(chunk)


async def close_writer(writer: asyncio.StreamWriter | None) -> None:
    """Close a stream, ignoring a peer that is already gone (shared with the relay and the model channel)."""
    if writer is None:
        return
    with contextlib.suppress(Exception):
        writer.close()
        await writer.wait_closed()


class _Connection:
    """One client connection: requests checked and forwarded, responses copied back."""

    def __init__(
        self,
        token: bytes,
        connect: Connector,
        client_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
        channels: dict[bytes, _ModelChannel] | None = None,
    ) -> None:
        self.token = token
        self.connect = connect
        self.channels = channels or {}
        self.client_r = client_r
        self.client_w = client_w
        self.upstream_w: asyncio.StreamWriter | None = None
        self.responses: asyncio.Task[None] | None = None

    async def run(self) -> None:
        try:
            await self._forward_requests()
        except _RefusedError as refused:
            # Only a refused first request is answered: later, responses may still be on their way.
            if self.upstream_w is None:
                with contextlib.suppress(Exception):
                    self.client_w.write(_response(refused.status))
                    await self.client_w.drain()
        except (ConnectionError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        finally:
            await self._finish()

    async def _read_head(self, first: bool) -> bytes | None:
        """The next request head, or None when the client closed between requests."""
        read = self.client_r.readuntil(b"\r\n\r\n")
        try:
            return await (asyncio.wait_for(read, FIRST_REQUEST_TIMEOUT_S) if first else read)
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise
            return None

    async def _forward_requests(self) -> None:
        first = True
        while (head := await self._read_head(first)) is not None:
            request = _Request(head, self.token)
            if not request.authorized:
                raise _RefusedError("401 Unauthorized")
            if request.path in (CHANNEL_PATH, EGRESS_PATH):
                await self._take_channel(request, first)
                return
            upstream_w = self.upstream_w or await self._open_upstream()
            upstream_w.write(request.encoded())
            await _copy(self.client_r, upstream_w, request.content_length)
            if request.upgrade:
                await _copy(self.client_r, upstream_w)  # from now on the connection is a byte pipe
                return
            first = False

    async def _take_channel(self, request: _Request, first: bool) -> None:
        """The host's connection for the model (or egress) channel: answered 101 and parked until an agent
        connection is paired with it (then until both are done) or the host closes it."""
        channel = self.channels.get(request.path)
        if channel is None:
            raise _RefusedError("404 Not Found")
        if not first or request.upgrade_to != CHANNEL_PROTOCOL or request.content_length:
            raise _RefusedError("400 Bad Request")
        if len(channel.idle) >= MAX_PARKED:
            raise _RefusedError("503 Service Unavailable")
        self.client_w.write(CHANNEL_ACCEPTED)
        await self.client_w.drain()
        await channel.park(self.client_r, self.client_w)

    async def _open_upstream(self) -> asyncio.StreamWriter:
        upstream_r, self.upstream_w = await self.connect()
        self.responses = asyncio.create_task(self._forward_responses(upstream_r))
        return self.upstream_w

    async def _forward_responses(self, upstream_r: asyncio.StreamReader) -> None:
        try:
            await _copy(upstream_r, self.client_w)
        except (ConnectionError, OSError):
            pass
        finally:
            await close_writer(self.client_w)  # ends the request side too

    async def _finish(self) -> None:
        """The client is done sending: let the server finish what it answers, then close both."""
        if self.upstream_w is not None and self.responses is not None:
            with contextlib.suppress(Exception):
                if self.upstream_w.can_write_eof():
                    self.upstream_w.write_eof()
            with contextlib.suppress(Exception):
                await self.responses
        await close_writer(self.upstream_w)
        await close_writer(self.client_w)


async def pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, count: Callable[[int], None] | None = None
) -> None:
    """Copy until EOF, then half-close: the other direction may still be answering (shared with the relay and
    the model channel; this module stays standard-library only, as it is copied into units). ``count`` is told
    the size of every chunk copied (the egress channel's bytes per unit)."""
    try:
        while chunk := await reader.read(COPY_CHUNK):
            if count is not None:
                count(len(chunk))
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            if writer.can_write_eof():
                writer.write_eof()


Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class _Parked:
    """An idle host connection of the model channel, and the agent connection paired with it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        loop = asyncio.get_running_loop()
        self.agent: asyncio.Future[tuple[Streams, asyncio.Future[bool]]] = loop.create_future()


class _ModelChannel:
    """The unit's side of the model channel: idle host connections, paired with agent connections."""

    def __init__(self, pair_timeout_s: float) -> None:
        self.pair_timeout_s = pair_timeout_s
        self.idle: collections.deque[_Parked] = collections.deque()
        self.changed = asyncio.Event()

    async def park(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Keep a host connection idle until an agent connection takes it, then copy both ways until both
        are done; or until the host closes it (or sends anything while idle: it is dropped)."""
        parked = _Parked(reader, writer)
        try:
            await self._serve_parked(parked)
        finally:
            if parked.agent.done():  # whatever happened, the agent connection's handler is not left waiting
                _, finished = parked.agent.result()
                if not finished.done():
                    finished.set_result(True)

    async def _serve_parked(self, parked: _Parked) -> None:
        reader, writer = parked.reader, parked.writer
        self.idle.append(parked)
        self.changed.set()
        watch = asyncio.ensure_future(reader.read(1))
        try:
            pending: set[asyncio.Future[Any]] = {watch, parked.agent}
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if parked in self.idle:
                self.idle.remove(parked)
            if not watch.done():
                watch.cancel()
            with contextlib.suppress(BaseException):
                await watch
        if not parked.agent.done():
            return
        agent, finished = parked.agent.result()
        if not watch.cancelled():  # the host closed (or spoke) as it was taken: the agent tries another
            finished.set_result(False)
            return
        await asyncio.gather(pipe(agent[0], writer), pipe(reader, agent[1]))
        finished.set_result(True)

    async def take(self) -> _Parked | None:
        """The oldest idle host connection, waiting up to ``pair_timeout_s`` for one."""
        loop = asyncio.get_running_loop()
        end = loop.time() + self.pair_timeout_s
        while not self.idle:
            self.changed.clear()
            left = end - loop.time()
            if left <= 0:
                return None
            try:
                await asyncio.wait_for(self.changed.wait(), left)
            except TimeoutError:
                return None
        return self.idle.popleft()

    async def handle_agent(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """An agent connection on the model port: carried over the first idle host connection that takes it."""
        _no_delay(writer)
        try:
            while (parked := await self.take()) is not None:
                finished: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
                parked.agent.set_result(((reader, writer), finished))
                if await finished:
                    return
        finally:
            await close_writer(writer)


class AuthProxy:
    """Serve a listening socket, forwarding authorized requests through ``connect``; with a model listener,
    also the model channel (see the module docstring)."""

    def __init__(self, token: str, connect: Connector, *, pair_timeout_s: float = PAIR_TIMEOUT_S) -> None:
        if len(token) < 16:
            raise ValueError("the token must have at least 16 characters")
        self.token = token.encode()
        self.connect = connect
        self.pair_timeout_s = pair_timeout_s
        self.channels: dict[bytes, _ModelChannel] = {}

    async def handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        _no_delay(client_w)
        await _Connection(self.token, self.connect, client_r, client_w, self.channels).run()

    async def serve(
        self,
        listener: socket.socket,
        model_listener: socket.socket | None = None,
        egress_listener: socket.socket | None = None,
    ) -> None:
        """Serve ``listener`` (the endpoint) and, when given, ``model_listener`` (the model channel's port in
        the unit: a loopback listener) and ``egress_listener`` (the egress channel's), all non-blocking and
        listening, until cancelled."""
        async with contextlib.AsyncExitStack() as stack:
            for path, channel_listener in ((CHANNEL_PATH, model_listener), (EGRESS_PATH, egress_listener)):
                if channel_listener is None:
                    continue
                channel = self.channels[path] = _ModelChannel(self.pair_timeout_s)
                served = await asyncio.start_server(channel.handle_agent, sock=channel_listener)
                await stack.enter_async_context(served)
            server = await asyncio.start_server(self.handle, sock=listener, limit=HEAD_LIMIT)
            await stack.enter_async_context(server)
            await server.serve_forever()


def tcp_connector(host: str, port: int) -> Connector:
    """Connect to ``host:port`` (a numeric address) in the calling thread's network namespace.

    The socket is made here, in the event loop's thread, rather than by ``asyncio.open_connection``
    with a host name, which may resolve it in another thread (and so another namespace).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET

    async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, (host, port))
        except BaseException:
            sock.close()
            raise
        reader, writer = await asyncio.open_connection(sock=sock, limit=HEAD_LIMIT)
        _no_delay(writer)
        return reader, writer

    return connect


def _no_delay(writer: asyncio.StreamWriter) -> None:
    """Turn Nagle's algorithm off. asyncio does so only for sockets whose ``proto`` is IPPROTO_TCP,
    which sockets made as ``socket(AF_INET, SOCK_STREAM)`` (and those they accept) are not; with it
    on, a response's body waits for the client's delayed ACK of its head: 40 ms a request."""
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT with a numeric address, got {text!r}")
    return host.strip("[]"), int(port)


def main(argv: list[str] | None = None) -> int:
    """Run the forwarder on its own, in front of a server on the same machine.

    This is how an image serves its endpoint where no supervisor stands in front of it (a container
    or VM guest): the computer-server listens on 127.0.0.1 only and this listens outside.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", type=_address, required=True, help="HOST:PORT to serve")
    parser.add_argument("--upstream", type=_address, required=True, help="HOST:PORT of the computer-server")
    parser.add_argument("--token-file", type=Path, required=True, help="file holding the bearer token")
    parser.add_argument("--model-listen", type=_address, help="HOST:PORT of the model channel in the unit")
    parser.add_argument("--egress-listen", type=_address, help="HOST:PORT of the egress channel in the unit")
    parser.add_argument(
        "--pair-timeout", type=float, default=PAIR_TIMEOUT_S, help="seconds an agent connection waits for the host"
    )
    args = parser.parse_args(argv)
    token = args.token_file.read_text().strip()
    listener = _listen(args.listen)
    model = _listen(args.model_listen) if args.model_listen else None
    egress = _listen(args.egress_listen) if args.egress_listen else None
    print(f"listening on {args.listen[0]}:{listener.getsockname()[1]}", flush=True)
    if model is not None:
        print(f"model channel on {args.model_listen[0]}:{model.getsockname()[1]}", flush=True)
    if egress is not None:
        print(f"egress channel on {args.egress_listen[0]}:{egress.getsockname()[1]}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        proxy = AuthProxy(token, tcp_connector(*args.upstream), pair_timeout_s=args.pair_timeout)
        asyncio.run(proxy.serve(listener, model, egress))
    return 0


def _listen(address: tuple[str, int]) -> socket.socket:
    listener = socket.create_server(address, family=socket.AF_INET6 if ":" in address[0] else socket.AF_INET)
    listener.setblocking(False)
    return listener


if __name__ == "__main__":
    sys.exit(main())
