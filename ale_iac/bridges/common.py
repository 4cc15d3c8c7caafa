"""What both MCP bridges share: the lazily connected client, one-line tool errors, strict arguments.

Error policy. Every failure reaches the agent as an MCP tool error (``is_error``) with one line saying what
failed and on which argument or path; the SDK prefixes ``Error executing tool <name>: ``. Arguments are
checked before anything is sent: schema violations (pydantic) are flattened to one line here, unknown
argument names are refused (a misspelt ``coordinates`` would otherwise be dropped and the click land at the
cursor), and the tools check what a schema cannot (base64, key names, paths).
"""

from __future__ import annotations

import asyncio
import math
import os
import stat
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeGuard

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools.base import Tool
from mcp.server.stdio import stdio_server
from mcp_types import CallToolResult, InputRequiredResult
from pydantic import ValidationError

from ale_iac.sandbox.client import ComputerServerClient
from ale_iac.sandbox.keys import UnknownKeyError
from ale_iac.sandbox.protocol import ComputerServerError, ServerUnreachableError, UnsupportedServerError

ClientFactory = Callable[[], ComputerServerClient]
"""Returns the client a bridge uses; called once, on the first tool call."""

COORD_MAX = 1000


class BridgeState:
    """Per-process state of a bridge: the client (version-checked once) and the cached screen size."""

    def __init__(self, client_factory: ClientFactory) -> None:
        self._factory = client_factory
        self._client: ComputerServerClient | None = None
        self._checked = False
        self._screen: tuple[int, int] | None = None
        self._lock = asyncio.Lock()

    async def client(self) -> ComputerServerClient:
        """The client; the first call checks the server version (and retries it until one call succeeds)."""
        if not self._checked:
            async with self._lock:
                if self._client is None:
                    self._client = self._factory()
                if not self._checked:
                    await self._client.check_version()
                    self._checked = True
        assert self._client is not None
        return self._client

    async def screen_size(self) -> tuple[int, int]:
        """Real screen size in pixels, fetched once per bridge process."""
        if self._screen is None:
            client = await self.client()
            width, height = await client.screen_size()
            if width < 1 or height < 1:
                raise ToolError(f"the sandbox reported an empty screen ({width}x{height})")
            self._screen = (width, height)
        return self._screen

    async def to_pixels(self, coordinate: Sequence[float]) -> tuple[int, int]:
        """Normalized ``[x, y]`` in [0, 1000] to pixels; 1000 maps to the last pixel row/column."""
        width, height = await self.screen_size()
        return _scale(coordinate[0], width), _scale(coordinate[1], height)

    async def to_normalized(self, x: int, y: int) -> tuple[int, int]:
        width, height = await self.screen_size()
        return _half_up(x * COORD_MAX / width), _half_up(y * COORD_MAX / height)


def _half_up(value: float) -> int:
    return math.floor(value + 0.5)


def _scale(value: float, size: int) -> int:
    return max(0, min(_half_up(value / COORD_MAX * size), size - 1))


def fmt_num(value: float) -> str:
    """A number as a JavaScript template string prints it (``3`` not ``3.0``), for the return texts."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


def fmt_coord(coordinate: Sequence[float]) -> str:
    return f"[{fmt_num(coordinate[0])}, {fmt_num(coordinate[1])}]"


@asynccontextmanager
async def failing(what: str) -> AsyncIterator[None]:
    """Turn the expected failures inside the block into a one-line ``ToolError`` starting with ``what``."""
    try:
        yield
    except ToolError:
        raise
    except UnsupportedServerError as exc:
        raise ToolError(f"{what}: {exc}") from exc
    except ServerUnreachableError as exc:
        raise ToolError(f"{what}: computer-server {exc.endpoint} is unreachable ({exc.message})") from exc
    except ComputerServerError as exc:
        raise ToolError(f"{what}: {exc.message}") from exc
    except (UnknownKeyError, ValueError) as exc:
        raise ToolError(f"{what}: {exc}") from exc


def make_tool(fn: Callable[..., Any], name: str, description: str, *, structured: bool = False) -> Tool:
    """A tool with a tidy schema: no titles, an optional argument without default shown as its plain type,
    no unknown properties. ``structured`` tools return ``Annotated[CallToolResult, Model]`` (text plus
    structured content, with ``Model`` as the output schema); the others return text or content blocks."""
    tool = Tool.from_function(fn, name=name, description=description, structured_output=None if structured else False)
    tool.parameters = _tidy_schema(tool.parameters)
    return tool


def _tidy_schema(schema: dict[str, Any]) -> dict[str, Any]:
    schema = {k: v for k, v in schema.items() if k != "title"}
    properties: dict[str, Any] = {}
    for name, raw in schema.get("properties", {}).items():
        prop = {k: v for k, v in raw.items() if k != "title"}
        variants = prop.get("anyOf")
        if isinstance(variants, list) and prop.get("default", ...) is None:
            kept = [v for v in variants if v != {"type": "null"}]
            if len(kept) == 1:  # ``T | None = None``: advertise T, optional, no default
                rest = {k: v for k, v in prop.items() if k not in ("anyOf", "default")}
                prop = {**rest, **kept[0]}
        properties[name] = _strip_titles(prop)
    schema["properties"] = properties
    schema["additionalProperties"] = False
    return schema


def _strip_titles(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip_titles(v) for k, v in node.items() if not (k == "title" and isinstance(v, str))}
    if isinstance(node, list):
        return [_strip_titles(v) for v in node]
    return node


class BridgeServer(MCPServer[Any]):
    """An ``MCPServer`` that refuses unknown argument names, reports schema violations on one line, and
    serves stdio without worker threads (see :func:`pipe_stdio`)."""

    def __init__(self, name: str, instructions: str, tools: list[Tool]) -> None:
        from ale_iac import __version__

        super().__init__(name=name, instructions=instructions, version=__version__, tools=tools, log_level="WARNING")
        self._arg_names = {t.name: frozenset(t.parameters.get("properties", {})) for t in tools}
        self.tool_schemas: dict[str, dict[str, Any]] = {t.name: t.parameters for t in tools}
        """Each tool's argument schema, known without a sandbox (the runner checks presets against it)."""

    async def run_stdio_async(self) -> None:
        lowlevel = getattr(self, "_lowlevel_server", None)
        if lowlevel is None:  # an SDK without the attribute: its own (threaded) stdio transport
            await super().run_stdio_async()
            return
        async with pipe_stdio() as pipes:
            if pipes is None:
                await super().run_stdio_async()
                return
            async with stdio_server(stdin=pipes[0], stdout=pipes[1]) as (read, write):  # type: ignore[arg-type]
                await lowlevel.run(read, write, lowlevel.create_initialization_options())

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        allowed = self._arg_names.get(name)
        if allowed is not None:
            unknown = sorted(set(arguments) - allowed)
            if unknown:
                expected = ", ".join(sorted(allowed)) or "none"
                raise ToolError(
                    f"Error executing tool {name}: unknown argument {', '.join(map(repr, unknown))} "
                    f"(expected: {expected})"
                )
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if isinstance(exc.__cause__, ValidationError):
                detail = describe_validation_error(exc.__cause__, arguments)
                raise ToolError(f"Error executing tool {name}: {detail}") from exc.__cause__
            raise


