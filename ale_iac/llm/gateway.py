"""The run's model gateway: agents reach their model through it, and never hold the real API key.

One gateway per run, on this host. It holds each grant's upstream and key; each unit's agent gets a
grant of its own: a random token (``ale-gw-...``) that it sends as its API key, accepted only for that
grant's API. The gateway checks the token (constant time), swaps it for the real key, forwards the
body unchanged to the grant's upstream and streams the answer back chunk by chunk as it arrives,
while reading the token usage out of the stream itself (not out of what the agent reports). The
same shape as inspect_ai's sandbox agent bridge, minus the model-API translation: the agent talks
to its vendor's API, only through us.

Listeners: 127.0.0.1 on an ephemeral port (every grant's token accepted: ``tcp_root``), and per grant
any number of Unix sockets (mode 0600; only that grant's token accepted) for relaying into a sandbox
or a container. Endpoints: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` (Anthropic
grants), ``POST /v1/responses`` (OpenAI grants); ``HEAD`` on any path answers 200 (Claude Code probes
its base URL); any other path is 404 and any other method 405. Query strings pass through
(``?beta=true``). Nothing else is reachable through it: the upstream URL is the grant's base URL
plus a fixed suffix, never a path or host taken from the request, and redirects are not followed.

Base URLs follow the vendors' SDKs: Anthropic's exclude ``/v1``, OpenAI's include it. So
``/v1/messages`` goes to ``{anthropic base}/v1/messages`` and ``/v1/responses`` to
``{openai base}/responses``; :meth:`Grant.base_url` gives the agent's side of the same convention.

Server side: uvicorn (h11) serving a plain ASGI callable, one ``uvicorn.Server`` per listener on one
event loop in the gateway's own daemon thread (``ale_iac.llm._serving``). uvicorn is already in
the environment (through ``mcp``), well kept, streams responses as they are written, and takes
pre-bound sockets (``serve(sockets=[...])``), which is how we get Unix sockets with our own
permissions and a readiness that needs no polling; run off the main thread it installs no signal
handler, so the runner keeps SIGINT. Upstream side: ``httpx.AsyncClient`` (already a dependency),
connect timeout 10 s, read timeout (between chunks) 10 min by default; it honours the usual proxy
variables (``HTTPS_PROXY``, ``NO_PROXY``) like any httpx client.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hmac
import json
import secrets
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal

import httpx

from ale_iac.clock import utc_now
from ale_iac.errors import AleIacError, one_line, squash
from ale_iac.llm import _serving as serving

ApiKind = Literal["anthropic", "openai"]

DEFAULT_UPSTREAMS: Final[dict[ApiKind, str]] = {
    "anthropic": "https://api.anthropic.com",
    "openai": "https://api.openai.com/v1",
}
"""Vendor base URLs, as their SDKs have them: Anthropic's without ``/v1``, OpenAI's with it."""
ENDPOINTS: Final[dict[str, ApiKind]] = {
    "/v1/messages": "anthropic",
    "/v1/messages/count_tokens": "anthropic",
    "/v1/responses": "openai",
}
TOKEN_PREFIX: Final = "ale-gw-"
CONNECT_TIMEOUT_S: Final = 10.0
READ_TIMEOUT_S: Final = 600.0
ERROR_MESSAGE_MAX: Final = 500
"""Most characters of an upstream error answer's message kept in a call's record."""
METER_LIMIT: Final = 32 * 1024 * 1024
"""Most bytes of one SSE event (or one JSON body) kept to read usage from; beyond it the call's usage is 0."""

_HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
_NOT_FORWARDED: Final = _HOP_BY_HOP | {
    "host",
    "content-length",
    "expect",
    "authorization",
    "x-api-key",
    "accept-encoding",
}
"""Request headers the gateway drops: the agent's credential, what the connection to upstream sets
itself (``expect`` was answered here), and ``accept-encoding`` (httpx negotiates its own and decodes,
so usage can be read)."""
_NOT_RETURNED: Final = _HOP_BY_HOP | {"content-length", "content-encoding", "date", "server", "set-cookie"}


