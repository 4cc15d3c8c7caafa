"""PTY sessions on the computer-server (``/pty`` routes). The server's output stream is push-only, so what it
sends is buffered here until read (bounded: the oldest output is dropped beyond the limit, and counted)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import shlex
from collections import deque
from typing import Any, Final

from ale_iac.sandbox.connection import ServerConnection, describe, http_error, with_env
from ale_iac.sandbox.protocol import ComputerServerError, PtyOutput, ServerUnreachableError

PTY_BUFFER_BYTES: Final = 2_000_000
"""PTY output kept per session between reads; the oldest output is dropped beyond it (and counted)."""
PTY_READ_BYTES: Final = 1_000_000
"""Default cap of one :meth:`ComputerServerClient.pty_read`; the rest stays buffered for the next read."""
PTY_SETTLE_MS: Final = 50
"""A PTY read that got output returns once the output has paused this long."""


class PtySession:
    """Output of one PTY as received from ``GET /pty/{pid}/stream``, buffered until read."""

    def __init__(self, pid: int, limit: int) -> None:
        self.pid = pid
        self.limit = limit
        self.chunks: deque[bytes] = deque()
        self.size = 0
        self.dropped = 0
        self.exited = False
        self.exit_code: int | None = None
        self.changed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def push(self, data: bytes) -> None:
        if not data:
            return
        self.chunks.append(data)
        self.size += len(data)
        while self.size > self.limit:
            head = self.chunks[0]
            excess = self.size - self.limit
            if len(head) <= excess:
                self.chunks.popleft()
                self.size -= len(head)
                self.dropped += len(head)
            else:
                self.chunks[0] = head[excess:]
                self.size -= excess
                self.dropped += excess
        self.changed.set()

    def finish(self, code: int | None) -> None:
        """The process exited with ``code``, or (None) the stream broke and its exit is unknown."""
        if not self.exited:
            self.exited = True
            self.exit_code = code
        self.changed.set()

    def drain(self, max_bytes: int) -> tuple[bytes, int]:
        out = bytearray()
        while self.chunks and len(out) < max_bytes:
            head = self.chunks.popleft()
            room = max_bytes - len(out)
            if len(head) > room:
                self.chunks.appendleft(head[room:])
                head = head[:room]
            out += head
            self.size -= len(head)
        dropped, self.dropped = self.dropped, 0
        return bytes(out), dropped


# The server runs a PTY command as ``/bin/sh -c COMMAND`` in a new session, and its output stream does not
# replay what was written before a subscriber attached. So on POSIX servers the command starts behind a
# gate: the shell first reads one line from the terminal; we subscribe, then send EOF (^D), which a
# canonical-mode tty delivers without echoing it, and the shell execs the real command. Nothing the command
# writes can be missed, and the pid stays the same. The gate also reopens the terminal by name so that it
# becomes the session's controlling terminal (the server's setsid leaves it without one): job control works
# and ^C, ^Z and ^\ sent with pty_write signal the foreground process, as in a real terminal.
_PTY_GATE = (
    '_ale_tty=$(tty 2>/dev/null) && [ -c "$_ale_tty" ] && exec 0<>"$_ale_tty" 1>&0 2>&0; '
    "read -r _ale_gate; exec /bin/sh -c {command}"
)
_PTY_RELEASE = b"\x04"


class PtyClient(ServerConnection):
    """The PTY sessions of one endpoint (the client's PTY commands)."""

    @functools.cached_property
    def _ptys(self) -> dict[int, PtySession]:
        return {}

    async def aclose(self) -> None:
        """Stop PTY stream readers (the PTYs themselves keep running on the server) and close connections."""
        tasks = [s.task for s in self._ptys.values() if s.task is not None]
        self._ptys.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await super().aclose()

    async def pty_start(
        self,
        command: str = "bash",
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        cols: int = 80,
        rows: int = 24,
    ) -> int:
        """Start ``command`` in a new PTY and return its pid; its output is buffered from the first byte."""
        if cols < 1 or rows < 1:
            raise ValueError(f"cols and rows must be >= 1, got {cols}x{rows}")
        gated = await self.os_type() != "windows"
        body: dict[str, Any] = {
            # The client's command_env as run_command has it (a POSIX shell's exports: none on Windows).
            "command": _PTY_GATE.format(command=shlex.quote(with_env(command, self.command_env))) if gated else command,
            "cols": cols,
            "rows": rows,
        }
        if cwd is not None:
            body["cwd"] = cwd
        if env:
            body["envs"] = dict(env)
        response = await self._send("pty_start", "POST", "/pty", body=body, idempotent=False)
        info = self._json_reply("pty_start", response)
        try:
            pid = int(info["pid"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ComputerServerError(self.endpoint, "pty_start", f"malformed reply: {info!r}") from exc
        session = PtySession(pid, PTY_BUFFER_BYTES)
        subscribed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        session.task = asyncio.create_task(self._pty_pump(session, subscribed), name=f"pty-stream-{pid}")
        self._ptys[pid] = session
        try:
            await subscribed
            if gated:
                await self._pty_stdin("pty_start", pid, _PTY_RELEASE)
        except BaseException:
            await self._forget_pty(pid)
            with contextlib.suppress(Exception):
                await self._send("pty_kill", "DELETE", f"/pty/{pid}", idempotent=False)
            raise
        return pid

    async def _pty_pump(self, session: PtySession, subscribed: asyncio.Future[None]) -> None:
        """Copy ``/pty/{pid}/stream`` events into the session buffer until the exit event."""
        error: str | None = "stream ended without an exit event"
        try:
            async with self._http.stream("GET", f"/pty/{session.pid}/stream", timeout=self._timeout_for(None)) as r:
                if r.status_code != 200:
                    await r.aread()
                    raise ComputerServerError(self.endpoint, "pty_stream", http_error(r))
                subscribed.set_result(None)
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    event = json.loads(line[len("data:") :].strip())
                    if event.get("type") == "output":
                        session.push(base64.b64decode(event.get("data", "")))
                    elif event.get("type") == "exit":
                        code = event.get("code")
                        session.finish(int(code) if code is not None else None)
                        error = None
                        return
        except asyncio.CancelledError:
            error = "stream closed"
            raise
        except Exception as exc:
            error = describe(exc)
            if not subscribed.done():
                wrapped = (
                    exc
                    if isinstance(exc, ComputerServerError)
                    else ServerUnreachableError(self.endpoint, "pty_stream", error)
                )
                subscribed.set_exception(wrapped)
        finally:
            if not subscribed.done():
                subscribed.set_exception(ComputerServerError(self.endpoint, "pty_stream", error or "no stream"))
            if error is not None:
                session.finish(None)

    def _session(self, command: str, pid: int) -> PtySession:
        session = self._ptys.get(pid)
        if session is None:
            raise ComputerServerError(self.endpoint, command, f"no PTY session with pid {pid}")
        return session

    def pty_sessions(self) -> list[int]:
        """Pids of the PTY sessions this client started and has not killed."""
        return list(self._ptys)

    async def _pty_stdin(self, command: str, pid: int, data: bytes) -> None:
        body = {"data": base64.b64encode(data).decode("ascii")}
        response = await self._send(command, "POST", f"/pty/{pid}/stdin", body=body, idempotent=False)
        self._json_reply(command, response)

    async def pty_write(self, pid: int, data: bytes) -> None:
        """Send raw bytes (control characters included) to the PTY's input."""
        self._session("pty_write", pid)
        await self._pty_stdin("pty_write", pid, data)

    async def pty_read(
        self, pid: int, timeout_ms: int = 2000, max_bytes: int = PTY_READ_BYTES, settle_ms: int = PTY_SETTLE_MS
    ) -> PtyOutput:
        """Output buffered since the last read.

        If there is none, wait up to ``timeout_ms`` for some (or for the exit). Once output flows, keep
        collecting until it pauses for ``settle_ms`` (a command's echo and its result usually arrive a few
        milliseconds apart), the process exits, ``max_bytes`` are buffered, or ``timeout_ms`` is up.
        """
        if timeout_ms < 0:
            raise ValueError(f"timeout_ms must be >= 0, got {timeout_ms}")
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        session = self._session("pty_read", pid)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while not session.exited and session.size < max_bytes:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            if session.chunks:
                if settle_ms <= 0:
                    break
                remaining = min(remaining, settle_ms / 1000)
            session.changed.clear()
            try:
                await asyncio.wait_for(session.changed.wait(), remaining)
            except TimeoutError:
                if session.chunks:
                    break
        data, dropped = session.drain(max_bytes)
        exited = session.exited and not session.chunks
        return PtyOutput(data=data, exited=exited, exit_code=session.exit_code if exited else None, dropped=dropped)

    async def pty_resize(self, pid: int, cols: int, rows: int) -> None:
        if cols < 1 or rows < 1:
            raise ValueError(f"cols and rows must be >= 1, got {cols}x{rows}")
        self._session("pty_resize", pid)
        response = await self._send(
            "pty_resize", "POST", f"/pty/{pid}/resize", body={"cols": cols, "rows": rows}, idempotent=False
        )
        self._json_reply("pty_resize", response)

    async def pty_kill(self, pid: int) -> bool:
        """Kill the PTY's process and forget the session; True if the server delivered the signal."""
        self._session("pty_kill", pid)
        try:
            response = await self._send("pty_kill", "DELETE", f"/pty/{pid}", idempotent=False)
            reply = self._json_reply("pty_kill", response)
        finally:
            await self._forget_pty(pid)
        return bool(reply.get("killed", False))

    async def _forget_pty(self, pid: int) -> None:
        session = self._ptys.pop(pid, None)
        if session is not None and session.task is not None:
            session.task.cancel()
            await asyncio.gather(session.task, return_exceptions=True)
