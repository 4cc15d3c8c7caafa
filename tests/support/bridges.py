"""Bridge sessions through the real ``mcp`` client over stdio, spawning ``ale-iac mcp vm|cua``.

Tests are synchronous: each session lives in a blocking portal (an event loop in a thread), so one
bridge process serves a whole test module (the ``vm_bridge`` and ``cua_bridge`` fixtures of
``tests/bridges/conftest.py``) and every call is a plain function call.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from anyio.from_thread import BlockingPortal, start_blocking_portal
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp_types import CallToolResult, Tool

from tests.support.sandbox import Endpoint

ALE_IAC = str(Path(sys.executable).with_name("ale-iac"))


class Bridge:
    """A live MCP client session with one bridge process, usable from synchronous code."""

    def __init__(self, portal: BlockingPortal, session: ClientSession, kind: str) -> None:
        self._portal = portal
        self._session = session
        self.kind = kind

    def tools(self) -> list[Tool]:
        return self._portal.call(self._session.list_tools).tools

    def call(self, name: str, **arguments: Any) -> CallToolResult:
        result: CallToolResult = self._portal.call(self._session.call_tool, name, arguments)
        return result

    def text(self, name: str, **arguments: Any) -> str:
        """Call a tool that must succeed and return a single text block; return that text."""
        result = self.call(name, **arguments)
        assert not result.is_error, f"{self.kind}.{name}({arguments}) failed: {_texts(result)}"
        texts = _texts(result)
        assert len(texts) == 1, f"{name} returned {len(result.content)} blocks"
        return texts[0]

    def error(self, name: str, **arguments: Any) -> str:
        """Call a tool that must fail; return its one-line message."""
        result = self.call(name, **arguments)
        assert result.is_error, f"{self.kind}.{name}({arguments}) should have failed: {_texts(result)}"
        (message,) = _texts(result)
        assert "\n" not in message, f"error message is not one line: {message!r}"
        return message


REQUIRED = "required"
OPTIONAL = "optional, no default"


def assert_matches_seed(bridge: Bridge, seed: dict[str, dict[str, Any]], structured: dict[str, set[str]]) -> None:
    tools = {tool.name: tool for tool in bridge.tools()}
    assert sorted(tools) == sorted(seed)
    for name, params in seed.items():
        schema = tools[name].input_schema
        assert set(schema.get("properties", {})) == set(params), name
        required = set(schema.get("required", []))
        for param, spec in params.items():
            prop = schema["properties"][param]
            if spec == REQUIRED:
                assert param in required and "default" not in prop, f"{name}.{param} should be required"
            elif spec == OPTIONAL:
                assert param not in required and "default" not in prop, f"{name}.{param} should be optional"
            else:
                assert param not in required, f"{name}.{param} should be optional"
                assert "default" in prop, f"{name}.{param} should default to {spec!r}"
                assert type(prop["default"]) is type(spec) and prop["default"] == spec, f"{name}.{param}"
        output = tools[name].output_schema
        if name in structured:
            assert output is not None and set(output["properties"]) == structured[name], name
        else:
            assert output is None, f"{name} should have no structured output"


def sh(vm: Bridge, command: str) -> str:
    """Run through the vm bridge and return stdout (asserting exit code 0)."""
    result = vm.call("run_command", command=command, timeout=30)
    assert not result.is_error and result.structured_content is not None, result
    assert result.structured_content["exit_code"] == 0, result.structured_content
    return str(result.structured_content["stdout"])


def _texts(result: CallToolResult) -> list[str]:
    return [block.text for block in result.content if block.type == "text"]


@contextmanager
def open_bridge(
    kind: str, endpoint: Endpoint, errlog: Path, params: StdioServerParameters | None = None
) -> Iterator[Bridge]:
    """A bridge of ``kind`` to ``endpoint`` as an MCP client starts it (or as ``params`` say: an executor's)."""
    params = params or StdioServerParameters(
        command=ALE_IAC, args=["mcp", kind, "--endpoint", endpoint.url], env=endpoint.bridge_env()
    )

    @asynccontextmanager
    async def session() -> AsyncIterator[ClientSession]:
        with errlog.open("a") as log:
            async with stdio_client(params, errlog=log) as (read, write), ClientSession(read, write) as s:
                await s.initialize()
                yield s

    with (
        start_blocking_portal(backend="asyncio") as portal,
        portal.wrap_async_context_manager(session()) as live,
    ):
        yield Bridge(portal, live, kind)


def gated_python(gate: Path) -> list[str]:
    """An interpreter that starts only once ``gate`` exists: a warm process still importing, for as long as a
    test needs."""
    return ["/bin/sh", "-c", f'while [ ! -e "{gate}" ]; do sleep 0.05; done; exec "$0" "$@"', sys.executable]
