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
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

AUTH_HEADER: Final = b"authorization"
HEAD_LIMIT: Final = 64 * 1024
"""Largest request head (request line and headers) accepted."""
FIRST_REQUEST_TIMEOUT_S: Final = 30.0
"""A connection that sends no complete request head within this long is closed."""
COPY_CHUNK: Final = 256 * 1024

Connector = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


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
            self.headers.append(line)

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


async def _close(writer: asyncio.StreamWriter | None) -> None:
    if writer is None:
        return
    with contextlib.suppress(Exception):
        writer.close()
        await writer.wait_closed()


class _Connection:
    """One client connection: requests checked and forwarded, responses copied back."""

    def __init__(
        self, token: bytes, connect: Connector, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
    ) -> None:
        self.token = token
        self.connect = connect
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
            upstream_w = self.upstream_w or await self._open_upstream()
            upstream_w.write(request.encoded())
            await _copy(self.client_r, upstream_w, request.content_length)
            if request.upgrade:
                await _copy(self.client_r, upstream_w)  # from now on the connection is a byte pipe
                return
            first = False

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
            await _close(self.client_w)  # ends the request side too

    async def _finish(self) -> None:
        """The client is done sending: let the server finish what it answers, then close both."""
        if self.upstream_w is not None and self.responses is not None:
            with contextlib.suppress(Exception):
                if self.upstream_w.can_write_eof():
                    self.upstream_w.write_eof()
            with contextlib.suppress(Exception):
                await self.responses
        await _close(self.upstream_w)
        await _close(self.client_w)


class AuthProxy:
    """Serve a listening socket, forwarding authorized requests through ``connect``."""

    def __init__(self, token: str, connect: Connector) -> None:
        if len(token) < 16:
            raise ValueError("the token must have at least 16 characters")
        self.token = token.encode()
        self.connect = connect

    async def handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        _no_delay(client_w)
        await _Connection(self.token, self.connect, client_r, client_w).run()

    async def serve(self, listener: socket.socket) -> None:
        server = await asyncio.start_server(self.handle, sock=listener, limit=HEAD_LIMIT)
        async with server:
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
    args = parser.parse_args(argv)
    token = args.token_file.read_text().strip()
    listener = socket.create_server(args.listen, family=socket.AF_INET6 if ":" in args.listen[0] else socket.AF_INET)
    listener.setblocking(False)
    print(f"listening on {args.listen[0]}:{listener.getsockname()[1]}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(AuthProxy(token, tcp_connector(*args.upstream)).serve(listener))
    return 0


if __name__ == "__main__":
    sys.exit(main())
