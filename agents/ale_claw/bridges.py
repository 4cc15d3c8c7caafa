"""The two MCP bridges as restartable stdio sessions (the real ``mcp`` client).

``stdio_client`` and ``ClientSession`` are anyio contexts that one task must enter and leave, so each
bridge process is held by a task of its own; calls go through its session from the agent's task. A
bridge that dies (its process killed, its pipe broken) is noticed by a ping: a call that raises, or a
ping before a call that must not be sent twice, tells a dead bridge from a tool error. ``restart``
replaces the process; what the caller retries is its decision (``tools.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import CallToolResult, ImageContent, PaginatedRequestParams, TextContent

from ale_iac.agent_sdk import BridgeKind, BridgeLaunch

PING_TIMEOUT_S = 5.0


class BridgeDiedError(Exception):
    """The bridge's process is gone (or no longer answers): restart it."""


class BridgeStartError(Exception):
    """The bridge could not be started (or listed its tools)."""


@dataclass
class RawResult:
    """One bridge call's result: its text blocks joined, images (base64, MIME type), structured content."""

    text: str
    is_error: bool
    images: list[tuple[str, str]] = field(default_factory=list)
    structured: dict[str, Any] | None = None
    duration_s: float = 0.0


class _Session:
    """One bridge process and its MCP session, held open by a task."""

    def __init__(self, kind: BridgeKind, launch: BridgeLaunch, start_timeout_s: float, errlog: TextIO) -> None:
        self._params = StdioServerParameters(command=launch.command, args=list(launch.args), env=dict(launch.env))
        self._start_timeout_s = start_timeout_s
        self._errlog = errlog
        self._ready: asyncio.Future[tuple[ClientSession, set[str]]] = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._hold(), name=f"ale-claw-bridge-{kind}")

    async def _hold(self) -> None:
        try:
            async with (
                stdio_client(self._params, errlog=self._errlog) as (read, write),
                ClientSession(read, write, read_timeout_seconds=self._start_timeout_s) as session,
            ):
                await session.initialize()
                names: set[str] = set()
                cursor: str | None = None
                while True:
                    listing = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
                    names.update(tool.name for tool in listing.tools)
                    cursor = listing.next_cursor
                    if not cursor:
                        break
                if not self._ready.done():
                    self._ready.set_result((session, names))
                await self._stop.wait()
        except BaseException as exc:
            if not self._ready.done():
                self._ready.set_exception(exc)
            if not isinstance(exc, Exception):
                raise

    async def ready(self) -> tuple[ClientSession, set[str]]:
        return await asyncio.shield(self._ready)

    async def close(self) -> None:
        self._stop.set()
        if not self._ready.done():
            self._task.cancel()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), 10)
        except BaseException:  # a dead or stuck bridge: cut it
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task


class Bridge:
    """A restartable MCP bridge of one kind; ``launch`` says how to start its process."""

    def __init__(self, kind: BridgeKind, launch: Callable[[], BridgeLaunch], start_timeout_s: float) -> None:
        self.kind = kind
        self._launch = launch
        self._start_timeout_s = start_timeout_s
        self._errlog: TextIO = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
        self._session: _Session | None = None
        self._client: ClientSession | None = None
        self.tools: set[str] = set()
        self.restarts = 0
        self.generation = 0
        """Bumped on every (re)start: state held by the bridge process (PTY sessions) dies with it."""

    async def start(self) -> None:
        launch = self._launch()
        self._session = _Session(self.kind, launch, self._start_timeout_s, self._errlog)
        try:
            self._client, self.tools = await self._session.ready()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            command = " ".join([launch.command, *launch.args])
            raise BridgeStartError(f"cannot start the {self.kind} MCP bridge ({command}): {describe(exc)}") from exc
        self.generation += 1

    async def restart(self) -> None:
        if self._session is not None:
            await self._session.close()
        self._session = self._client = None
        self.restarts += 1
        await self.start()

    async def alive(self) -> bool:
        """Whether the bridge answers a ping."""
        if self._client is None:
            return False
        try:
            await asyncio.wait_for(self._client.send_ping(), PING_TIMEOUT_S)
        except asyncio.CancelledError:
            raise
        except BaseException:
            return False
        return True

    async def call(self, tool: str, arguments: dict[str, Any], timeout_s: float) -> RawResult:
        """Call a tool. A tool error is a result; a dead bridge raises :class:`BridgeDiedError`; a call that
        does not answer within ``timeout_s`` is a tool error (the bridge is alive) or a dead bridge."""
        if self._client is None:
            raise BridgeDiedError(f"the {self.kind} bridge is not running")
        start = time.monotonic()
        try:
            result = await self._client.call_tool(tool, arguments, read_timeout_seconds=timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not await self.alive():
                raise BridgeDiedError(f"the {self.kind} bridge died during {tool}: {describe(exc)}") from exc
            return RawResult(text=f"{tool} failed: {describe(exc)}", is_error=True)
        return _raw(result, time.monotonic() - start)

    async def close(self) -> str:
        """Stop the bridge and return what it wrote to stderr (over all its restarts)."""
        if self._session is not None:
            await self._session.close()
        self._session = self._client = None
        try:
            self._errlog.seek(0)
            return self._errlog.read()
        except (OSError, ValueError):
            return ""
        finally:
            self._errlog.close()


def _raw(result: object, duration_s: float) -> RawResult:
    if not isinstance(result, CallToolResult):
        return RawResult(text=f"unexpected reply type {type(result).__name__}", is_error=True, duration_s=duration_s)
    texts: list[str] = []
    images: list[tuple[str, str]] = []
    for block in result.content:
        if isinstance(block, TextContent):
            texts.append(block.text)
        elif isinstance(block, ImageContent):
            images.append((block.data, block.mime_type))
        else:
            texts.append(f"[{getattr(block, 'type', type(block).__name__)} content]")
    structured = result.structured_content if isinstance(result.structured_content, dict) else None
    return RawResult(
        text="\n".join(texts),
        is_error=bool(result.is_error),
        images=images,
        structured=structured,
        duration_s=duration_s,
    )


def describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return describe(exc.exceptions[0])
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
