"""Async client for the Cua computer-server that runs in every sandbox.

Protocol (cua-computer-server 0.3.x): ``POST /cmd`` with ``{"command", "params"}``; the
reply is HTTP 200 with exactly one ``data: {json}`` line, ``{"success": true, ...}`` or
``{"success": false, "error"}``; an unknown command or a bad body is HTTP 400 ``{"detail"}``. PTY sessions
use the ``/pty`` routes. Everything here is strict: a failure reply, an HTTP error or a reply without the
``data: `` prefix raises :class:`ComputerServerError` with one line naming the endpoint, the command and the
server's message.

Retries: only idempotent reads are retried on a transport error. A command whose request may have reached the
server is never retried (running ``rm`` or ``type_text`` twice is worse than failing once); a connection that
could not be opened at all is retried for every command, since nothing was sent.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import itertools
import json
import math
import re
import shlex
from types import TracebackType
from typing import Any, Final, Literal, Self

import httpx

from ale_iac.contract import ENDPOINT_TOKEN_ENV
from ale_iac.sandbox.keys import normalize_key, normalize_keys
from ale_iac.sandbox.protocol import (
    CommandResult,
    ComputerServerError,
    PtyOutput,
    ServerUnreachableError,
    ServerVersion,
    UnsupportedServerError,
)
from ale_iac.sandbox.pty import PtySession

MouseButton = Literal["left", "right", "middle"]
ScrollDirection = Literal["up", "down", "left", "right"]

BUTTONS: Final = ("left", "right", "middle")
DIRECTIONS: Final = ("up", "down", "left", "right")

_SUPPORTED_PACKAGE = re.compile(r"^0\.3\.\d+$")
_SUPPORTED_PROTOCOL: Final = 1

DEFAULT_TIMEOUT_S: Final = 30.0
"""HTTP timeout of one ``/cmd`` call that is not a shell command."""
COMMAND_HEADROOM_S: Final = 30.0
"""Added to a shell command's own timeout to get the HTTP timeout: the server kills the command first."""
FILE_CHUNK_BYTES: Final = 512 * 1024
"""Binary reads and writes move in pieces of this size (one ``/cmd`` each, base64 in JSON)."""
PTY_BUFFER_BYTES: Final = 2_000_000
"""PTY output kept per session between reads; the oldest output is dropped beyond it (and counted)."""
PTY_READ_BYTES: Final = 1_000_000
"""Default cap of one :meth:`ComputerServerClient.pty_read`; the rest stays buffered for the next read."""
PTY_SETTLE_MS: Final = 50
"""A PTY read that got output returns once the output has paused this long."""
_READ_RETRIES: Final = 3
_RETRY_BACKOFF_S: Final = (0.1, 0.4)


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


# ----------------------------------------------------------------------------------------------------
# The client
# ----------------------------------------------------------------------------------------------------


