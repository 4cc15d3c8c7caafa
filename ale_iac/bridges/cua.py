"""The cua bridge: the GUI of a sandbox (mouse, keyboard, scroll, screen) over MCP.

Coordinates are normalized to [0, 1000] on both axes and scaled to the real screen, whose size is fetched
once per bridge process. Every action returns a one-line confirmation; agents take a screenshot to see the
effect. Tool names, parameters, defaults and return texts are the contract of the MCP tools
specification (listed in docs/bridges.md and encoded as data in tests/bridges/).
"""

from __future__ import annotations

import asyncio
import base64
import re
from typing import Annotated, Literal

from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools.base import Tool
from mcp_types import CallToolResult, ImageContent, TextContent
from pydantic import BaseModel, Field

from ale_iac.bridges.common import (
    COORD_MAX,
    BridgeServer,
    BridgeState,
    ClientFactory,
    failing,
    fmt_coord,
    fmt_num,
    make_tool,
)
from ale_iac.sandbox.client import ComputerServerClient
from ale_iac.sandbox.keys import VALID_KEYS_HINT, normalize_keys

DRAG_SECONDS = 0.3
"""A drag moves through interpolated points over this long, so applications see real motion."""
TYPE_PREVIEW = 50

INSTRUCTIONS = (
    "Mouse, keyboard and screen of one sandbox desktop. Coordinates are [x, y] normalized to [0, 1000] on "
    "both axes ([0, 0] top left, [1000, 1000] bottom right). Actions return a one-line confirmation: take a "
    "screenshot to see their effect."
)


class ScreenSize(BaseModel):
    width: int = Field(description="Screen width in pixels.")
    height: int = Field(description="Screen height in pixels.")


_Axis = Annotated[float, Field(ge=0, le=COORD_MAX)]
Coordinate = Annotated[
    list[_Axis], Field(min_length=2, max_length=2, description="[x, y], each normalized to [0, 1000].")
]
Button = Literal["left", "right", "middle"]
Keys = Annotated[
    list[str], Field(min_length=1, description=f'Key names, e.g. ["ctrl", "c"]. Valid: {VALID_KEYS_HINT}.')
]
_ABSOLUTE = re.compile(r"^(/|[A-Za-z]:[\\/])")


def build_server(client_factory: ClientFactory) -> BridgeServer:
    """The cua bridge over the computer-server that ``client_factory`` connects to."""
    state = BridgeState(client_factory)
    tools = [*_key_tools(state), *_pointer_tools(state), *_button_tools(state), *_screen_tools(state)]
    return BridgeServer("ale-iac-cua", INSTRUCTIONS, tools)


def _keys_of(keys: list[str]) -> list[str]:
    try:
        return normalize_keys(keys)
    except ValueError as exc:
        raise ToolError(f"keys: {exc}") from exc


def _key_tools(state: BridgeState) -> list[Tool]:
    """The keyboard: key, key_down, key_up, hold_key and type."""

    async def key(keys: Keys) -> str:
        names = _keys_of(keys)
        async with failing(f"cannot press {'+'.join(names)}"):
            client = await state.client()
            if len(names) == 1:
                await client.press_key(names[0])
            else:
                await client.hotkey(names)
        return f"Pressed: {'+'.join(names)}"

    async def key_down(keys: Keys) -> str:
        names = _keys_of(keys)
        async with failing(f"cannot press down {'+'.join(names)}"):
            client = await state.client()
            for name in names:
                await client.key_down(name)
        return f"Key down: {'+'.join(names)}"

    async def key_up(keys: Keys) -> str:
        names = _keys_of(keys)
        async with failing(f"cannot release {'+'.join(names)}"):
            client = await state.client()
            for name in names:
                await client.key_up(name)
        return f"Key up: {'+'.join(names)}"

    async def hold_key(
        keys: Keys,
        duration: Annotated[float, Field(ge=0, le=60, description="Seconds to hold the keys down.")],
    ) -> str:
        names = _keys_of(keys)
        async with failing(f"cannot hold {'+'.join(names)}"):
            client = await state.client()
            pressed: list[str] = []
            try:
                for name in names:
                    await client.key_down(name)
                    pressed.append(name)
                await asyncio.sleep(duration)
            finally:
                # Released even when the call is cancelled, so no key stays stuck down.
                await asyncio.shield(_release(client, pressed))
        return f"Held {'+'.join(names)} for {fmt_num(duration)}s"

    async def type_(text: Annotated[str, Field(description="The text to type.")]) -> str:
        async with failing("cannot type"):
            await (await state.client()).type_text(text)
        preview = text[:TYPE_PREVIEW] + "..." if len(text) > TYPE_PREVIEW else text
        return f'Typed: "{preview}"'

    return [
        make_tool(key, "key", 'Press and release keys; several keys are a chord, e.g. ["ctrl", "c"].'),
        make_tool(key_down, "key_down", "Press keys down without releasing them (pair with key_up)."),
        make_tool(key_up, "key_up", "Release keys pressed with key_down."),
        make_tool(hold_key, "hold_key", "Hold keys down for duration seconds, then release them."),
        make_tool(type_, "type", "Type text into the focused window."),
    ]


