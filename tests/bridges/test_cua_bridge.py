"""The cua bridge through the real MCP client over stdio, against a real desktop.

Each action's effect is checked through the vm bridge, not through the cua bridge's own reply: focus with
``xdotool getwindowfocus``, typed text in a file the receiving xterm wrote, selections with ``xclip``,
pixels in screenshots. Return texts are compared with the forms of the tools seed, encoded below.
"""

from __future__ import annotations

import base64
import hashlib
import math
import shlex
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support import desktop
from tests.support.bridges import OPTIONAL, REQUIRED, Bridge, assert_matches_seed, sh
from tests.support.desktop import Window

pytestmark = pytest.mark.sandbox

# The seed's cua_mcp_server table: tool -> parameter -> REQUIRED, OPTIONAL or its default value.
SEED_CUA: dict[str, dict[str, Any]] = {
    "key": {"keys": REQUIRED},
    "key_down": {"keys": REQUIRED},
    "key_up": {"keys": REQUIRED},
    "hold_key": {"keys": REQUIRED, "duration": REQUIRED},
    "type": {"text": REQUIRED},
    "mouse_move": {"coordinate": REQUIRED},
    "click": {"coordinate": OPTIONAL, "button": "left", "clicks": 1},
    "drag": {"coordinate": REQUIRED, "start_coordinate": OPTIONAL, "button": "left"},
    "mouse_down": {"button": "left"},
    "mouse_up": {"button": "left"},
    "scroll": {"direction": REQUIRED, "amount": REQUIRED, "coordinate": OPTIONAL},
    "wait": {"duration": REQUIRED},
    "screenshot": {"save_path": OPTIONAL},
    "cursor_position": {},
    "get_screen_size": {},
}
SEED_CUA_STRUCTURED = {"get_screen_size": {"width", "height"}}

OpenWindow = Callable[..., Window]


@pytest.fixture(scope="module")
def screen(cua_bridge: Bridge) -> tuple[int, int]:
    result = cua_bridge.call("get_screen_size")
    assert result.structured_content is not None
    return int(result.structured_content["width"]), int(result.structured_content["height"])


@pytest.fixture
def open_window(vm_bridge: Bridge) -> Iterator[OpenWindow]:
    """Open xterms (closed after the test): ``open_window(script, geometry=...)``."""
    opened: list[Window] = []

    def open_(script: str, geometry: str = "60x8+40+40") -> Window:
        title = desktop.unique("xterm")
        window = desktop.parse_window(title, sh(vm_bridge, desktop.open_xterm(title, script, geometry)))
        opened.append(window)
        return window

    yield open_
    for window in opened:
        sh(vm_bridge, desktop.close_window(window.wid))


def norm(point: tuple[float, float], screen: tuple[int, int]) -> list[float]:
    return desktop.normalized((round(point[0]), round(point[1])), screen)


def label(coordinate: list[float]) -> str:
    """How the bridge prints a coordinate: like JavaScript prints numbers (``250`` not ``250.0``)."""
    return "[" + ", ".join(str(int(v)) if float(v).is_integer() else repr(float(v)) for v in coordinate) + "]"


def focus(vm: Bridge, cua: Bridge, window: Window, screen: tuple[int, int]) -> None:
    """Click a window and wait until the window manager has given it the focus."""
    at = norm(window.center, screen)
    assert cua.text("click", coordinate=at) == f"Clicked (left, 1x) at {label(at)}"
    assert sh(vm, desktop.wait_focus(window.wid)).strip() == window.wid


def cell(window: Window, col: float, row: float, cols: int = 60, rows: int = 8) -> tuple[float, float]:
    """Pixel centre of a character cell of an xterm (2 px inner border). A selection made with the mouse
    ends before the cell under the pointer: dragging from cell 0 to cell 12 selects 12 characters."""
    width, height = (window.width - 4) / cols, (window.height - 4) / rows
    return window.x + 2 + (col + 0.5) * width, window.y + 2 + (row + 0.5) * height


def primary(vm: Bridge, expected: str) -> str:
    """The PRIMARY selection once it is ``expected``, or what it is when the wait gives up."""
    return sh(vm, desktop.wait_primary(expected))


def test_tools_match_the_seed(cua_bridge: Bridge) -> None:
    assert_matches_seed(cua_bridge, SEED_CUA, SEED_CUA_STRUCTURED)


