"""The host's side of a unit's model channel: the reverse connections that carry an in-unit agent's model
calls back to the run's gateway, opened by this host to the unit's own endpoint.

The unit's forwarder (:mod:`ale_iac.substrates.authproxy`) serves the agent's model base URL on a loopback
port in the unit and pairs each connection made there with an idle connection this host opened to the
endpoint's reserved path (:data:`~ale_iac.substrates.authproxy.CHANNEL_PATH`, with the unit's token and an
upgrade). So the unit needs no route to this host: only this host's route to the endpoint, the one every
unit has (through NAT, a firewall, ``allow_outbound: false``).

:class:`ModelChannel` keeps :data:`POOL` such connections idle. When the unit sends the first bytes on one
(an agent connected), it connects ``upstream`` (the gateway's Unix socket for the unit's grant only),
copies both ways until both sides are done, and opens a new idle connection in its place. No framing: one
agent connection is one reverse connection.

It closes itself, with a reason, when the upstream cannot be reached (the grant was revoked: its socket is
gone) or the endpoint stops taking channel connections (the unit is dead or was replaced); :meth:`close_soon`
closes it from any thread (a revoked grant's callback). Closed, it has no task, thread or socket left.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable
from typing import Final
from urllib.parse import urlsplit

from ale_iac.errors import AleIacError
from ale_iac.substrates import authproxy

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]
Connector = Callable[[], Awaitable[Streams]]

POOL: Final = 4
"""Idle reverse connections kept open: as many agent connections can start at once without a wait."""
HANDSHAKE_TIMEOUT_S: Final = 15.0
REOPEN_DELAYS_S: Final = (0.0, 0.2, 0.5, 1.0)
"""Waits before each attempt to replace a lost idle connection; when all fail, the unit is taken for gone."""


class ModelChannelError(AleIacError):
    """The unit's endpoint would not take the model channel (no token, an old forwarder, a dead unit)."""