class ComputerServerClient:
    """One computer-server endpoint, over a keep-alive ``httpx.AsyncClient``.

    Use ``async with ComputerServerClient(url) as c:`` or call :meth:`aclose`. Safe for concurrent use
    from one event loop. Bad arguments raise ``ValueError`` before anything is sent.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        connect_timeout: float = 5.0,
        token: str | None = None,
        trust_env: bool = False,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """``token``: the bearer token the endpoint requires (sandboxes ale-iac starts have one)."""
        if not endpoint.startswith(("http://", "https://")):
            raise ValueError(f"computer-server endpoint must be an http(s) URL, got {endpoint!r}")
        self.endpoint = endpoint.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        # uvicorn closes idle keep-alive connections after 5 s; expiring ours first avoids reusing a
        # socket the server is closing, which would fail a non-idempotent command it never received.
        self._http = httpx.AsyncClient(
            base_url=self.endpoint,
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=httpx.Limits(max_keepalive_connections=8, keepalive_expiry=4.0),
            trust_env=trust_env,  # sandboxes sit on loopback or allow-listed addresses: never through a proxy
            transport=transport,
            headers=headers,
        )
        self._ptys: dict[int, PtySession] = {}
        self._os_type: str | None = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop PTY stream readers (the PTYs themselves keep running on the server) and close connections."""
        tasks = [s.task for s in self._ptys.values() if s.task is not None]
        self._ptys.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._http.aclose()

    # -- transport -------------------------------------------------------------------------------------------

    def _timeout_for(self, read: float | None) -> httpx.Timeout:
        return httpx.Timeout(self._timeout, connect=self._connect_timeout, read=read)

    async def _send(
        self,
        command: str,
        method: str,
        path: str,
        *,
        body: Any = None,
        idempotent: bool,
        timeout: httpx.Timeout | None = None,
    ) -> httpx.Response:
        # A connection that could not be opened sent nothing, so that case is retried for any command.
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._http.request(
                    method,
                    path,
                    json=body,
                    timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
                )
            except httpx.TransportError as exc:
                retryable = idempotent or isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
                if not retryable or attempt >= _READ_RETRIES:
                    raise ServerUnreachableError(self.endpoint, command, _describe(exc)) from exc
            await asyncio.sleep(_RETRY_BACKOFF_S[min(attempt - 1, len(_RETRY_BACKOFF_S) - 1)])

    async def _request(
        self,
        command: str,
        params: dict[str, Any] | None = None,
        *,
        idempotent: bool = False,
        read_timeout: float | Literal["default"] | None = "default",
    ) -> dict[str, Any]:
        """Send one ``/cmd`` and return its JSON payload, ``success`` included (false is not raised here)."""
        timeout = None if read_timeout == "default" else self._timeout_for(read_timeout)
        response = await self._send(
            command,
            "POST",
            "/cmd",
            body={"command": command, "params": params or {}},
            idempotent=idempotent,
            timeout=timeout,
        )
        if response.status_code != 200:
            raise ComputerServerError(self.endpoint, command, _http_error(response))
        text = response.text.lstrip("\ufeff")
        if not text.startswith("data: "):
            raise ComputerServerError(self.endpoint, command, f"reply is not a 'data: ' line: {text[:120]!r}")
        line = text[len("data: ") :].split("\n", 1)[0]
        try:
            payload = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ComputerServerError(self.endpoint, command, f"reply is not JSON: {exc}") from exc
        if not isinstance(payload, dict) or "success" not in payload:
            raise ComputerServerError(self.endpoint, command, f"reply has no 'success' field: {line[:120]!r}")
        return payload

    async def _cmd(
        self,
        command: str,
        params: dict[str, Any] | None = None,
        *,
        idempotent: bool = False,
        read_timeout: float | Literal["default"] | None = "default",
    ) -> dict[str, Any]:
        """Send one ``/cmd``; raise :class:`ComputerServerError` unless it succeeded."""
        payload = await self._request(command, params, idempotent=idempotent, read_timeout=read_timeout)
        if payload.get("success") is not True:
            message = payload.get("error") or payload.get("message") or "the server reported failure without a message"
            raise ComputerServerError(self.endpoint, command, str(message))
        return payload

    def _field(self, command: str, payload: dict[str, Any], key: str) -> Any:
        if key not in payload:
            raise ComputerServerError(self.endpoint, command, f"reply has no {key!r} field")
        return payload[key]

    # -- server ----------------------------------------------------------------------------------------------

    async def status(self) -> dict[str, Any]:
        """``GET /status``: ``{"status": "ok", "os_type": ..., "features": [...]}``."""
        response = await self._send("status", "GET", "/status", idempotent=True)
        if response.status_code != 200:
            raise ComputerServerError(self.endpoint, "status", _http_error(response))
        try:
            data = response.json()
        except ValueError as exc:
            raise ComputerServerError(self.endpoint, "status", f"reply is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ComputerServerError(self.endpoint, "status", f"reply is not an object: {data!r}")
        if isinstance(data.get("os_type"), str):
            self._os_type = data["os_type"]
        return data

    async def version(self) -> ServerVersion:
        payload = await self._cmd("version", idempotent=True)
        try:
            return ServerVersion(package=str(payload["package"]), protocol=int(payload["protocol"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ComputerServerError(self.endpoint, "version", f"malformed version reply: {payload!r}") from exc

    async def check_version(self) -> ServerVersion:
        """Return the server's version, or raise :class:`UnsupportedServerError` for one we do not support.

        0.1.x is refused on purpose: it has no ``run_command`` timeout, no PTY routes and no
        ``scroll_direction``, which the bridges' contract needs.
        """
        version = await self.version()
        if version.protocol != _SUPPORTED_PROTOCOL or not _SUPPORTED_PACKAGE.match(version.package):
            reason = ""
            if version.package.startswith("0.1."):
                reason = "0.1.x has no command timeouts, PTY sessions or directional scroll"
            raise UnsupportedServerError(self.endpoint, version, reason)
        return version

    async def os_type(self) -> str:
        """The server's OS (``linux``, ``windows``, ``darwin``), from ``/status``, fetched once."""
        if self._os_type is None:
            await self.status()
        return self._os_type or "linux"

    # -- shell -----------------------------------------------------------------------------------------------

    async def run_command(self, command: str, timeout: float | None = None) -> CommandResult:
        """Run ``command`` with the server's shell and wait for it.

        With ``timeout`` (seconds) the server kills the command when it expires and the result has
        ``timed_out=True``, exit code -1. Without it the command may run as long as it likes, and so
        may this call.
        """
        params: dict[str, Any] = {"command": command}
        read_timeout: float | None = None
        if timeout is not None:
            if not math.isfinite(timeout) or timeout <= 0:
                raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
            params["timeout"] = timeout
            read_timeout = timeout + COMMAND_HEADROOM_S
        payload = await self._request("run_command", params, read_timeout=read_timeout)
        stderr = str(payload.get("stderr") or "")
        if payload.get("success") is not True:
            stdout = str(payload.get("stdout") or "")
            if payload.get("return_code") == -1 and stderr.startswith("Command timed out"):
                return CommandResult(exit_code=-1, stdout=stdout, stderr=stderr, timed_out=True)
            if timeout is not None and not payload.get("error") and "return_code" not in payload:
                # 0.3.46 at its timeout kills the shell; if the shell had already exited (the output pipes
                # were held open by a process it left running), kill() raises and the reply is an empty error.
                note = f"Command timed out after {timeout}s: its output stayed open (a background process?)"
                return CommandResult(exit_code=-1, stdout=stdout, stderr=note, timed_out=True)
            message = payload.get("error") or stderr or "the server reported failure without a message"
            raise ComputerServerError(self.endpoint, "run_command", str(message))
        code = payload.get("return_code")
        return CommandResult(
            exit_code=int(code) if code is not None else 0,
            stdout=str(payload.get("stdout") or ""),
            stderr=stderr,
        )

    # -- files -----------------------------------------------------------------------------------------------

    async def read_text(self, path: str) -> str:
        payload = await self._cmd("read_text", {"path": path}, idempotent=True)
        return str(self._field("read_text", payload, "content"))

    async def write_text(self, path: str, content: str) -> None:
        await self._cmd("write_text", {"path": path, "content": content})

    async def _read_piece(self, path: str, offset: int, length: int) -> bytes:
        payload = await self._cmd("read_bytes", {"path": path, "offset": offset, "length": length}, idempotent=True)
        encoded = self._field("read_bytes", payload, "content_b64")
        try:
            return base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError, TypeError) as exc:
            raise ComputerServerError(self.endpoint, "read_bytes", f"reply is not base64: {exc}") from exc

    async def read_bytes(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        """Read ``length`` bytes (default: to the end) from ``offset``, in :data:`FILE_CHUNK_BYTES` pieces."""
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        if length is not None and length < 0:
            raise ValueError(f"length must be >= 0, got {length}")
        out = bytearray()
        while length is None or len(out) < length:
            want = FILE_CHUNK_BYTES if length is None else min(FILE_CHUNK_BYTES, length - len(out))
            piece = await self._read_piece(path, offset + len(out), want)
            out += piece
            if len(piece) < want:
                break
        return bytes(out)

    async def write_bytes(self, path: str, data: bytes, append: bool = False) -> None:
        """Write (or append) ``data``; large data goes in appended pieces so any size arrives byte-exact.

        Not atomic: if a later piece fails, the file holds the pieces before it (the error names the offset).
        """
        view = memoryview(data)
        offset = 0
        while True:
            piece = view[offset : offset + FILE_CHUNK_BYTES]
            params = {
                "path": path,
                "content_b64": base64.b64encode(piece).decode("ascii"),
                "append": append or offset > 0,
            }
            try:
                await self._cmd("write_bytes", params)
            except ComputerServerError as exc:
                if offset == 0:
                    raise
                raise ComputerServerError(
                    self.endpoint, "write_bytes", f"{exc.message} (after {offset} of {len(data)} bytes)"
                ) from exc
            offset += len(piece)
            if offset >= len(data):
                return

    async def file_size(self, path: str) -> int:
        payload = await self._cmd("get_file_size", {"path": path}, idempotent=True)
        return int(self._field("get_file_size", payload, "size"))

    async def file_exists(self, path: str) -> bool:
        payload = await self._cmd("file_exists", {"path": path}, idempotent=True)
        return bool(self._field("file_exists", payload, "exists"))

    async def dir_exists(self, path: str) -> bool:
        payload = await self._cmd("directory_exists", {"path": path}, idempotent=True)
        return bool(self._field("directory_exists", payload, "exists"))

    async def list_dir(self, path: str) -> list[str]:
        payload = await self._cmd("list_dir", {"path": path}, idempotent=True)
        return [str(name) for name in self._field("list_dir", payload, "files")]

    async def make_dir(self, path: str) -> None:
        """``mkdir -p``."""
        await self._cmd("create_dir", {"path": path})

    async def delete_file(self, path: str) -> None:
        await self._cmd("delete_file", {"path": path})

    async def delete_dir(self, path: str) -> None:
        """Remove an empty directory (the server refuses one that is not empty)."""
        await self._cmd("delete_dir", {"path": path})

    # -- clipboard -------------------------------------------------------------------------------------------

    async def get_clipboard(self) -> str:
        # The server's ``copy_to_clipboard`` *reads* the clipboard (the name is backwards).
        payload = await self._cmd("copy_to_clipboard", idempotent=True)
        return str(payload.get("content") or "")

    async def set_clipboard(self, text: str) -> None:
        await self._cmd("set_clipboard", {"text": text})

    # -- screen ----------------------------------------------------------------------------------------------

    async def screen_size(self) -> tuple[int, int]:
        payload = await self._cmd("get_screen_size", idempotent=True)
        size = payload.get("size", payload)
        try:
            return int(size["width"]), int(size["height"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ComputerServerError(self.endpoint, "get_screen_size", f"malformed reply: {payload!r}") from exc

    async def cursor_position(self) -> tuple[int, int]:
        payload = await self._cmd("get_cursor_position", idempotent=True)
        pos = payload.get("position", payload)
        try:
            return int(pos["x"]), int(pos["y"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ComputerServerError(self.endpoint, "get_cursor_position", f"malformed reply: {payload!r}") from exc

    async def screenshot(self) -> bytes:
        """The whole screen as PNG bytes."""
        payload = await self._cmd("screenshot", {"format": "png"}, idempotent=True)
        encoded = self._field("screenshot", payload, "image_data")
        try:
            image = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError, TypeError) as exc:
            raise ComputerServerError(self.endpoint, "screenshot", f"image is not base64: {exc}") from exc
        if not image.startswith(b"\x89PNG\r\n\x1a\n"):
            raise ComputerServerError(self.endpoint, "screenshot", "image is not a PNG")
        return image

    # -- mouse -----------------------------------------------------------------------------------------------

    async def move_cursor(self, x: int, y: int) -> None:
        await self._cmd("move_cursor", {"x": int(x), "y": int(y)})

    async def click(
        self, x: int | None = None, y: int | None = None, button: MouseButton = "left", clicks: int = 1
    ) -> None:
        """Click ``clicks`` times (1 to 3) at ``(x, y)``, or where the cursor is when both are None."""
        _check_button(button)
        if clicks not in (1, 2, 3):
            raise ValueError(f"clicks must be 1, 2 or 3, got {clicks!r}")
        point = _point(x, y)
        # Separate clicks, not the server's ``double_click``: pynput's click(count=2) is not seen as a double
        # click by X clients such as xterm, while clicks a few milliseconds apart are.
        if point:
            await self.move_cursor(point["x"], point["y"])
        for _ in range(clicks):
            if button == "middle":  # the server has no middle_click command
                await self._cmd("mouse_down", {"button": "middle"})
                await self._cmd("mouse_up", {"button": "middle"})
            else:
                await self._cmd("left_click" if button == "left" else "right_click")

    async def mouse_down(self, button: MouseButton = "left", x: int | None = None, y: int | None = None) -> None:
        _check_button(button)
        await self._cmd("mouse_down", {"button": button, **_point(x, y)})

    async def mouse_up(self, button: MouseButton = "left", x: int | None = None, y: int | None = None) -> None:
        _check_button(button)
        await self._cmd("mouse_up", {"button": button, **_point(x, y)})

    async def drag(self, path: list[tuple[int, int]], button: MouseButton = "left", duration: float = 0.5) -> None:
        """Press at ``path[0]``, move through the points, release at the last one, over about ``duration`` s.

        Built from ``move_cursor``/``mouse_down``/``mouse_up`` rather than the server's ``drag``, which
        presses and releases per segment and ignores ``duration``. Intermediate points are interpolated so the
        application sees a stream of motion events, as from a real hand; the button is released even if a
        move fails.
        """
        _check_button(button)
        if len(path) < 2:
            raise ValueError("a drag path needs at least two points")
        if not math.isfinite(duration) or duration < 0:
            raise ValueError(f"duration must be >= 0 seconds, got {duration!r}")
        points = _interpolate(path, steps=max(len(path) - 1, min(int(duration * 40), 40)))
        pause = duration / (len(points) - 1)
        start = points[0]
        await self.move_cursor(*start)
        await self._cmd("mouse_down", {"button": button, "x": start[0], "y": start[1]})
        end = points[-1]
        try:
            for point in points[1:]:
                if pause:
                    await asyncio.sleep(pause)
                await self.move_cursor(*point)
        finally:
            await self._cmd("mouse_up", {"button": button, "x": end[0], "y": end[1]})

    async def scroll(self, direction: ScrollDirection, amount: int, x: int | None = None, y: int | None = None) -> None:
        """Scroll ``amount`` wheel clicks, first moving to ``(x, y)`` when given."""
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}")
        if amount < 1:
            raise ValueError(f"amount must be >= 1, got {amount!r}")
        point = _point(x, y)
        if point:
            await self.move_cursor(point["x"], point["y"])
        await self._cmd("scroll_direction", {"direction": direction, "clicks": int(amount)})

    # -- keyboard --------------------------------------------------------------------------------------------

    async def press_key(self, key: str) -> None:
        await self._cmd("press_key", {"key": normalize_key(key)})

    async def key_down(self, key: str) -> None:
        await self._cmd("key_down", {"key": normalize_key(key)})

    async def key_up(self, key: str) -> None:
        await self._cmd("key_up", {"key": normalize_key(key)})

    async def hotkey(self, keys: list[str]) -> None:
        """Press the keys in order, release in reverse (``["ctrl", "c"]``)."""
        await self._cmd("hotkey", {"keys": normalize_keys(keys)})

    async def type_text(self, text: str) -> None:
        """Type into the focused window (the server sends synthetic key events to it)."""
        await self._cmd("type_text", {"text": text})

    # -- PTY sessions ----------------------------------------------------------------------------------------

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
            "command": _PTY_GATE.format(command=shlex.quote(command)) if gated else command,
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
                    raise ComputerServerError(self.endpoint, "pty_stream", _http_error(r))
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
            error = _describe(exc)
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

    def _json_reply(self, command: str, response: httpx.Response) -> dict[str, Any]:
        if response.status_code != 200:
            raise ComputerServerError(self.endpoint, command, _http_error(response))
        try:
            data = response.json()
        except ValueError as exc:
            raise ComputerServerError(self.endpoint, command, f"reply is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ComputerServerError(self.endpoint, command, f"reply is not an object: {data!r}")
        return data


# ----------------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------------


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _http_error(response: httpx.Response) -> str:
    if response.status_code == 401:
        return (
            "HTTP 401: the endpoint refused the token (none given, or not this sandbox's); "
            f"use the sandbox's handle (--stack/--unit) or set {ENDPOINT_TOKEN_ENV}"
        )
    detail: Any = None
    try:
        body = response.json()
        detail = body.get("detail") if isinstance(body, dict) else body
    except ValueError:
        detail = response.text[:200]
    return f"HTTP {response.status_code}: {detail}" if detail else f"HTTP {response.status_code}"


def _check_button(button: str) -> None:
    if button not in BUTTONS:
        raise ValueError(f"button must be one of {', '.join(BUTTONS)}, got {button!r}")


def _point(x: int | None, y: int | None) -> dict[str, int]:
    if (x is None) != (y is None):
        raise ValueError("give both x and y, or neither")
    return {} if x is None or y is None else {"x": int(x), "y": int(y)}


def _interpolate(path: list[tuple[int, int]], steps: int) -> list[tuple[int, int]]:
    """``path`` resampled to ``steps`` segments spread over its corners by length (corners are kept)."""
    points = [(int(x), int(y)) for x, y in path]
    segments = list(itertools.pairwise(points))
    lengths = [math.dist(a, b) for a, b in segments]
    total = sum(lengths) or 1.0
    out = [points[0]]
    for (a, b), length in zip(segments, lengths, strict=True):
        n = max(1, round(steps * length / total))
        for i in range(1, n + 1):
            t = i / n
            out.append((round(a[0] + (b[0] - a[0]) * t), round(a[1] + (b[1] - a[1]) * t)))
    return out
