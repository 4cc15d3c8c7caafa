"""Shell snippets that drive and inspect a sandbox's desktop from the inside (through ``run_command``).

The client and bridge tests check every GUI effect independently of the channel that caused it: windows
are found and measured with ``xdotool``, focus is read with ``xdotool getwindowfocus``, typed text is
checked in a file written by the program that received it, the clipboard is read with ``xclip``. Waits
are readiness loops inside the sandbox with a ``timeout``, never fixed sleeps.
"""

from __future__ import annotations

import shlex
import uuid
from dataclasses import dataclass

# xterm drops synthetic key events unless told otherwise, and the computer-server types with
# XSendEvent.
XTERM = "xterm -xrm 'XTerm*allowSendEvents: true'"


@dataclass(frozen=True)
class Window:
    wid: str
    title: str
    x: int
    y: int
    width: int
    height: int

    @property
    def center(self) -> tuple[int, int]:
        return self.x + self.width // 2, self.y + self.height // 2


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def open_xterm(title: str, script: str, geometry: str = "60x8+40+40") -> str:
    """Start an xterm titled ``title`` running ``sh -c script``; once it is mapped, print its id and geometry.

    The origin comes from moving the pointer to the window's (0, 0): ``xdotool getwindowgeometry`` counts
    the window manager's frame offset twice, so its X/Y are wrong under openbox.
    """
    name = shlex.quote("^" + title + "$")
    # xdotool search walks every window and gives up on the first one that vanishes under it (an
    # earlier test's window being torn down: BadWindow), so it is retried until this one shows.
    inner = (
        f'until w=$(xdotool search --onlyvisible --name {name} 2>/dev/null | head -n1) && [ -n "$w" ]; '
        "do sleep 0.05; done; echo $w"
    )
    find = f"timeout 15 sh -c {shlex.quote(inner)}"
    return (
        f"{XTERM} -T {shlex.quote(title)} -geometry {geometry} -e sh -c {shlex.quote(script)} "
        f">/dev/null 2>&1 & "
        f'w=$({find}) && [ -n "$w" ] && echo ID=$w && '
        f'xdotool getwindowgeometry --shell "$w" | grep -E "^(WIDTH|HEIGHT)=" && '
        f'xdotool mousemove --window "$w" 0 0 getmouselocation --shell | grep -E "^(X|Y)="'
    )


def parse_window(title: str, stdout: str) -> Window:
    fields = dict(line.split("=", 1) for line in stdout.split() if "=" in line)
    return Window(
        wid=fields["ID"],
        title=title,
        x=int(fields["X"]),
        y=int(fields["Y"]),
        width=int(fields["WIDTH"]),
        height=int(fields["HEIGHT"]),
    )


def wait_focus(wid: str, timeout: float = 10) -> str:
    """Wait until window ``wid`` has the input focus; print the focused window either way."""
    return (
        f"timeout {timeout} sh -c 'until [ \"$(xdotool getwindowfocus)\" = {wid} ]; do sleep 0.02; done'; "
        "xdotool getwindowfocus"
    )


def wait_file(path: str, timeout: float = 10) -> str:
    """Wait until ``path`` is non-empty, then print it."""
    quoted = shlex.quote(path)
    return f"timeout {timeout} sh -c 'until [ -s {quoted} ]; do sleep 0.02; done'; cat {quoted}"


def wait_primary(expected: str, timeout: float = 10) -> str:
    """Wait until the PRIMARY selection is ``expected`` (trailing newlines aside), then print it either way.

    xterm takes the selection when it handles the button release, which on a loaded host can come after
    the bridge's call has returned."""
    read = "xclip -o -selection primary 2>/dev/null"
    until = f'until [ "$({read})" = {shlex.quote(expected)} ]; do sleep 0.02; done'
    return f"timeout {timeout} sh -c {shlex.quote(until)}; {read}; true"


def close_window(wid: str, timeout: float = 10) -> str:
    """Kill the window's client and wait until the window is gone, so the next test's searches do
    not meet it half torn down."""
    return (
        f"xdotool windowkill {wid} 2>/dev/null; "
        f"timeout {timeout} sh -c 'while xdotool getwindowname {wid} >/dev/null 2>&1; do sleep 0.02; done'; true"
    )


def normalized(point: tuple[int, int], screen: tuple[int, int]) -> list[float]:
    """Pixels to the bridges' [0, 1000] space (exact, so scaling back lands on the same pixel)."""
    return [round(point[0] * 1000 / screen[0], 3), round(point[1] * 1000 / screen[1], 3)]
