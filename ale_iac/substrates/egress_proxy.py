"""A unit's egress proxy: proxy.py (a maintained HTTP proxy from PyPI) with one plugin that checks every
destination against the unit's :class:`~ale_iac.egress_policy.EgressPolicy` and logs every attempt.

Run as its own process per unit (``python -m ale_iac.substrates.egress_proxy --policy F --socket S --log L``),
started and stopped by :mod:`ale_iac.substrates.egress`. It listens on a Unix socket in the unit's egress
folder (0700): only this host's channel for that unit connects to it (the unit reaches it over its own
endpoint, with its token: ``substrates.channel``), so no other unit or host user can use it.

Per attempt (HTTP ``CONNECT`` and plain HTTP with an absolute URL), :class:`EgressPlugin`:

1. resolves the name itself (the unit has no DNS): with the policy's ``resolver`` (dnslib, UDP) or this
   host's resolver; an address given as the destination is taken as it is;
2. asks the policy for a verdict with every resolved address (deny wins, reserved ranges and this host's own
   addresses are always refused);
3. refuses with 403 and logs it, or lets proxy.py connect to *the address it checked* (``resolve_dns``: the name is
   not resolved a second time, so a rebinding answer cannot slip in between) and logs the attempt when the
   connection ends, with the bytes proxy.py counted.

The log is JSON lines (:data:`LOG_FIELDS`), appended by the proxy's threads; the host reads it back.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Final

import psutil
from proxy.http.exception import HttpRequestRejected
from proxy.http.parser import HttpParser, httpParserStates, httpParserTypes
from proxy.http.proxy import HttpProxyBasePlugin, HttpProxyPlugin

from ale_iac.egress_policy import EgressPolicy, IpAddress, Verdict

POLICY_ENV: Final = "ALE_IAC_EGRESS_POLICY"
LOG_ENV: Final = "ALE_IAC_EGRESS_LOG"
LOG_FIELDS: Final = ("time", "host", "port", "method", "allowed", "reason", "address", "bytes_out", "bytes_in")
"""One attempt: when it began (UTC epoch seconds), the destination as asked, the method (CONNECT, GET, ...),
the verdict and its rule, the address connected to, bytes the proxy parsed from the unit (for a CONNECT
tunnel: its request head only) and bytes from the destination."""
DNS_TIMEOUT_S: Final = 3.0
BUFFER: Final = 1 << 20
"""proxy.py's receive and send sizes (its defaults, 128 and 64 KiB, cap a download through it at about a
tenth of this host's loopback rate: bench/bench_egress.py)."""
PLUGINS: Final = "ale_iac.substrates.egress_proxy.BoundedProxy,ale_iac.substrates.egress_proxy.EgressPlugin"
"""By their importable names: run as ``-m``, this module is ``__main__``."""
CLIENT_QUEUE_BYTES: Final = 2 * BUFFER
"""Most bytes from a destination queued for a slower client, per connection, before the proxy stops reading
from the destination (:class:`BoundedProxy`)."""

_lock = threading.Lock()
_state: dict[str, Any] = {}


def _policy() -> EgressPolicy:
    policy = _state.get("policy")
    if policy is None:
        policy = _state["policy"] = EgressPolicy.model_validate_json(Path(os.environ[POLICY_ENV]).read_text())
        _state["host_addresses"] = _host_addresses()
    assert isinstance(policy, EgressPolicy)
    return policy


def _host_addresses() -> frozenset[str]:
    """This host's own addresses, refused as destinations (the proxy runs on the host: they lead to it)."""
    found = {
        str(ipaddress.ip_address(addr.address.split("%")[0]))
        for addrs in psutil.net_if_addrs().values()
        for addr in addrs
        if addr.family in (socket.AF_INET, socket.AF_INET6)
    }
    return frozenset(found)


def write_log(entry: dict[str, Any]) -> None:
    line = json.dumps({key: entry.get(key) for key in LOG_FIELDS}, separators=(",", ":")) + "\n"
    with _lock, open(os.environ[LOG_ENV], "a", encoding="utf-8") as out:
        out.write(line)


def resolve(name: str, resolver: str | None) -> list[IpAddress]:
    """The addresses of ``name``: from ``resolver`` (A and AAAA over UDP) or this host's resolver."""
    try:
        return [ipaddress.ip_address(name.strip("[]"))]
    except ValueError:
        pass
    if resolver is None:
        try:
            infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
        except OSError:
            return []
        return list(dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos))
    from dnslib import QTYPE, DNSRecord  # type: ignore[import-untyped]  # dnslib ships no type hints

    found: list[IpAddress] = []
    for qtype in ("A", "AAAA"):
        try:
            reply = DNSRecord.parse(DNSRecord.question(name, qtype).send(resolver, 53, timeout=DNS_TIMEOUT_S))
        except (OSError, ValueError):
            continue
        found += [ipaddress.ip_address(str(rr.rdata)) for rr in reply.rr if rr.rtype in (QTYPE.A, QTYPE.AAAA)]
    return found