def base_url_for(api: ApiKind, root: str) -> str:
    """The base URL of ``api`` on a server that serves it at ``root`` (``http://HOST:PORT``), as the
    vendors' SDKs have it: Anthropic ``root``, OpenAI ``root/v1``."""
    root = root.rstrip("/")
    return root + "/v1" if api == "openai" else root


@dataclass(frozen=True)
class Grant:
    """A unit's access to the gateway: its API and its token (the agent's API key)."""

    unit_id: str
    api: ApiKind
    token: str = field(repr=False)
    _gateway: ModelGateway = field(repr=False, compare=False)

    def base_url(self, root: str) -> str:
        """The base URL to give the agent for a gateway ``root`` (``tcp_root``, or where a Unix socket
        is relayed to): Anthropic ``root``, OpenAI ``root/v1``."""
        return base_url_for(self.api, root)

    def attach_unix(self, path: Path) -> None:
        """Also serve this grant on a Unix socket at ``path`` (mode 0600; a stale socket file there is
        replaced). Only this grant's token is accepted on it. Removed by ``revoke`` and ``close``."""
        self._gateway._attach_unix(self, Path(path))

    def on_revoke(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from the revoking thread: keep it short and thread-safe) once this grant ends,
        by ``revoke`` or the gateway's ``close``; at once when it has ended already. What carries the
        grant's calls elsewhere (a unit's model channel) closes with it."""
        self._gateway._on_revoke(self, callback)


class _Meter:
    """Reads token usage out of an answer as it streams by: SSE events, or a JSON body's ``usage``."""

    def __init__(self, api: ApiKind, content_type: str) -> None:
        self.api = api
        self.sse = content_type.split(";", maxsplit=1)[0].strip().lower() == "text/event-stream"
        self.input_tokens = 0
        self.output_tokens = 0
        self.error_message: str | None = None
        """An error answer's own ``error.message`` (a JSON body's), as both vendors shape it."""
        self._buffer = bytearray()
        self._data: list[bytes] = []
        self._size = 0
        self._broken = False

    def feed(self, chunk: bytes) -> None:
        if self._broken:
            return
        self._buffer += chunk
        if len(self._buffer) + self._size > METER_LIMIT:
            self._broken = True
            self._buffer.clear()
            self._data.clear()
            return
        if not self.sse:
            return
        while (end := self._buffer.find(b"\n")) >= 0:
            line = bytes(self._buffer[:end]).rstrip(b"\r")
            del self._buffer[: end + 1]
            if not line:
                self._dispatch()
            elif line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
                self._size += len(value)

    def finish(self) -> None:
        if self._broken:
            return
        if self.sse:
            self._dispatch()
            return
        with contextlib.suppress(ValueError):
            body = json.loads(bytes(self._buffer))
            if isinstance(body, dict):
                self._usage(body.get("usage"), replace_output=True)
                error = body.get("error")
                if isinstance(error, dict) and isinstance(error.get("message"), str):
                    self.error_message = squash(error["message"], ERROR_MESSAGE_MAX)

    def _dispatch(self) -> None:
        data, self._data, self._size = self._data, [], 0
        if not data:
            return
        try:
            event = json.loads(b"\n".join(data))
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        if self.api == "anthropic":
            if kind == "message_start" and isinstance(event.get("message"), dict):
                self._usage(event["message"].get("usage"), replace_output=True)
            elif kind == "message_delta":
                self._usage(event.get("usage"), replace_output=True)
        elif kind in {"response.completed", "response.incomplete", "response.failed"}:
            response = event.get("response")
            if isinstance(response, dict):
                self._usage(response.get("usage"), replace_output=True)

    def _usage(self, usage: Any, *, replace_output: bool) -> None:
        if not isinstance(usage, dict):
            return
        if isinstance(usage.get("input_tokens"), int):
            cache = (
                sum(usage.get(k) or 0 for k in ("cache_creation_input_tokens", "cache_read_input_tokens"))
                if self.api == "anthropic"
                else 0
            )
            self.input_tokens = usage["input_tokens"] + (cache if isinstance(cache, int) else 0)
        if replace_output and isinstance(usage.get("output_tokens"), int):
            self.output_tokens = usage["output_tokens"]