class _PipeLines:
    """Lines of the MCP client's requests, read from a pipe by the event loop."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    def __aiter__(self) -> _PipeLines:
        return self

    async def __anext__(self) -> str:
        line = await self._reader.readline()
        if not line:
            raise StopAsyncIteration
        return line.decode("utf-8", errors="replace")


class _PipeWriter:
    """Replies written to a pipe by the event loop (``flush`` waits while the pipe is full)."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    async def write(self, text: str) -> None:
        self._writer.write(text.encode("utf-8"))

    async def flush(self) -> None:
        await self._writer.drain()


MAX_REQUEST_LINE = 1 << 30
"""One JSON-RPC message per line; a ``write_bytes`` request carries the whole file in it."""


@asynccontextmanager
async def pipe_stdio() -> AsyncIterator[tuple[_PipeLines, _PipeWriter] | None]:
    """Stdin and stdout as event-loop pipes, or None when they are not pipes or sockets (then use the SDK's).

    The SDK's stdio transport reads and writes through a worker thread per line; on the small machines
    sandboxes run on, those hand-offs were most of a bridge's per-call overhead. As the SDK does, fds 0
    and 1 are pointed at /dev/null and stderr while serving, so stray output (a library's print, a child
    process) cannot corrupt the protocol stream; both are restored on exit.
    """
    if sys.platform == "win32" or not all(_is_pipe(fd) for fd in (0, 1)) or _same_file(0, 1):
        yield None
        return
    import fcntl

    loop = asyncio.get_running_loop()
    wire_in = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    wire_out = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdout.flush()
    os.dup2(2, 1)
    write_transport: asyncio.WriteTransport | None = None
    read_transport: asyncio.ReadTransport | None = None
    try:
        reader = asyncio.StreamReader(limit=MAX_REQUEST_LINE)
        read_transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(os.dup(wire_in), "rb", buffering=0)
        )
        write_transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, os.fdopen(os.dup(wire_out), "wb", buffering=0)
        )
        writer = asyncio.StreamWriter(write_transport, protocol, None, loop)
        yield _PipeLines(reader), _PipeWriter(writer)
    finally:
        for transport in (read_transport, write_transport):
            if transport is not None:
                transport.close()
        for fd, wire in ((0, wire_in), (1, wire_out)):
            os.set_blocking(wire, True)
            os.dup2(wire, fd)
            os.close(wire)


def _is_pipe(fd: int) -> bool:
    """A pipe (Python clients) or a socket (Node clients: libuv spawns children with socketpairs)."""
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _same_file(a: int, b: int) -> bool:
    """One socket on both fds: asyncio's write transport would take each request for a hang-up."""
    sa, sb = os.fstat(a), os.fstat(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def describe_validation_error(exc: ValidationError, arguments: Mapping[str, Any]) -> str:
    """The first problem of a pydantic error as one line naming the argument."""
    first = exc.errors()[0]
    loc = [str(p) for p in first["loc"]]
    name = loc[0] if loc else "arguments"
    path = name + "".join(f"[{p}]" for p in loc[1:])
    kind = first["type"]
    if kind == "missing":
        return f"missing required argument {name!r}"
    value = arguments.get(name)
    if name.endswith("coordinate") and kind in ("less_than_equal", "greater_than_equal") and _is_pair(value):
        return f"{name} {fmt_coord(value)} is outside [0, {COORD_MAX}]"
    if name.endswith("coordinate") and kind in ("too_short", "too_long"):
        return f"{name} must be [x, y] (two numbers in [0, {COORD_MAX}]), got {_short(value)}"
    return f"invalid argument {path}: {first['msg']} (got {_short(first.get('input'))})"


def _is_pair(value: Any) -> TypeGuard[Sequence[float]]:
    return isinstance(value, list | tuple) and len(value) == 2 and all(isinstance(v, int | float) for v in value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
