"""``ale-iac mcp vm|cua``: run an MCP bridge over one sandbox's computer-server.

stdio by default (what agent CLIs spawn); ``--http --port N`` serves streamable HTTP on 127.0.0.1 at
``/mcp``. The sandbox is ``--endpoint URL``, or a unit of a stack (``--stack NAME [--unit UNIT]``, read
from the stack's outputs). One bridge process is spawned per agent run, so everything heavy is imported
inside the command, and nothing but MCP traffic is ever written to stdout.
"""

from __future__ import annotations

from typing import Literal

import typer

from ale_iac.errors import AleIacError

mcp_app = typer.Typer(
    help="MCP bridges over a sandbox: vm (shell, files, clipboard, PTY) and cua (mouse, keyboard, screen).",
    no_args_is_help=True,
)

BridgeKind = Literal["vm", "cua"]

_ENDPOINT_HELP = "Base URL of the sandbox's computer-server, e.g. http://127.0.0.1:18000."
_STACK_HELP = "Stack whose unit to bridge (instead of --endpoint)."
_UNIT_HELP = "Unit of --stack (default: the stack's only unit)."
_HTTP_HELP = "Serve streamable HTTP on 127.0.0.1 (path /mcp) instead of stdio."
_PORT_HELP = "Port for --http."


def resolve_endpoint(endpoint: str | None, stack: str | None, unit: str | None) -> str:
    """The computer-server URL named by exactly one of ``--endpoint`` and ``--stack [--unit]``."""
    if endpoint and stack:
        raise AleIacError("give either --endpoint or --stack, not both")
    if unit and not stack:
        raise AleIacError("--unit needs --stack")
    if endpoint:
        if not endpoint.startswith(("http://", "https://")):
            raise AleIacError(f"--endpoint must be an http(s) URL, got {endpoint!r}")
        return endpoint
    if stack:
        from ale_iac.engine import read_unit_handle

        return read_unit_handle(stack, unit).endpoint
    raise AleIacError("name the sandbox with --endpoint URL or --stack NAME [--unit UNIT]")


def serve(kind: BridgeKind, endpoint: str, http_port: int | None = None) -> None:
    """Run one bridge until its transport closes (stdin EOF for stdio; a signal for HTTP)."""
    import contextlib

    import anyio

    async def main() -> None:
        from ale_iac.sandbox.client import ComputerServerClient

        if kind == "vm":
            from ale_iac.bridges.vm import build_server
        else:
            from ale_iac.bridges.cua import build_server

        async with ComputerServerClient(endpoint) as client:
            server = build_server(lambda: client)
            try:
                if http_port is None:
                    await server.run_stdio_async()
                else:
                    await server.run_streamable_http_async(host="127.0.0.1", port=http_port)
            finally:
                # PTY sessions belong to this bridge process: nobody can reach them after it exits.
                with anyio.move_on_after(5, shield=True):
                    for pid in client.pty_sessions():
                        with contextlib.suppress(AleIacError):
                            await client.pty_kill(pid)

    anyio.run(main)


def _run(
    kind: BridgeKind, endpoint: str | None, stack: str | None, unit: str | None, http: bool, port: int | None
) -> None:
    if http and port is None:
        raise AleIacError("--http needs --port N")
    if port is not None and not http:
        raise AleIacError("--port is only used with --http")
    if port is not None and not 1 <= port <= 65535:
        raise AleIacError(f"--port must be in 1..65535, got {port}")
    serve(kind, resolve_endpoint(endpoint, stack, unit), port if http else None)


@mcp_app.command("vm")
def vm(
    endpoint: str | None = typer.Option(None, "--endpoint", help=_ENDPOINT_HELP),
    stack: str | None = typer.Option(None, "--stack", help=_STACK_HELP),
    unit: str | None = typer.Option(None, "--unit", help=_UNIT_HELP),
    http: bool = typer.Option(False, "--http", help=_HTTP_HELP),
    port: int | None = typer.Option(None, "--port", help=_PORT_HELP),
) -> None:
    """The vm bridge: run_command, text and binary files, clipboard, PTY sessions."""
    _run("vm", endpoint, stack, unit, http, port)


@mcp_app.command("cua")
def cua(
    endpoint: str | None = typer.Option(None, "--endpoint", help=_ENDPOINT_HELP),
    stack: str | None = typer.Option(None, "--stack", help=_STACK_HELP),
    unit: str | None = typer.Option(None, "--unit", help=_UNIT_HELP),
    http: bool = typer.Option(False, "--http", help=_HTTP_HELP),
    port: int | None = typer.Option(None, "--port", help=_PORT_HELP),
) -> None:
    """The cua bridge: mouse, keyboard, scroll, screenshots; coordinates normalized to [0, 1000]."""
    _run("cua", endpoint, stack, unit, http, port)


def register(app: typer.Typer) -> None:
    app.add_typer(mcp_app, name="mcp")