def test_get_screen_size_is_real_pixels(cua_bridge: Bridge, vm_bridge: Bridge, screen: tuple[int, int]) -> None:
    width, height = (int(v) for v in sh(vm_bridge, "xdotool getdisplaygeometry").split())
    assert screen == (width, height)
    assert cua_bridge.text("get_screen_size") == f"Screen size: {width}x{height}"


def test_mouse_move_and_cursor_position(cua_bridge: Bridge, vm_bridge: Bridge, screen: tuple[int, int]) -> None:
    assert cua_bridge.text("mouse_move", coordinate=[250, 750]) == "Moved cursor to [250, 750]"
    location = sh(vm_bridge, "xdotool getmouselocation --shell")
    assert f"X={round(screen[0] / 4)}\n" in location and f"Y={round(screen[1] * 3 / 4)}\n" in location
    assert cua_bridge.text("cursor_position") == "Cursor at [250, 750]"
    assert cua_bridge.text("mouse_move", coordinate=[1000, 0.5]) == "Moved cursor to [1000, 0.5]"
    location = sh(vm_bridge, "xdotool getmouselocation --shell")
    assert f"X={screen[0] - 1}\n" in location  # 1000 is the last column
    sh(vm_bridge, "xdotool mousemove 100 50")
    half_up = [math.floor(100 * 1000 / screen[0] + 0.5), math.floor(50 * 1000 / screen[1] + 0.5)]
    assert cua_bridge.text("cursor_position") == f"Cursor at [{half_up[0]}, {half_up[1]}]"


def test_click_moves_the_focus(
    cua_bridge: Bridge, vm_bridge: Bridge, open_window: OpenWindow, screen: tuple[int, int]
) -> None:
    first = open_window("read x", "40x5+40+40")
    second = open_window("read x", "40x5+600+300")
    focus(vm_bridge, cua_bridge, first, screen)
    focus(vm_bridge, cua_bridge, second, screen)
    assert cua_bridge.text("mouse_move", coordinate=norm(first.center, screen)).startswith("Moved cursor to")
    assert cua_bridge.text("click") == "Clicked (left, 1x)"  # where the cursor is
    assert sh(vm_bridge, desktop.wait_focus(first.wid)).strip() == first.wid


def test_type_and_key_land_in_a_file(
    cua_bridge: Bridge, vm_bridge: Bridge, open_window: OpenWindow, screen: tuple[int, int]
) -> None:
    path = f"/tmp/{desktop.unique('typed')}"
    window = open_window(f'read x; printf "%s" "$x" > {path}')
    focus(vm_bridge, cua_bridge, window, screen)
    text = "héllo wörld 42"
    assert cua_bridge.text("type", text=text) == f'Typed: "{text}"'
    assert cua_bridge.text("key", keys=["Return"]) == "Pressed: enter"
    assert sh(vm_bridge, desktop.wait_file(path)) == text
    long_text = "x" * 60
    preview = cua_bridge.text("type", text=long_text)
    assert preview == f'Typed: "{"x" * 50}..."'
    sh(vm_bridge, f"rm -f {path}")


def test_chords_key_down_up_and_hold_key(
    cua_bridge: Bridge, vm_bridge: Bridge, open_window: OpenWindow, screen: tuple[int, int]
) -> None:
    path = f"/tmp/{desktop.unique('keys')}"
    window = open_window(f'read x; printf "%s" "$x" > {path}')
    focus(vm_bridge, cua_bridge, window, screen)
    cua_bridge.text("type", text="discarded")
    assert cua_bridge.text("key", keys=["ctrl", "u"]) == "Pressed: ctrl+u"  # the tty erases the line
    assert cua_bridge.text("key_down", keys=["Shift"]) == "Key down: shift"
    assert cua_bridge.text("key", keys=["a"]) == "Pressed: a"
    assert cua_bridge.text("key_up", keys=["shift"]) == "Key up: shift"
    started = time.monotonic()
    assert cua_bridge.text("hold_key", keys=["shift"], duration=0.3) == "Held shift for 0.3s"
    assert time.monotonic() - started >= 0.3
    assert cua_bridge.text("key", keys=["b"]) == "Pressed: b"  # shift is up again
    assert cua_bridge.text("key", keys=["KP_Enter"]) == "Pressed: enter"
    assert sh(vm_bridge, desktop.wait_file(path)) == "Ab"
    sh(vm_bridge, f"rm -f {path}")


