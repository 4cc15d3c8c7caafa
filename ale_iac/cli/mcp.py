"""``ale-iac mcp vm|cua``: run an MCP bridge over one sandbox's computer-server.

stdio by default (what agent CLIs spawn); ``--http --port N`` serves streamable HTTP on 127.0.0.1 at
``/mcp``. The sandbox is ``--endpoint URL``, or a unit of a stack (``--stack NAME [--unit UNIT]``, read
from the stack's outputs). One bridge process is spawned per agent run, so everything heavy is imported
inside the command, and nothing but MCP traffic is ever written to stdout.
"""

from __future__ import annotations

import os
from typing import Literal

import typer

from ale_iac.contract import ENDPOINT_TOKEN_ENV as TOKEN_ENV
from ale_iac.contract import ENDPOINT_TOKEN_FILE_ENV as TOKEN_FILE_ENV
from ale_iac.errors import AleIacError

mcp_app = typer.Typer(
    help="MCP bridges over a sandbox: vm (shell, files, clipboard, PTY) and cua (mouse, keyboard, screen).",
    no_args_is_help=True,
)

BridgeKind = Literal["vm", "cua"]

_ENDPOINT_HELP = (
    "Base URL of the sandbox's computer-server, e.g. http://127.0.0.1:18000; its token, if it needs one, "
    f"comes from the environment variable {TOKEN_ENV} or the file {TOKEN_FILE_ENV} names (never from the "
    "command line, which other users can read)."
)
_STACK_HELP = "Stack whose unit to bridge (instead of --endpoint)."
_UNIT_HELP = "Unit of --stack (default: the stack's only unit)."
BRIDGE_TOKEN_ENV = "ALE_IAC_BRIDGE_TOKEN"
_HTTP_HELP = (
    "Serve streamable HTTP on 127.0.0.1 (path /mcp) instead of stdio; clients must send "
    f"'Authorization: Bearer <token>' with the token from the environment variable {BRIDGE_TOKEN_ENV}."
)
_PORT_HELP = "Port for --http."


def resolve_endpoint(endpoint: str | None, stack: str | None, unit: str | None) -> tuple[str, str | None]:
    """The computer-server URL and token named by exactly one of ``--endpoint`` and ``--stack [--unit]``."""
    if endpoint and stack:
        raise AleIacError("give either --endpoint or --stack, not both")
    if unit and not stack:
        raise AleIacError("--unit needs --stack")
    if endpoint:
        if not endpoint.startswith(("http://", "https://")):
            raise AleIacError(f"--endpoint must be an http(s) URL, got {endpoint!r}")
        from ale_iac.bridges.serve import endpoint_token_from_env

        return endpoint, endpoint_token_from_env()
    if stack:
        from ale_iac.engine import read_unit_handle

        handle = read_unit_handle(stack, unit)
        return handle.endpoint, handle.token()
    raise AleIacError("name the sandbox with --endpoint URL or --stack NAME [--unit UNIT]")


def _bridge_token() -> str:
    token = os.environ.get(BRIDGE_TOKEN_ENV, "")
    if len(token) < 16:
        raise AleIacError(
            f"--http needs a bearer token of at least 16 characters in {BRIDGE_TOKEN_ENV} (for example "
            f"export {BRIDGE_TOKEN_ENV}=$(openssl rand -hex 32)); any user of this host could drive the "
            "sandbox through an open port otherwise"
        )
    return token


def _run(
    kind: BridgeKind, endpoint: str | None, stack: str | None, unit: str | None, http: bool, port: int | None
) -> None:
    if http and port is None:
        raise AleIacError("--http needs --port N")
    if port is not None and not http:
        raise AleIacError("--port is only used with --http")
    if port is not None and not 1 <= port <= 65535:
        raise AleIacError(f"--port must be in 1..65535, got {port}")
    url, token = resolve_endpoint(endpoint, stack, unit)
    if http:
        _bridge_token()  # refused before anything starts
    from ale_iac.bridges.serve import serve

    serve(kind, url, token, (port, _bridge_token()) if http and port is not None else None)


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