def _pointer_tools(state: BridgeState) -> list[Tool]:
    """The mouse's moves: mouse_move, click and drag."""

    async def mouse_move(coordinate: Coordinate) -> str:
        async with failing(f"cannot move the cursor to {fmt_coord(coordinate)}"):
            x, y = await state.to_pixels(coordinate)
            await (await state.client()).move_cursor(x, y)
        return f"Moved cursor to {fmt_coord(coordinate)}"

    async def click(
        coordinate: Annotated[
            list[_Axis] | None,
            Field(min_length=2, max_length=2, description="[x, y] in [0, 1000]. Default: where the cursor is."),
        ] = None,
        button: Annotated[Button, Field(description="Mouse button.")] = "left",
        clicks: Annotated[Literal[1, 2, 3], Field(description="1 single, 2 double, 3 triple click.")] = 1,
    ) -> str:
        at = f" at {fmt_coord(coordinate)}" if coordinate is not None else ""
        async with failing(f"cannot click{at}"):
            x, y = await state.to_pixels(coordinate) if coordinate is not None else (None, None)
            await (await state.client()).click(x, y, button=button, clicks=clicks)
        return f"Clicked ({button}, {clicks}x){at}"

    async def drag(
        coordinate: Annotated[
            list[_Axis], Field(min_length=2, max_length=2, description="Where to release: [x, y] in [0, 1000].")
        ],
        start_coordinate: Annotated[
            list[_Axis] | None,
            Field(min_length=2, max_length=2, description="Where to press: [x, y]. Default: where the cursor is."),
        ] = None,
        button: Annotated[Button, Field(description="Mouse button held during the drag.")] = "left",
    ) -> str:
        start = fmt_coord(start_coordinate) if start_coordinate is not None else "current"
        async with failing(f"cannot drag from {start} to {fmt_coord(coordinate)}"):
            client = await state.client()
            begin = (
                await state.to_pixels(start_coordinate)
                if start_coordinate is not None
                else await client.cursor_position()
            )
            end = await state.to_pixels(coordinate)
            await client.drag([begin, end], button=button, duration=DRAG_SECONDS)
        return f"Dragged ({button}) from {start} to {fmt_coord(coordinate)}"

    return [
        make_tool(mouse_move, "mouse_move", "Move the mouse cursor to a coordinate."),
        make_tool(click, "click", "Click a mouse button (1 to 3 times) at a coordinate, or where the cursor is."),
        make_tool(
            drag,
            "drag",
            "Press a mouse button at start_coordinate (default: where the cursor is), move to coordinate, release.",
        ),
    ]


