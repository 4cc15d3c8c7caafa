"""One computer-server endpoint at the protocol level: the connection, ``/cmd`` and its replies, retries, and
what the server says of itself (status, version, OS).

Protocol (cua-computer-server 0.3.x): ``POST /cmd`` with ``{"command", "params"}``; the
reply is HTTP 200 with exactly one ``data: {json}`` line, ``{"success": true, ...}`` or
``{"success": false, "error"}``; an unknown command or a bad body is HTTP 400 ``{"detail"}``. Everything here
is strict: a failure reply, an HTTP error or a reply without the ``data: `` prefix raises
:class:`ComputerServerError` with one line naming the endpoint, the command and the server's message.

Retries: only idempotent reads are retried on a transport error. A command whose request may have reached the
server is never retried (running ``rm`` or ``type_text`` twice is worse than failing once); a connection that
could not be opened at all is retried for every command, since nothing was sent.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Final, Literal, Self

import httpx

from ale_iac.contract import ENDPOINT_TOKEN_ENV
from ale_iac.sandbox.protocol import ComputerServerError, ServerUnreachableError, ServerVersion, UnsupportedServerError

_SUPPORTED_PACKAGE = re.compile(r"^0\.3\.\d+$")
_SUPPORTED_PROTOCOL: Final = 1

DEFAULT_TIMEOUT_S: Final = 30.0
"""HTTP timeout of one ``/cmd`` call that is not a shell command."""
_READ_RETRIES: Final = 3
_RETRY_BACKOFF_S: Final = (0.1, 0.4)


_ENV_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def with_env(command: str, env: Mapping[str, str]) -> str:
    """``command`` for a POSIX shell, ``env`` exported first (names checked by :class:`ServerConnection`)."""
    return "".join(f"export {name}={shlex.quote(value)}; " for name, value in env.items()) + command


class ServerConnection:
    """One computer-server endpoint, over a keep-alive ``httpx.AsyncClient`` (the client's base: the commands
    are :class:`~ale_iac.sandbox.client.ComputerServerClient`'s)."""

    def __init__(
        self,
        endpoint: str,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        connect_timeout: float = 5.0,
        token: str | None = None,
        trust_env: bool = False,
        transport: httpx.AsyncBaseTransport | None = None,
        env: Mapping[str, str] | None = None,
        request_tries: int = _READ_RETRIES,
    ) -> None:
        """``token``: the bearer token the endpoint requires (sandboxes ale-iac starts have one). ``env``: what
        every command started through this client sees in its environment (a shell command's, a PTY's:
        :func:`with_env`); the unit's own, from its handle (``SandboxHandle.command_env``). ``request_tries``:
        how often one request is sent when its connection breaks (0.1 s, then 0.4 s apart); a caller with a
        retry loop of its own (readiness) says 1."""
        if request_tries < 1:
            raise ValueError(f"request_tries must be at least 1, got {request_tries}")
        if not endpoint.startswith(("http://", "https://")):
            raise ValueError(f"computer-server endpoint must be an http(s) URL, got {endpoint!r}")
        for name in env or {}:
            if not _ENV_NAME.match(name):
                raise ValueError(f"not an environment variable's name: {name!r}")
        self.endpoint = endpoint.rstrip("/")
        self.command_env: dict[str, str] = dict(env or {})
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._request_tries = request_tries
        # uvicorn closes idle keep-alive connections after 5 s; expiring ours first avoids reusing a
        # socket the server is closing, which would fail a non-idempotent command it never received.
        self._http = httpx.AsyncClient(
            base_url=self.endpoint,
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=httpx.Limits(max_keepalive_connections=8, keepalive_expiry=4.0),
            trust_env=trust_env,  # sandboxes sit on loopback or allow-listed addresses: never through a proxy
            transport=transport,
            headers=headers,
        )
        self._os_type: str | None = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    # -- transport -------------------------------------------------------------------------------------------

    def _timeout_for(self, read: float | None) -> httpx.Timeout:
        return httpx.Timeout(self._timeout, connect=self._connect_timeout, read=read)

    async def _send(
        self,
        command: str,
        method: str,
        path: str,
        *,
        body: Any = None,
        idempotent: bool,
        timeout: httpx.Timeout | None = None,
    ) -> httpx.Response:
        # A connection that could not be opened sent nothing, so that case is retried for any command.
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._http.request(
                    method,
                    path,
                    json=body,
                    timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
                )
            except httpx.TransportError as exc:
                retryable = idempotent or isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
                if not retryable or attempt >= self._request_tries:
                    raise ServerUnreachableError(self.endpoint, command, describe(exc)) from exc
            await asyncio.sleep(_RETRY_BACKOFF_S[min(attempt - 1, len(_RETRY_BACKOFF_S) - 1)])

    async def _request(
        self,
        command: str,
        params: dict[str, Any] | None = None,
        *,
        idempotent: bool = False,
        read_timeout: float | Literal["default"] | None = "default",
    ) -> dict[str, Any]:
        """Send one ``/cmd`` and return its JSON payload, ``success`` included (false is not raised here)."""
        timeout = None if read_timeout == "default" else self._timeout_for(read_timeout)
        response = await self._send(
            command,
            "POST",
            "/cmd",
            body={"command": command, "params": params or {}},
            idempotent=idempotent,
            timeout=timeout,
        )
        if response.status_code != 200:
            raise ComputerServerError(self.endpoint, command, http_error(response))
        text = response.text.lstrip("\ufeff")
        if not text.startswith("data: "):
            raise ComputerServerError(self.endpoint, command, f"reply is not a 'data: ' line: {text[:120]!r}")
        line = text[len("data: ") :].split("\n", 1)[0]
        try:
            payload = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ComputerServerError(self.endpoint, command, f"reply is not JSON: {exc}") from exc
        if not isinstance(payload, dict) or "success" not in payload:
            raise ComputerServerError(self.endpoint, command, f"reply has no 'success' field: {line[:120]!r}")
        return payload

    async def _cmd(
        self,
        command: str,
        params: dict[str, Any] | None = None,
        *,
        idempotent: bool = False,
        read_timeout: float | Literal["default"] | None = "default",
    ) -> dict[str, Any]:
        """Send one ``/cmd``; raise :class:`ComputerServerError` unless it succeeded."""
        payload = await self._request(command, params, idempotent=idempotent, read_timeout=read_timeout)
        if payload.get("success") is not True:
            message = payload.get("error") or payload.get("message") or "the server reported failure without a message"
            raise ComputerServerError(self.endpoint, command, str(message))
        return payload

    def _field(self, command: str, payload: dict[str, Any], key: str) -> Any:
        if key not in payload:
            raise ComputerServerError(self.endpoint, command, f"reply has no {key!r} field")
        return payload[key]

    # -- server ----------------------------------------------------------------------------------------------

    async def status(self) -> dict[str, Any]:
        """``GET /status``: ``{"status": "ok", "os_type": ..., "features": [...]}``."""
        response = await self._send("status", "GET", "/status", idempotent=True)
        if response.status_code != 200:
            raise ComputerServerError(self.endpoint, "status", http_error(response))
        try:
            data = response.json()
        except ValueError as exc:
            raise ComputerServerError(self.endpoint, "status", f"reply is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ComputerServerError(self.endpoint, "status", f"reply is not an object: {data!r}")
        if isinstance(data.get("os_type"), str):
            self._os_type = data["os_type"]
        return data

    async def version(self) -> ServerVersion:
        payload = await self._cmd("version", idempotent=True)
        try:
            return ServerVersion(package=str(payload["package"]), protocol=int(payload["protocol"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ComputerServerError(self.endpoint, "version", f"malformed version reply: {payload!r}") from exc

    async def check_version(self) -> ServerVersion:
        """Return the server's version, or raise :class:`UnsupportedServerError` for one we do not support.

        0.1.x is refused on purpose: it has no ``run_command`` timeout, no PTY routes and no
        ``scroll_direction``, which the bridges' contract needs.
        """
        version = await self.version()
        if version.protocol != _SUPPORTED_PROTOCOL or not _SUPPORTED_PACKAGE.match(version.package):
            reason = ""
            if version.package.startswith("0.1."):
                reason = "0.1.x has no command timeouts, PTY sessions or directional scroll"
            raise UnsupportedServerError(self.endpoint, version, reason)
        return version

    async def os_type(self) -> str:
        """The server's OS (``linux``, ``windows``, ``darwin``), from ``/status``, fetched once."""
        if self._os_type is None:
            await self.status()
        return self._os_type or "linux"

    def _json_reply(self, command: str, response: httpx.Response) -> dict[str, Any]:
        if response.status_code != 200:
            raise ComputerServerError(self.endpoint, command, http_error(response))
        try:
            data = response.json()
        except ValueError as exc:
            raise ComputerServerError(self.endpoint, command, f"reply is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ComputerServerError(self.endpoint, command, f"reply is not an object: {data!r}")
        return data


def describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def http_error(response: httpx.Response) -> str:
    if response.status_code == 401:
        return (
            "HTTP 401: the endpoint refused the token (none given, or not this sandbox's); "
            f"use the sandbox's handle (--stack/--unit) or set {ENDPOINT_TOKEN_ENV}"
        )
    detail: Any = None
    try:
        body = response.json()
        detail = body.get("detail") if isinstance(body, dict) else body
    except ValueError:
        detail = response.text[:200]
    return f"HTTP {response.status_code}: {detail}" if detail else f"HTTP {response.status_code}"