@dataclass
class _Call:
    t: str
    path: str
    started: float
    status: int | None = None
    ttfb_s: float | None = None
    total_s: float | None = None
    error: str | None = None
    upstream_error: str | None = None
    meter: _Meter | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "t": self.t,
            "path": self.path,
            "status": self.status,
            "input_tokens": self.meter.input_tokens if self.meter else 0,
            "output_tokens": self.meter.output_tokens if self.meter else 0,
            "ttfb_ms": _ms(self.ttfb_s),
            "total_ms": _ms(self.total_s),
            "error": self.error,
            "upstream_error": self.upstream_error,
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def _stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"count": 0, "mean_ms": None, "p50_ms": None, "max_ms": None}
    return {
        "count": len(values),
        "mean_ms": _ms(statistics.fmean(values)),
        "p50_ms": _ms(statistics.median(values)),
        "max_ms": _ms(max(values)),
    }


class _Unit:
    """A grant's state: where it goes, its key, its listeners and what went through."""

    def __init__(self, grant: Grant, upstream: str, api_key: str | None) -> None:
        self.grant = grant
        self.token = grant.token.encode()
        self.upstream = upstream
        self.api_key = api_key
        self.active = True
        self.abort = asyncio.Event()
        self.sockets: list[tuple[serving.Listener, serving.UnixSocketFile]] = []
        self.requests = 0
        self.errors = 0
        self.refused = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self.calls: list[_Call] = []
        self.watchers: list[Callable[[], None]] = []

    def ended(self) -> list[Callable[[], None]]:
        """Mark the grant ended (under the gateway's lock); its watchers, each to be called once."""
        self.active = False
        watchers, self.watchers = self.watchers, []
        return watchers


def _notify(watchers: list[Callable[[], None]]) -> None:
    """Call each watcher of an ended grant; one that fails does not keep the others from being told."""
    for watcher in watchers:
        with contextlib.suppress(Exception):
            watcher()


def _error(kind: str, message: str) -> dict[str, Any]:
    """An error body both vendors' SDKs read (``error.message``)."""
    return {"type": "error", "error": {"type": kind, "message": message}}


def _origin(url: httpx.URL) -> str:
    port = f":{url.port}" if url.port else ""
    return f"{url.scheme}://{url.host}{port}"


