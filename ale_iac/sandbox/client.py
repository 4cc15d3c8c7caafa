"""Async client for the Cua computer-server that runs in every sandbox: its commands (shell, files, clipboard,
screen, mouse, keyboard; PTY sessions from ``pty.PtyClient``) over one connection (``connection.ServerConnection``:
the protocol, its strict replies and when a command is retried).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import itertools
import math
from typing import Any, Final, Literal

from ale_iac.sandbox.connection import with_env
from ale_iac.sandbox.keys import normalize_key, normalize_keys
from ale_iac.sandbox.protocol import (
    CommandResult,
    ComputerServerError,
)
from ale_iac.sandbox.pty import PtyClient

MouseButton = Literal["left", "right", "middle"]
ScrollDirection = Literal["up", "down", "left", "right"]

BUTTONS: Final = ("left", "right", "middle")
DIRECTIONS: Final = ("up", "down", "left", "right")


COMMAND_HEADROOM_S: Final = 30.0
"""Added to a shell command's own timeout to get the HTTP timeout: the server kills the command first."""
FILE_CHUNK_BYTES: Final = 512 * 1024
"""Binary reads and writes move in pieces of this size (one ``/cmd`` each, base64 in JSON)."""
MULTI_CLICK_GAP_MS: Final = 40
"""The time between the clicks of a double or triple click, well inside an X client's multi-click window
(xterm's ``multiClickTime``: 250 ms)."""
XDOTOOL_BUTTONS: Final = {"left": 1, "middle": 2, "right": 3}
NOT_FOUND_EXIT: Final = 127
CLIPBOARD_SETTLE_S: Final = 5.0
"""How long ``set_clipboard`` waits for the clipboard to hold the text it was given (see there)."""
CLIPBOARD_POLL_S: Final = 0.02


# ----------------------------------------------------------------------------------------------------
# The client
# ----------------------------------------------------------------------------------------------------


class ComputerServerClient(PtyClient):
    """One computer-server endpoint, over a keep-alive ``httpx.AsyncClient``.

    Use ``async with ComputerServerClient(url) as c:`` or call :meth:`aclose`. Safe for concurrent use
    from one event loop. Bad arguments raise ``ValueError`` before anything is sent.
    """

    # -- shell -----------------------------------------------------------------------------------------------

    async def run_command(self, command: str, timeout: float | None = None) -> CommandResult:
        """Run ``command`` with the server's shell and wait for it.

        With ``timeout`` (seconds) the server kills the command when it expires and the result has
        ``timed_out=True``, exit code -1. Without it the command may run as long as it likes, and so
        may this call. The client's ``command_env`` is exported first (a unit's egress proxy variables).
        """
        params: dict[str, Any] = {"command": with_env(command, self.command_env)}
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
        """Put ``text`` on the clipboard; returns once a read of the clipboard gives it back.

        The server's ``set_clipboard`` (pyperclip, then ``xclip``) answers as soon as xclip's parent exits. xclip
        asks for the selection before it forks, but that request is still in Xlib's output buffer: the child
        flushes it later, from its event loop. A read in between sees the previous owner's text (seen: a write of
        ``<hello>`` read back as ``''``). So the write is complete only when the clipboard reads back what was
        written; an error after :data:`CLIPBOARD_SETTLE_S` without that."""
        await self._cmd("set_clipboard", {"text": text})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CLIPBOARD_SETTLE_S
        while (held := await self.get_clipboard()) != text:
            if loop.time() > deadline:
                raise ComputerServerError(
                    self.endpoint,
                    "set_clipboard",
                    f"the clipboard does not hold the text written {CLIPBOARD_SETTLE_S:.0f} s later "
                    f"(it holds {len(held)} characters, not {len(text)})",
                )
            await asyncio.sleep(CLIPBOARD_POLL_S)

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
        if point:
            await self.move_cursor(point["x"], point["y"])
        if clicks > 1 and await self._clicks_in_the_unit(button, clicks):
            return
        # Separate clicks, not the server's ``double_click``: pynput's click(count=2) is not seen as a double
        # click by X clients such as xterm, while clicks a few milliseconds apart are.
        for _ in range(clicks):
            if button == "middle":  # the server has no middle_click command
                await self._cmd("mouse_down", {"button": "middle"})
                await self._cmd("mouse_up", {"button": "middle"})
            else:
                await self._cmd("left_click" if button == "left" else "right_click")

    async def _clicks_in_the_unit(self, button: MouseButton, clicks: int) -> bool:
        """A double or triple click as one command run in the unit (``xdotool``, clicks ``MULTI_CLICK_GAP_MS``
        apart), so that the time between the clicks is the unit's own: one request per click puts the round
        trips to the server between them, which on a loaded host can exceed the X client's multi-click window.
        False where the unit has no ``xdotool`` (the caller then clicks request by request)."""
        command = f"xdotool click --repeat {clicks} --delay {MULTI_CLICK_GAP_MS} {XDOTOOL_BUTTONS[button]}"
        done = await self.run_command(command, timeout=30)
        if done.exit_code == NOT_FOUND_EXIT:
            return False
        if done.exit_code != 0:
            raise ComputerServerError(self.endpoint, "run_command", f"{command}: {done.stderr.strip()}")
        return True

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


# ----------------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------------


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