def _button_tools(state: BridgeState) -> list[Tool]:
    """The mouse's buttons and wheel: mouse_down, mouse_up and scroll."""

    async def mouse_down(button: Annotated[Button, Field(description="Mouse button to press.")] = "left") -> str:
        async with failing(f"cannot press the {button} button"):
            await (await state.client()).mouse_down(button)
        return f"Mouse down: {button}"

    async def mouse_up(button: Annotated[Button, Field(description="Mouse button to release.")] = "left") -> str:
        async with failing(f"cannot release the {button} button"):
            await (await state.client()).mouse_up(button)
        return f"Mouse up: {button}"

    async def scroll(
        direction: Annotated[Literal["up", "down", "left", "right"], Field(description="Scroll direction.")],
        amount: Annotated[int, Field(ge=1, le=1000, description="Wheel clicks to scroll.")],
        coordinate: Annotated[
            list[_Axis] | None,
            Field(min_length=2, max_length=2, description="Move here first: [x, y]. Default: where the cursor is."),
        ] = None,
    ) -> str:
        at = f" at {fmt_coord(coordinate)}" if coordinate is not None else ""
        async with failing(f"cannot scroll {direction}{at}"):
            x, y = await state.to_pixels(coordinate) if coordinate is not None else (None, None)
            await (await state.client()).scroll(direction, amount, x, y)
        return f"Scrolled {direction} {amount}{at}"

    return [
        make_tool(mouse_down, "mouse_down", "Press a mouse button where the cursor is, without releasing."),
        make_tool(mouse_up, "mouse_up", "Release a mouse button where the cursor is."),
        make_tool(scroll, "scroll", "Scroll the mouse wheel, optionally at a coordinate."),
    ]


def _screen_tools(state: BridgeState) -> list[Tool]:
    """Waiting for the screen and looking at it: wait, screenshot, cursor_position and get_screen_size."""

    async def wait(duration: Annotated[float, Field(ge=0, le=600, description="Seconds to wait.")]) -> str:
        await asyncio.sleep(duration)
        return f"Waited {fmt_num(duration)}s"

    async def screenshot(
        save_path: Annotated[
            str | None, Field(description="Also save the PNG at this absolute path in the sandbox.")
        ] = None,
    ) -> list[TextContent | ImageContent]:
        png = await _screenshot_png(state, save_path)
        text = "Screenshot captured" + (f" and saved to {save_path}" if save_path is not None else "")
        return [
            TextContent(type="text", text=text),
            ImageContent(type="image", data=base64.b64encode(png).decode("ascii"), mime_type="image/png"),
        ]

    async def cursor_position() -> str:
        async with failing("cannot read the cursor position"):
            x, y = await (await state.client()).cursor_position()
            nx, ny = await state.to_normalized(x, y)
        return f"Cursor at [{nx}, {ny}]"

    async def get_screen_size() -> Annotated[CallToolResult, ScreenSize]:
        async with failing("cannot read the screen size"):
            width, height = await state.screen_size()
        return CallToolResult(
            content=[TextContent(type="text", text=f"Screen size: {width}x{height}")],
            structured_content={"width": width, "height": height},
        )

    return [
        make_tool(wait, "wait", "Wait for duration seconds (for example for an application to respond)."),
        make_tool(
            screenshot,
            "screenshot",
            "Capture the whole screen as a PNG image; with save_path, also save it in the sandbox.",
        ),
        make_tool(cursor_position, "cursor_position", "Return the cursor position, normalized to [0, 1000]."),
        make_tool(
            get_screen_size,
            "get_screen_size",
            "Return the screen size in real pixels (the other tools take coordinates normalized to [0, 1000]).",
            structured=True,
        ),
    ]


async def _screenshot_png(state: BridgeState, save_path: str | None) -> bytes:
    """The screen as PNG, also written to ``save_path`` in the sandbox when given (its folder checked first,
    so a bad path fails before the capture)."""
    if save_path is not None:
        parent = _parent(save_path)
        async with failing(f"cannot save the screenshot to {save_path}"):
            if not await (await state.client()).dir_exists(parent):
                raise ToolError(f"cannot save the screenshot to {save_path}: {parent} does not exist")
    async with failing("cannot take a screenshot"):
        png = await (await state.client()).screenshot()
    if save_path is not None:
        async with failing(f"cannot save the screenshot to {save_path}"):
            await (await state.client()).write_bytes(save_path, png)
    return png


async def _release(client: ComputerServerClient, keys: list[str]) -> None:
    for name in reversed(keys):
        await client.key_up(name)


def _parent(path: str) -> str:
    """The parent directory of an absolute POSIX or Windows path; a ``ToolError`` for anything else."""
    cut = max(path.rfind("/"), path.rfind("\\"))
    if not _ABSOLUTE.match(path) or cut < 0 or cut == len(path) - 1:
        raise ToolError(f"save_path must be an absolute file path, got {path!r}")
    parent = path[:cut]
    return parent if parent and not parent.endswith(":") else path[: cut + 1]