def separate_gestures(cua: Bridge) -> None:
    """Let xterm's multi-click timer (250 ms) run out, so the next press starts a new gesture instead of
    extending the last one into a double or triple click. Nothing observable marks its end: it is time."""
    assert cua.text("wait", duration=0.3) == "Waited 0.3s"


def test_drag_double_and_triple_click_select_text(
    cua_bridge: Bridge, vm_bridge: Bridge, open_window: OpenWindow, screen: tuple[int, int]
) -> None:
    window = open_window("printf 'dragged-line\\nsecond line words here\\n'; read x")
    start, end = norm(cell(window, -0.4, 0), screen), norm(cell(window, 12, 0), screen)
    assert cua_bridge.text("drag", coordinate=end, start_coordinate=start) == (
        f"Dragged (left) from {label(start)} to {label(end)}"
    )
    assert primary(vm_bridge, "dragged-line") == "dragged-line"
    separate_gestures(cua_bridge)
    word = norm(cell(window, 13, 1), screen)  # inside "words"
    assert cua_bridge.text("click", coordinate=word, clicks=2) == f"Clicked (left, 2x) at {label(word)}"
    assert primary(vm_bridge, "words") == "words"
    separate_gestures(cua_bridge)
    assert cua_bridge.text("click", coordinate=word, clicks=3) == f"Clicked (left, 3x) at {label(word)}"
    assert primary(vm_bridge, "second line words here").rstrip("\n") == "second line words here"
    separate_gestures(cua_bridge)
    cua_bridge.text("mouse_move", coordinate=start)
    until = norm(cell(window, 6, 0), screen)  # xterm selects up to the cell under the pointer
    assert cua_bridge.text("drag", coordinate=until) == f"Dragged (left) from current to {label(until)}"
    assert primary(vm_bridge, "dragge") == "dragge"


def test_mouse_down_up_and_middle_click_paste(
    cua_bridge: Bridge, vm_bridge: Bridge, open_window: OpenWindow, screen: tuple[int, int]
) -> None:
    path = f"/tmp/{desktop.unique('pasted')}"
    window = open_window(f"printf 'held-selection\\n'; read x; printf '%s' \"$x\" > {path}")
    cua_bridge.text("mouse_move", coordinate=norm(cell(window, -0.4, 0), screen))
    assert cua_bridge.text("mouse_down") == "Mouse down: left"
    cua_bridge.text("mouse_move", coordinate=norm(cell(window, 14, 0), screen))
    assert cua_bridge.text("mouse_up", button="left") == "Mouse up: left"
    assert primary(vm_bridge, "held-selection") == "held-selection"
    separate_gestures(cua_bridge)
    at = norm(cell(window, 2, 2), screen)
    assert cua_bridge.text("click", coordinate=at, button="middle") == f"Clicked (middle, 1x) at {label(at)}"
    assert sh(vm_bridge, desktop.wait_focus(window.wid)).strip() == window.wid  # any press focuses
    cua_bridge.text("key", keys=["enter"])
    assert sh(vm_bridge, desktop.wait_file(path)) == "held-selection"
    assert cua_bridge.text("mouse_down", button="right") == "Mouse down: right"
    assert cua_bridge.text("mouse_up", button="right") == "Mouse up: right"
    sh(vm_bridge, f"rm -f {path}")


def screenshot_png(cua: Bridge, **arguments: Any) -> tuple[str, bytes]:
    result = cua.call("screenshot", **arguments)
    assert not result.is_error, result
    text, image = result.content
    assert text.type == "text" and image.type == "image" and image.mime_type == "image/png"
    return text.text, base64.b64decode(image.data)


def screen_once(cua: Bridge, shown: Callable[[bytes], bool], timeout: float = 10) -> bytes:
    """The first screenshot for which ``shown`` holds, or the last one when ``timeout`` runs out. xterm redraws
    after it has handled the input events, which on a loaded host can come after the bridge's call has returned
    (the call returns once the X server has the events)."""
    deadline = time.monotonic() + timeout
    while True:
        _, png = screenshot_png(cua)
        if shown(png) or time.monotonic() > deadline:
            return png


def settled_screen(cua: Bridge, timeout: float = 10) -> bytes:
    """A screenshot once two in a row are the same (the windows have finished drawing)."""
    previous: list[bytes] = []

    def same_as_previous(png: bytes) -> bool:
        settled = previous == [png]
        previous[:] = [png]
        return settled

    return screen_once(cua, same_as_previous, timeout)


