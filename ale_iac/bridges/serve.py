"""Serving one MCP bridge over one sandbox's computer-server: stdio (what agent CLIs spawn) or
streamable HTTP on 127.0.0.1. Shared by ``ale-iac mcp`` and ``python -m ale_iac.bridges`` (the
form used where only the runtime bundle is, e.g. inside a sandbox or a container)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from ale_iac.contract import COMMAND_ENV_ENV, ENDPOINT_TOKEN_ENV, ENDPOINT_TOKEN_FILE_ENV
from ale_iac.errors import AleIacError

BridgeKind = Literal["vm", "cua"]


def endpoint_token_from_env() -> str | None:
    """The endpoint's token: ``ALE_IAC_ENDPOINT_TOKEN``, or the file ``ALE_IAC_ENDPOINT_TOKEN_FILE`` names."""
    token = os.environ.get(ENDPOINT_TOKEN_ENV)
    if token:
        return token
    path = os.environ.get(ENDPOINT_TOKEN_FILE_ENV)
    if not path:
        return None
    try:
        return Path(path).read_text().strip() or None
    except OSError as exc:
        raise AleIacError(f"{ENDPOINT_TOKEN_FILE_ENV}={path}: cannot read the token: {exc.strerror or exc}") from None


def command_env_from_env() -> dict[str, str]:
    """What the commands this bridge starts in its unit see: ``ALE_IAC_COMMAND_ENV`` (a JSON object), if set."""
    text = os.environ.get(COMMAND_ENV_ENV)
    if not text:
        return {}
    try:
        env = json.loads(text)
    except ValueError:
        env = None
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise AleIacError(f"{COMMAND_ENV_ENV} is not a JSON object of strings")
    return {str(name): value for name, value in env.items()}


def serve(kind: BridgeKind, endpoint: str, token: str | None, http: tuple[int, str] | None = None) -> None:
    """Run one bridge until its transport closes (stdin EOF for stdio; a signal for HTTP, served on
    127.0.0.1 at ``http = (port, bearer token)``)."""
    import contextlib

    import anyio

    async def main() -> None:
        from ale_iac.sandbox.client import ComputerServerClient

        if kind == "vm":
            from ale_iac.bridges.vm import build_server
        else:
            from ale_iac.bridges.cua import build_server

        async with ComputerServerClient(endpoint, token=token, env=command_env_from_env()) as client:
            server = build_server(lambda: client)
            try:
                if http is None:
                    await server.run_stdio_async()
                else:
                    await _serve_http(server, *http)
            finally:
                # PTY sessions belong to this bridge process: nobody can reach them after it exits.
                with anyio.move_on_after(5, shield=True):
                    for pid in client.pty_sessions():
                        with contextlib.suppress(AleIacError):
                            await client.pty_kill(pid)

    anyio.run(main)


async def _serve_http(server: Any, port: int, token: str) -> None:
    """The bridge's streamable HTTP app on 127.0.0.1, admitting only requests with the bearer token."""
    import uvicorn

    from ale_iac.substrates.authproxy import bearer_matches

    app = server.streamable_http_app(host="127.0.0.1")

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not bearer_matches(given, token.encode()):
                body = b"401 Unauthorized: send Authorization: Bearer <the bridge's token>\n"
                await send(
                    {"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]}
                )
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    config = uvicorn.Config(guarded, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    await uvicorn.Server(config).serve()