class ModelGateway:
    """The per-run model gateway (see the module docstring). Thread-safe; start it before use.

    ``connect_timeout_s`` and ``read_timeout_s`` bound the upstream connection: the read timeout is
    the longest silence between two chunks of an answer, not the length of the answer."""

    def __init__(self, *, connect_timeout_s: float = CONNECT_TIMEOUT_S, read_timeout_s: float = READ_TIMEOUT_S) -> None:
        self._timeout = httpx.Timeout(connect=connect_timeout_s, read=read_timeout_s, write=60.0, pool=60.0)
        self._lock = threading.Lock()
        self._units: dict[str, _Unit] = {}
        self._refused = 0
        self._loop: serving.LoopThread | None = None
        self._port: int | None = None
        self._client: httpx.AsyncClient | None = None
        self._tcp: serving.Listener | None = None
        self._retired: list[serving.Listener] = []
        self._closing = asyncio.Event()
        self._closed = False

    # lifecycle

    def start(self) -> None:
        """Listen on 127.0.0.1 (an ephemeral port); returns once connections are accepted."""
        if self._loop is not None or self._closed:
            raise RuntimeError("a model gateway starts once")
        sock = serving.bind_tcp(0)
        self._port = sock.getsockname()[1]
        self._loop = serving.LoopThread(f"model-gateway:{self._port}")
        try:
            self._loop.call(self._start(sock))
        except BaseException:
            sock.close()
            self._loop.stop()
            self._loop = None
            raise

    async def _start(self, sock: Any) -> None:
        self._client = httpx.AsyncClient(
            timeout=self._timeout,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=32),
            follow_redirects=False,
        )
        self._tcp = serving.Listener(self._app_for(None), sock)

    def close(self) -> None:
        """Cut every call in flight, stop every listener, remove the Unix sockets, close the upstream
        client and join the gateway's thread. Usage stays readable. Idempotent."""
        loop, self._loop = self._loop, None
        self._closed = True
        if loop is None:
            return
        try:
            loop.call(self._close())
        finally:
            loop.stop()

    async def _close(self) -> None:
        self._closing.set()
        listeners: list[serving.Listener] = [*self._retired]
        if self._tcp is not None:
            listeners.append(self._tcp)
        with self._lock:
            units = list(self._units.values())
            watchers = [watcher for unit in units for watcher in unit.ended()]
        _notify(watchers)
        for unit in units:
            for listener, socket_file in unit.sockets:
                socket_file.remove()
                listeners.append(listener)
            unit.sockets.clear()
        await asyncio.gather(*(listener.stopped() for listener in listeners))
        if self._client is not None:
            await self._client.aclose()

    def __enter__(self) -> ModelGateway:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def tcp_root(self) -> str:
        """``http://127.0.0.1:PORT``: every grant's root on this host (see :meth:`Grant.base_url`)."""
        if self._loop is None:
            raise RuntimeError("the model gateway is not running")
        return f"http://{serving.HOST}:{self._port}"

    @property
    def refused(self) -> int:
        """Requests refused on the TCP listener (no valid token); refusals on a grant's Unix socket
        count in that grant's usage instead."""
        with self._lock:
            return self._refused

    # grants

    def grant(self, unit_id: str, *, api: ApiKind, upstream_base_url: str | None, api_key: str | None) -> Grant:
        """A new grant for ``unit_id``: its token reaches ``upstream_base_url`` (default: the vendor's)
        with ``api_key`` (None: no credential sent upstream). A revoked unit may be granted again
        (its usage starts over); one with a live grant may not."""
        if api not in DEFAULT_UPSTREAMS:
            raise AleIacError(f"unknown model API {api!r}: use one of {', '.join(DEFAULT_UPSTREAMS)}")
        upstream = (upstream_base_url or DEFAULT_UPSTREAMS[api]).rstrip("/")
        try:
            url = httpx.URL(upstream)
        except httpx.InvalidURL as exc:
            raise AleIacError(f"upstream base URL {upstream!r} is not a URL: {exc}") from None
        if url.scheme not in {"http", "https"} or not url.host or url.query or url.fragment:
            raise AleIacError(f"upstream base URL {upstream!r} must be an http(s) URL with a host and no query")
        grant = Grant(unit_id, api, TOKEN_PREFIX + secrets.token_urlsafe(32), self)
        with self._lock:
            if self._closed:
                raise AleIacError("the model gateway is closed")
            current = self._units.get(unit_id)
            if current is not None and current.active:
                raise AleIacError(f"unit {unit_id} already has a model grant")
            self._units[unit_id] = _Unit(grant, upstream, api_key)
        return grant

    def revoke(self, unit_id: str) -> None:
        """End a grant: its token is refused from now on, calls in flight are cut and its Unix
        sockets are removed. Its usage stays readable. Idempotent; an unknown unit is ignored."""
        with self._lock:
            unit = self._units.get(unit_id)
            if unit is None:
                return
            watchers = unit.ended()
        _notify(watchers)
        loop = self._loop
        if loop is not None:
            # A gateway closing meanwhile cuts the calls and removes the sockets itself.
            with contextlib.suppress(serving.LoopStoppedError, concurrent.futures.CancelledError):
                loop.call(self._revoke(unit))

    async def _revoke(self, unit: _Unit) -> None:
        unit.abort.set()
        for listener, socket_file in unit.sockets:
            socket_file.remove()
            listener.request_stop()
            self._retired.append(listener)
        unit.sockets.clear()

    def _on_revoke(self, grant: Grant, callback: Callable[[], None]) -> None:
        with self._lock:
            unit = self._units.get(grant.unit_id)
            live = unit is not None and unit.grant is grant and unit.active
            if live:
                assert unit is not None
                unit.watchers.append(callback)
        if not live:
            callback()

    def _attach_unix(self, grant: Grant, path: Path) -> None:
        loop = self._loop
        if loop is None:
            raise RuntimeError("start the model gateway before attaching a Unix socket")
        sock, socket_file = serving.bind_unix(path)
        try:
            loop.call(self._listen_unix(grant, sock, socket_file))
        except BaseException:
            sock.close()
            socket_file.remove()
            raise

    async def _listen_unix(self, grant: Grant, sock: Any, socket_file: serving.UnixSocketFile) -> None:
        with self._lock:
            unit = self._units.get(grant.unit_id)
            if unit is None or unit.grant is not grant or not unit.active or self._closing.is_set():
                raise AleIacError(f"the model grant of unit {grant.unit_id} is revoked (or the gateway closed)")
        unit.sockets.append((serving.Listener(self._app_for(unit), sock), socket_file))

    # usage

    def usage(self, unit_id: str) -> dict[str, Any]:
        """What went through ``unit_id``'s grant (JSON-able): ``api``, ``upstream`` (scheme and host),
        ``requests``, ``errors`` (upstream status >= 400 or transport failure), ``refused`` (on its
        Unix sockets), ``input_tokens``, ``output_tokens``, ``latency`` (``ttfb`` and ``total``, each
        ``count``, ``mean_ms``, ``p50_ms``, ``max_ms``) and ``calls``, one per finished call (with
        ``upstream_error``: the message of an error answer of the upstream's own)."""
        with self._lock:
            unit = self._units.get(unit_id)
            if unit is None:
                raise KeyError(f"no model grant for unit {unit_id!r}")
            calls = list(unit.calls)
            return {
                "api": unit.grant.api,
                "upstream": _origin(httpx.URL(unit.upstream)),
                "requests": unit.requests,
                "errors": unit.errors,
                "refused": unit.refused,
                "input_tokens": unit.input_tokens,
                "output_tokens": unit.output_tokens,
                "latency": {
                    "ttfb": _stats([c.ttfb_s for c in calls if c.ttfb_s is not None]),
                    "total": _stats([c.total_s for c in calls if c.total_s is not None]),
                },
                "calls": [c.as_dict() for c in calls],
            }

    # serving

    def _app_for(self, bound: _Unit | None) -> serving.App:
        async def app(scope: serving.Scope, receive: serving.Receive, send: serving.Send) -> None:
            if scope["type"] == "http":
                await self._handle(bound, scope, receive, send)

        return app

    def _authenticate(self, headers: dict[str, str], bound: _Unit | None) -> _Unit | None:
        given = [headers["x-api-key"].encode("latin-1")] if "x-api-key" in headers else []
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            given.append(token.strip().encode("latin-1"))
        with self._lock:
            candidates = [bound] if bound is not None else list(self._units.values())
            found = None
            for unit in candidates:
                for value in given:
                    if hmac.compare_digest(value, unit.token) and unit.active:
                        found = unit
            if found is None:
                if bound is not None:
                    bound.refused += 1
                else:
                    self._refused += 1
            return found

    async def _handle(
        self, bound: _Unit | None, scope: serving.Scope, receive: serving.Receive, send: serving.Send
    ) -> None:
        method: str = scope["method"]
        path: str = scope["path"]
        if method == "HEAD":
            await serving.send_bytes(send, 200, b"", "text/plain")
            return
        api = ENDPOINTS.get(path)
        if api is None:
            await serving.send_json(send, 404, _error("not_found_error", f"the model gateway has no {path}"))
            return
        if method != "POST":
            await serving.send_json(
                send, 405, _error("invalid_request_error", f"{path} takes POST"), [("allow", "POST")]
            )
            return
        headers = serving.header_map(scope)
        unit = self._authenticate(headers, bound)
        if unit is None:
            message = "invalid gateway token: send the unit's token as the API key (x-api-key or Bearer)"
            await serving.send_json(send, 401, _error("authentication_error", message))
            return
        if api != unit.grant.api:
            message = f"this grant is for the {unit.grant.api} API, which has no {path}"
            await serving.send_json(send, 404, _error("not_found_error", message))
            return
        body = await serving.read_body(receive)
        if body is None:
            await serving.send_json(send, 413, _error("request_too_large", "request body too large"))
            return
        await self._forward(unit, path, scope.get("query_string", b""), scope.get("headers", []), body, receive, send)

    def _upstream_headers(self, unit: _Unit, raw: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
        pairs = [(name.decode("latin-1").lower(), value.decode("latin-1")) for name, value in raw]
        listed = {token.strip().lower() for name, value in pairs if name == "connection" for token in value.split(",")}
        headers = [(name, value) for name, value in pairs if name not in _NOT_FORWARDED and name not in listed]
        if unit.api_key is not None:
            if unit.grant.api == "anthropic":
                headers.append(("x-api-key", unit.api_key))
            else:
                headers.append(("authorization", f"Bearer {unit.api_key}"))
        return headers

    def _upstream_url(self, unit: _Unit, path: str, query: bytes) -> httpx.URL:
        suffix = "/responses" if unit.grant.api == "openai" else path
        return httpx.URL(unit.upstream + suffix, query=query or None)

    async def _forward(
        self,
        unit: _Unit,
        path: str,
        query: bytes,
        raw_headers: list[tuple[bytes, bytes]],
        body: bytes,
        receive: serving.Receive,
        send: serving.Send,
    ) -> None:
        assert self._client is not None
        call = _Call(t=utc_now(), path=path, started=time.perf_counter())
        request = self._client.build_request(
            "POST",
            self._upstream_url(unit, path, query),
            headers=self._upstream_headers(unit, raw_headers),
            content=body,
        )
        with self._lock:
            unit.requests += 1
        aborted = False
        try:
            winner = await serving.first_of(
                self._pump(unit, request, call, send),
                serving.disconnected(receive),
                unit.abort.wait(),
                self._closing.wait(),
            )
            if winner == 1:
                call.error = call.error or "the agent disconnected"
            elif winner > 1:
                call.error = call.error or ("grant revoked" if winner == 2 else "gateway closed")
                aborted = True
        except serving.AbortConnection:
            aborted = True
        finally:
            self._account(unit, call)
        if aborted:
            raise serving.AbortConnection(call.error)

    def _account(self, unit: _Unit, call: _Call) -> None:
        """Add a finished call to its unit's usage (once). Called before the agent gets the end of the
        answer, so that usage read after an agent's last call includes that call."""
        with self._lock:
            if call.total_s is not None:
                return
            call.total_s = time.perf_counter() - call.started
            if call.meter is not None:
                call.meter.finish()
                if (call.status or 0) >= 400:
                    call.upstream_error = call.meter.error_message
                unit.input_tokens += call.meter.input_tokens
                unit.output_tokens += call.meter.output_tokens
            unit.calls.append(call)

    async def _pump(self, unit: _Unit, request: httpx.Request, call: _Call, send: serving.Send) -> None:
        assert self._client is not None
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            call.status = 502
            call.error = f"upstream unreachable: {one_line(exc)}"
            self._count_error(unit)
            message = f"the model gateway could not reach the upstream {_origin(request.url)}: {one_line(exc)}"
            self._account(unit, call)
            await serving.send_json(send, 502, _error("api_error", message))
            return
        try:
            call.status = response.status_code
            if response.status_code >= 400:
                call.error = f"upstream answered HTTP {response.status_code}"
                self._count_error(unit)
            call.meter = _Meter(unit.grant.api, response.headers.get("content-type", ""))
            headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in _NOT_RETURNED]
            await serving.start_response(send, response.status_code, headers)
            try:
                async for chunk in response.aiter_bytes():
                    if call.ttfb_s is None:
                        call.ttfb_s = time.perf_counter() - call.started
                    call.meter.feed(chunk)
                    await serving.send_chunk(send, chunk)
            except httpx.HTTPError as exc:
                call.error = f"upstream stream broke: {one_line(exc)}"
                if response.status_code < 400:
                    self._count_error(unit)
                raise serving.AbortConnection(call.error) from None
            self._account(unit, call)
            await serving.end_response(send)
        finally:
            await response.aclose()

    def _count_error(self, unit: _Unit) -> None:
        with self._lock:
            unit.errors += 1