def test_scroll_moves_xterm_scrollback(
    cua_bridge: Bridge, vm_bridge: Bridge, open_window: OpenWindow, screen: tuple[int, int]
) -> None:
    window = open_window("seq 1 300; read x", "40x10+100+100")
    at = norm(window.center, screen)
    focus(vm_bridge, cua_bridge, window, screen)
    before = settled_screen(cua_bridge)
    assert cua_bridge.text("scroll", direction="up", amount=5, coordinate=at) == f"Scrolled up 5 at {label(at)}"
    scrolled = screen_once(cua_bridge, lambda png: png != before)
    assert scrolled != before
    assert cua_bridge.text("scroll", direction="down", amount=5) == "Scrolled down 5"
    back = screen_once(cua_bridge, lambda png: png == before)
    assert back == before
    assert cua_bridge.text("scroll", direction="left", amount=1) == "Scrolled left 1"
    assert cua_bridge.text("scroll", direction="right", amount=1) == "Scrolled right 1"


def test_screenshot_is_a_png_of_the_screen_and_can_be_saved(
    cua_bridge: Bridge, vm_bridge: Bridge, screen: tuple[int, int]
) -> None:
    text, png = screenshot_png(cua_bridge)
    assert text == "Screenshot captured"
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert struct.unpack(">II", png[16:24]) == screen
    folder = f"/tmp/{desktop.unique('shots')}"
    sh(vm_bridge, f"mkdir -p {folder}")
    path = f"{folder}/screen.png"
    text, png = screenshot_png(cua_bridge, save_path=path)
    assert text == f"Screenshot captured and saved to {path}"
    assert sh(vm_bridge, f"sha256sum {shlex.quote(path)}").split()[0] == hashlib.sha256(png).hexdigest()
    sh(vm_bridge, f"rm -rf {folder}")


def test_wait(cua_bridge: Bridge) -> None:
    started = time.monotonic()
    assert cua_bridge.text("wait", duration=0.25) == "Waited 0.25s"
    assert time.monotonic() - started >= 0.25
    assert cua_bridge.text("wait", duration=0) == "Waited 0s"


INVALID_CALLS: list[tuple[str, dict[str, Any], str]] = [
    ("mouse_move", {"coordinate": [1001, 10]}, "coordinate [1001, 10] is outside [0, 1000]"),
    ("click", {"coordinate": [-1, 10]}, "coordinate [-1, 10] is outside [0, 1000]"),
    ("drag", {"coordinate": [10, 10], "start_coordinate": [10, 2000]}, "start_coordinate [10, 2000] is outside"),
    ("scroll", {"direction": "up", "amount": 1, "coordinate": [5]}, "coordinate must be [x, y]"),
    ("click", {"clicks": 0}, "invalid argument clicks"),
    ("click", {"clicks": 4}, "invalid argument clicks"),
    ("click", {"button": "side"}, "invalid argument button"),
    ("mouse_down", {"button": "back"}, "invalid argument button"),
    ("scroll", {"direction": "diagonal", "amount": 1}, "invalid argument direction"),
    ("scroll", {"direction": "up", "amount": 0}, "invalid argument amount"),
    ("key", {"keys": ["notakey"]}, "unknown key name 'notakey'"),
    ("key_down", {"keys": ["ctrl", "hyper"]}, "unknown key name 'hyper'"),
    ("key", {"keys": []}, "invalid argument keys"),
    ("hold_key", {"keys": ["shift"], "duration": -1}, "invalid argument duration"),
    ("wait", {"duration": 100000}, "invalid argument duration"),
    ("screenshot", {"save_path": "relative.png"}, "save_path must be an absolute file path"),
    ("screenshot", {"save_path": "/nonexistent-dir/s.png"}, "/nonexistent-dir does not exist"),
    ("click", {"coordinates": [5, 5]}, "unknown argument 'coordinates'"),
    ("type", {}, "missing required argument 'text'"),
]


@pytest.mark.parametrize(("tool", "arguments", "expected"), INVALID_CALLS, ids=[c[2][:40] for c in INVALID_CALLS])
def test_invalid_arguments_are_tool_errors_and_the_bridge_keeps_serving(
    cua_bridge: Bridge, tool: str, arguments: dict[str, Any], expected: str
) -> None:
    message = cua_bridge.error(tool, **arguments)
    assert message.startswith(f"Error executing tool {tool}: ")
    assert expected in message
    assert cua_bridge.text("cursor_position").startswith("Cursor at [")