class BodilessResponse(HttpParser):
    """proxy.py's response parser, keeping none of the body it forwards. proxy.py parses a plain-HTTP response
    (its state says when the response ends) and keeps its whole body meanwhile, by concatenating ``bytes``: a
    50 MB download was 50 MB in the proxy, copied anew for every chunk. Here the body is counted, not kept."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.body_received = 0

    def _process_body(self, raw: memoryview) -> tuple[bool, memoryview]:
        if self._is_chunked_encoded or not self._content_expected:
            more, rest = super()._process_body(raw)
            if self.chunk is not None:
                self.chunk.body = b""  # the chunks parsed so far: forwarded already
            self.body = None
            return more, rest
        self.state = httpParserStates.RCVING_BODY
        length = int(self.header(b"content-length"))
        wanted = length - self.body_received
        self.body_received += min(wanted, len(raw))
        if self.body_received == length:
            self.state = httpParserStates.COMPLETE
        return len(raw) > 0, raw[wanted:]


class BoundedProxy(HttpProxyPlugin):
    """proxy.py's own proxy plugin (run with ``--disable-http-proxy`` in its place) with its memory bounded
    whatever the reader's speed. proxy.py reads the destination whenever it is readable and queues every chunk
    for the client without a bound, and keeps a plain-HTTP response's body (:class:`BodilessResponse`): a 50 MB
    download to a slow reader was 60 MB more in the proxy (``tests/substrates/test_egress_proxy.py``). Here,
    while more than :data:`CLIENT_QUEUE_BYTES` wait in the client's queue, the destination is not read: the
    kernel's buffers, then TCP's window, hold the rest (backpressure)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.response = BodilessResponse(httpParserTypes.RESPONSE_PARSER)

    async def get_descriptors(self) -> tuple[list[int], list[int]]:
        readers, writers = await super().get_descriptors()
        upstream = self.upstream
        if upstream is None or upstream.closed or upstream.connection is None:
            return readers, writers
        if sum(len(chunk) for chunk in self.client.buffer) > CLIENT_QUEUE_BYTES:
            readers = [fd for fd in readers if fd != upstream.connection.fileno()]
        return readers, writers


class EgressPlugin(HttpProxyBasePlugin):
    """The policy check, one instance per client connection (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.attempt: dict[str, Any] | None = None

    def before_upstream_connection(self, request: HttpParser) -> HttpParser | None:
        host = (request.host or b"").decode("ascii", errors="replace")  # an IDN arrives as its A-label (xn--)
        port = int(request.port or 0)
        policy = _policy()
        addresses = resolve(host, policy.resolver) if host else []
        verdict = policy.verdict(host, port, addresses, _state["host_addresses"]) if host else _no_host()
        self.attempt = {
            "time": round(time.time(), 3),
            "host": host,
            "port": port,
            "method": (request.method or b"").decode(errors="replace"),
            "allowed": verdict.allowed,
            "reason": verdict.reason,
            "address": str(addresses[0]) if addresses else None,
        }
        if not verdict.allowed:
            write_log({**self.attempt, "bytes_out": int(request.total_size), "bytes_in": 0})
            raise HttpRequestRejected(status_code=403, reason=b"Forbidden by the egress policy")
        return request

    def resolve_dns(self, host: str, port: int) -> tuple[str | None, None]:
        """Connect to the address the policy checked, never to a second resolution of the name."""
        return (self.attempt["address"] if self.attempt else None), None

    def on_access_log(self, context: dict[str, Any]) -> dict[str, Any] | None:
        if self.attempt is not None and self.attempt["allowed"]:
            bytes_out = int(context.get("request_bytes") or 0)
            write_log({**self.attempt, "bytes_out": bytes_out, "bytes_in": int(context.get("response_bytes") or 0)})
        return None


def _no_host() -> Verdict:
    return Verdict(allowed=False, reason="no destination host (not a proxy request)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", type=Path, required=True, help="the policy as JSON")
    parser.add_argument("--socket", type=Path, required=True, help="the Unix socket to listen on")
    parser.add_argument("--log", type=Path, required=True, help="the attempts log (JSON lines)")
    args = parser.parse_args(argv)
    os.environ[POLICY_ENV] = str(args.policy)
    os.environ[LOG_ENV] = str(args.log)
    _policy()  # a bad policy file fails here, before the socket exists
    from proxy.proxy import Proxy

    flags = ["--unix-socket-path", str(args.socket), "--disable-http-proxy", "--plugins", PLUGINS, "--threaded"]
    flags += ["--num-acceptors", "1", "--num-workers", "1", "--log-level", "WARNING", "--timeout", "30"]
    for name in ("client-recvbuf", "server-recvbuf", "max-sendbuf"):
        flags += [f"--{name}-size", str(BUFFER)]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with Proxy(flags):
        stop.wait()
        if os.getpgid(0) == os.getpid():
            # Leader of a group of its own (as substrates.egress starts it): end the acceptor and this process at
            # once. Every attempt is already in the log (each line is written and closed as it happens), and
            # proxy.py's own shutdown takes about 3 s, a unit's release waiting for it.
            os.killpg(0, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
