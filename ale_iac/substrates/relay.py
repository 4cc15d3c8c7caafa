"""A plain byte relay (standard library only): every connection accepted on a listening socket is
joined to a fresh upstream connection, and bytes are copied both ways until either side closes.

It carries no authentication of its own: what it leads to authenticates (the model gateway checks
each request's per-unit token). Its user is the in-container entry of the ``docker`` executor
(``--network none``): loopback ports inside the container lead to the Unix sockets mounted into it.
(A unit's model channel is not a relay from inside: the unit's forwarder carries it back over
connections the host opens, ``substrates.channel``.)
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Final

from ale_iac.files import unix_address
from ale_iac.substrates.authproxy import close_writer, pipe

Connector = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


def unix_connector(path: str) -> Connector:
    async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        with unix_address(path) as address:  # a state dir's path may be longer than sun_path holds
            return await asyncio.open_unix_connection(address)

    return connect


async def join(
    a: tuple[asyncio.StreamReader, asyncio.StreamWriter], b: tuple[asyncio.StreamReader, asyncio.StreamWriter]
) -> None:
    """Copy both ways between two connections until both directions have ended; then close both."""
    try:
        await asyncio.gather(pipe(a[0], b[1]), pipe(b[0], a[1]))
    finally:
        await close_writer(a[1])
        await close_writer(b[1])


async def serve_relay(listener: socket.socket, connect: Connector) -> None:
    """Relay every connection accepted on ``listener`` (non-blocking, listening) to ``connect()``.
    A connection whose upstream cannot be opened is closed at once (the client sees EOF)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream = await connect()
        except OSError:
            await close_writer(writer)
            return
        await join((reader, writer), upstream)

    server = await asyncio.start_server(handle, sock=listener)
    async with server:
        await server.serve_forever()


IP_FREEBIND: Final = 15
"""``<linux/in.h>``: bind to an address the namespace may not have (yet); Python 3.11's ``socket`` lacks it."""


def loopback_listener(port: int = 0) -> socket.socket:
    """A non-blocking TCP listener on 127.0.0.1, made in the calling thread's network namespace.

    Bound with ``IP_FREEBIND``: a local sandbox's listener is made as soon as bubblewrap reports the
    sandbox's pid, while bubblewrap may still be configuring the namespace's ``lo``. In that window the
    namespace's local routing table can exist without a route for 127.0.0.1, and a plain bind fails with
    EADDRNOTAVAIL (seen under load). The bind does not need the address to exist; connections reach the
    listener once ``lo`` is up, as they could only then anyway.
    """
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.setsockopt(socket.IPPROTO_IP, IP_FREEBIND, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)
    listener.setblocking(False)
    return listener
