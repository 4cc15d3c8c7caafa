"""What the scripted model server and the model gateway share: an asyncio loop in a daemon thread,
uvicorn listeners on it, and a few plain ASGI helpers.

A listener's socket is bound and listening before ``uvicorn.Server.serve(sockets=[...])`` starts on
the loop, so it is ready as soon as :func:`bind_tcp` / :func:`bind_unix` return: the kernel queues
connections until the loop accepts them. ``serve`` runs in the loop's own (non-main) thread, where
uvicorn's ``capture_signals`` does nothing (it checks ``threading.main_thread()``), so no signal
handler of the process is ever touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import stat
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import uvicorn

from ale_iac.errors import AleIacError
from ale_iac.files import unix_address

T = TypeVar("T")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

HOST: Final = "127.0.0.1"
BODY_LIMIT: Final = 100 * 1024 * 1024
"""Largest request body accepted (a long conversation full of screenshots stays well below it)."""
SHUTDOWN_GRACE_S: Final = 2.0
"""How long a stopping listener waits for responses still being written before cancelling them."""


class AbortConnection(Exception):  # noqa: N818 (not an error: a request to cut the connection)
    """Raised by an app to close its connection at once, mid-response: uvicorn closes the transport,
    so the client sees a truncated response rather than a clean end. Not logged."""


class _QuietAbort(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], AbortConnection))


_QUIET_ABORT: Final = _QuietAbort()


class LoopStoppedError(RuntimeError):
    """A call to a :class:`LoopThread` that is stopping or stopped."""


class LoopThread:
    """An asyncio event loop running in its own daemon thread, driven from other threads."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
            pending = [task for task in asyncio.all_tasks(self._loop) if not task.done()]
            for task in pending:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.run_until_complete(self._loop.shutdown_default_executor())
        finally:
            self._loop.close()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (from any thread but the loop's own).
        Raises :class:`LoopStoppedError` once :meth:`stop` has begun (a call already submitted by then
        completes, or is cancelled: ``concurrent.futures.CancelledError``)."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("a blocking call from the loop's own thread would deadlock")
        with self._lock:
            if self._stopped:
                coro.close()
                raise LoopStoppedError("the event loop is stopped")
            # Submitted before any stop request: the loop runs it (or cancels it) before it ends.
            future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout)

    def stop(self) -> None:
        """Stop the loop (tasks still pending are cancelled) and join its thread. Idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()


def bind_tcp(port: int = 0) -> socket.socket:
    """A listening TCP socket on 127.0.0.1:``port`` (0: an ephemeral port)."""
    if not 0 <= port <= 65535:
        raise AleIacError(f"port must be in 0..65535, got {port}")
    # IPPROTO_TCP given explicitly: asyncio sets TCP_NODELAY on accepted sockets only when their proto
    # says TCP, and a socket made with proto 0 does not; with Nagle on, each small SSE event after the
    # first can wait ~40 ms for the client's delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((HOST, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise AleIacError(f"cannot listen on {HOST}:{port}: {exc.strerror or exc}") from None
    sock.setblocking(False)
    return sock


@dataclass(frozen=True)
class UnixSocketFile:
    """A socket file we created: removed only while it is still ours (same device and inode)."""

    path: Path
    dev: int
    ino: int

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            info = os.lstat(self.path)
            if (info.st_dev, info.st_ino) == (self.dev, self.ino):
                self.path.unlink()


def bind_unix(path: Path) -> tuple[socket.socket, UnixSocketFile]:
    """A listening Unix socket at ``path``, mode 0600 before it accepts anything; a stale socket file
    there is replaced, anything else is an error."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(info.st_mode):
            raise AleIacError(f"{path} exists and is not a socket: not replacing it")
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with unix_address(path) as address:  # a path longer than sun_path holds, too
            sock.bind(address)
        os.chmod(path, 0o600)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise AleIacError(f"cannot listen on {path}: {exc.strerror or exc}") from None
    sock.setblocking(False)
    info = os.lstat(path)
    return sock, UnixSocketFile(path, info.st_dev, info.st_ino)


class Listener:
    """One uvicorn server (HTTP/1.1, h11) serving ``app`` on one listening socket. Create it on the loop."""

    def __init__(self, app: App, sock: socket.socket) -> None:
        logging.getLogger("uvicorn.error").addFilter(_QUIET_ABORT)  # a set: adding it twice is a no-op
        config = uvicorn.Config(
            app,
            http="h11",
            ws="none",
            lifespan="off",
            interface="asgi3",
            log_config=None,
            log_level="warning",
            access_log=False,
            proxy_headers=False,
            server_header=False,
            timeout_graceful_shutdown=int(SHUTDOWN_GRACE_S),
        )
        self._server = uvicorn.Server(config)
        self._sock = sock
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[sock]))

    def request_stop(self) -> None:
        """Stop accepting; the server winds down on its own (within about 0.2 s). Idempotent."""
        if not self._server.should_exit:
            self._server.should_exit = True

    async def stopped(self) -> None:
        """Stop and wait until the listener is closed and its connections are gone."""
        self.request_stop()
        with contextlib.suppress(asyncio.CancelledError, SystemExit):
            await self._task
        self._sock.close()


async def first_of(*aws: Awaitable[Any]) -> int:
    """Wait for the first of ``aws`` to finish; cancel the others; return the index of the winner
    (its exception, if any, is raised)."""
    tasks = [asyncio.ensure_future(aw) for aw in aws]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    winner = next(i for i, task in enumerate(tasks) if task in done)
    tasks[winner].result()
    return winner


async def disconnected(receive: Receive) -> None:
    """Return once the client has gone (call only after the request body has been read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def read_body(receive: Receive, limit: int = BODY_LIMIT) -> bytes | None:
    """The request body, or None if it is larger than ``limit`` or the client went away."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def header_map(scope: Scope) -> dict[str, str]:
    """The request headers, names lower-cased (a repeated header keeps its last value)."""
    return {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope.get("headers", [])}


def _encode_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]


async def start_response(send: Send, status: int, headers: Iterable[tuple[str, str]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": _encode_headers(headers)})


async def send_chunk(send: Send, chunk: bytes) -> None:
    await send({"type": "http.response.body", "body": chunk, "more_body": True})


async def end_response(send: Send) -> None:
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def send_bytes(
    send: Send, status: int, body: bytes, content_type: str, extra: Iterable[tuple[str, str]] = ()
) -> None:
    headers = [("content-type", content_type), ("content-length", str(len(body))), *extra]
    await start_response(send, status, headers)
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_json(send: Send, status: int, payload: Any, extra: Iterable[tuple[str, str]] = ()) -> None:
    await send_bytes(send, status, json.dumps(payload).encode(), "application/json", extra)


def sse(event: str, data: Any) -> bytes:
    """One server-sent event."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