class ModelChannel:
    """A unit's model channel, host side (see the module docstring). Use it on one event loop:
    ``await open()``, then ``await aclose()``; :meth:`close_soon` is the one thread-safe method."""

    def __init__(
        self, endpoint: str, token: str, upstream: Connector, *, pool: int = POOL, path: bytes = authproxy.CHANNEL_PATH
    ) -> None:
        url = urlsplit(endpoint)
        if url.scheme != "http" or not url.hostname or not url.port:
            raise ModelChannelError(f"the model channel needs an http://HOST:PORT endpoint, not {endpoint!r}")
        self.host, self.port = url.hostname, url.port
        self._token = token
        self._upstream = upstream
        self._pool = pool
        self._path = path
        """The reserved path: the model channel's, or the egress channel's (``substrates.egress``)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()
        self.reason: str | None = None
        """Why it closed (None while open)."""
        self.idle = 0
        """Reverse connections open and waiting for an agent connection."""
        self.carried = 0
        """Agent connections carried so far."""
        self.bytes_up = 0
        """Bytes the unit sent through the channel (first bytes included), and below those it was sent."""
        self.bytes_down = 0

    # lifecycle

    async def open(self) -> None:
        """Open the pool; raises :class:`ModelChannelError` when the endpoint refuses the first connection."""
        self._loop = asyncio.get_running_loop()
        first = await self._connect()
        self._spawn(self._wait_idle(first))
        for _ in range(self._pool - 1):
            self._spawn(self._replace())

    def close_soon(self, reason: str) -> None:
        """Close the channel from any thread (a no-op once closed or when its loop has ended)."""
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: so is the channel
            loop.call_soon_threadsafe(self._begin_close, reason)

    async def aclose(self, reason: str = "closed") -> None:
        """Close every connection, agent connections in flight included, and wait until nothing is left."""
        self._begin_close(reason)
        if self._closing is not None:
            await asyncio.shield(self._closing)

    def _begin_close(self, reason: str) -> None:
        if self._closing is None:
            self.reason = reason
            self._closing = asyncio.ensure_future(self._close_all())

    async def _close_all(self) -> None:
        current = asyncio.current_task()
        tasks = [task for task in self._tasks if task is not current]
        for task in tasks:
            task.cancel()
        # Aborted, not closed: a graceful close waits until the bytes still held for a peer are sent, and a peer
        # that stopped reading (the gateway side of a stalled connection) would hold the channel's end, and
        # every task closing a connection in its ``finally``, for ever. Closing ends them all anyway.
        for writer in list(self._writers):
            writer.transport.abort()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._writers.clear()
        self.idle = 0
        self.closed.set()

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        if self._closing is not None:
            close = getattr(coroutine, "close", None)
            if close is not None:
                close()
            return
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # the reverse connections

    async def _connect(self) -> Streams:
        """One reverse connection, upgraded: the endpoint's 101 read, nothing after it.

        ``asyncio.timeout``, not ``asyncio.wait_for``: on Python 3.11 a ``wait_for`` whose call completes as its
        task is cancelled returns the result and drops the cancel (CPython gh-86296). A channel closing as a
        replacement connection came up then got that connection after it had aborted the others: its task waited
        on it for ever, and so did the close (a kubernetes isolation test hung 40 min in CI on it)."""
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                reader, writer = await asyncio.open_connection(self.host, self.port)
        except (OSError, TimeoutError) as exc:
            raise ModelChannelError(f"the unit's endpoint {self.host}:{self.port} does not answer: {exc}") from None
        if self._closing is not None:  # closed meanwhile: what the close aborted did not include this one
            writer.transport.abort()
            raise ModelChannelError("the channel is closing")
        self._writers.add(writer)
        try:
            _tune(writer)
            writer.write(
                b"GET " + self._path + b" HTTP/1.1\r\nHost: " + self.host.encode() + b"\r\n"
                b"Authorization: Bearer " + self._token.encode() + b"\r\n"
                b"Connection: Upgrade\r\nUpgrade: " + authproxy.CHANNEL_PROTOCOL + b"\r\n\r\n"
            )
            await writer.drain()
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            await self._drop(writer)
            raise ModelChannelError(f"the unit's endpoint closed the model channel's handshake: {exc!r}") from None
        status = head.split(b"\r\n", 1)[0].decode("latin-1")
        if not status.startswith("HTTP/1.1 101 "):
            await self._drop(writer)
            hint = " (its forwarder predates the model channel: recreate the unit)" if " 404 " in status else ""
            raise ModelChannelError(f"the unit's endpoint refused the model channel: {status}{hint}")
        self.idle += 1
        return reader, writer

    async def _drop(self, writer: asyncio.StreamWriter) -> None:
        self._writers.discard(writer)
        await authproxy.close_writer(writer)

    async def _replace(self) -> None:
        """Open one idle connection, retrying a little; when it cannot be done, the unit is gone."""
        last: ModelChannelError | None = None
        for delay in REOPEN_DELAYS_S:
            await asyncio.sleep(delay)
            if self._closing is not None:
                return
            try:
                streams = await self._connect()
            except ModelChannelError as exc:
                last = exc
                continue
            await self._wait_idle(streams)
            return
        self._begin_close(f"the unit is gone: {last}")

    async def _wait_idle(self, unit: Streams) -> None:
        """Wait for the unit to use this connection; then carry it (and open a replacement)."""
        try:
            first = await unit[0].read(authproxy.COPY_CHUNK)
        except (ConnectionError, OSError):
            first = b""
        self.idle -= 1
        if not first:  # the unit closed it: replace it (which finds a dead unit out)
            await self._drop(unit[1])
            self._spawn(self._replace())
            return
        self._spawn(self._replace())
        await self._carry(unit, first)

    async def _carry(self, unit: Streams, first: bytes) -> None:
        try:
            gateway = await self._upstream()
        except OSError as exc:
            await self._drop(unit[1])
            self._begin_close(f"the model gateway does not serve the unit's grant any more (revoked?): {exc}")
            return
        self._writers.add(gateway[1])
        self.carried += 1
        self.bytes_up += len(first)
        try:
            gateway[1].write(first)
            await asyncio.gather(
                authproxy.pipe(unit[0], gateway[1], self._count_up),
                authproxy.pipe(gateway[0], unit[1], self._count_down),
            )
        finally:
            await self._drop(gateway[1])
            await self._drop(unit[1])

    def _count_up(self, size: int) -> None:
        self.bytes_up += size

    def _count_down(self, size: int) -> None:
        self.bytes_down += size


def _tune(writer: asyncio.StreamWriter) -> None:
    """No Nagle (a call's small writes go at once), and TCP keepalive: an idle connection through NAT or a
    firewall stays known to both ends, and a unit that vanished without a FIN is found out."""
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
