"""A fake internet for egress tests: a network namespace the test makes, behind a veth pair on a /24 of
198.18.0.0/15 (benchmarking; 198.19.x.0/24), with a DNS server (dnslib) and, per name, an HTTP server (port 80)
and an HTTPS server (port 443, a self-signed certificate made for the test) that answer with the name they
serve.

Nothing in it resolves a real name or leaves the machine: the host reaches it through the veth's connected
route only, and its DNS server knows only the names the test gives it.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SERVER = r"""
import http.server, socketserver, ssl, sys, threading, json
from dnslib import RR, QTYPE, A, RCODE
from dnslib.server import DNSServer, BaseResolver

names = json.loads(sys.argv[1]); dns_ip = sys.argv[2]; cert, key = sys.argv[3], sys.argv[4]

class Resolver(BaseResolver):
    def resolve(self, request, handler):
        reply = request.reply()
        name = str(request.q.qname).rstrip(".").lower()
        if name in names and request.q.qtype == QTYPE.A:
            reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(names[name]), ttl=5))
        elif name not in names:
            reply.header.rcode = RCODE.NXDOMAIN
        return reply

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        size = int(self.path.rsplit("/", 1)[-1]) if self.path.rsplit("/", 1)[-1].isdigit() else 0
        body = (f"hello from {self.server.server_address[0]}".encode() + b"." * size)
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass

class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); context.load_cert_chain(cert, key)
for ip in sorted(set(names.values())):
    plain = Server((ip, 80), Handler)
    tls = Server((ip, 443), Handler); tls.socket = context.wrap_socket(tls.socket, server_side=True)
    for server in (plain, tls):
        threading.Thread(target=server.serve_forever, daemon=True).start()
DNSServer(Resolver(), port=53, address=dns_ip).start_thread()
print("ready", flush=True)
sys.stdin.read()
"""


@dataclass(frozen=True)
class FakeInternet:
    namespace: str
    dns: str
    """The DNS server's address (a policy's ``resolver``)."""
    addresses: dict[str, str]
    """name -> the address its servers listen on."""
    subnet: str
    """The /24's first three octets."""


def _free_subnet() -> str:
    """A /24 of 198.19.0.0/16 (the benchmarking range's upper half: the other tests' namespaces take /30s of
    198.18.0.0/16) that no interface of this host has an address in, picked at random among those."""
    used = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True).stdout
    free = [n for n in range(256) if f" 198.19.{n}." not in used]
    return f"198.19.{free[secrets.randbelow(len(free))]}"


def _make_cert(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "cert.pem", folder / "key.pem"
    openssl = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=fake.test", "-days", "1"]
    subprocess.run(
        [*openssl, "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    return cert, key


@contextlib.contextmanager
def fake_internet(names: list[str], folder: Path) -> Iterator[FakeInternet]:
    """Serve ``names`` (each on an address of its own, ``.10`` up; names that share a host share its address
    only if listed twice) in a fresh namespace, until the block ends; then nothing of it is left."""
    tag = secrets.token_hex(3)
    namespace, host_if, ns_if = f"ale-fi-{tag}", f"fh{tag}", f"fn{tag}"
    subnet = _free_subnet()
    addresses = {name: f"{subnet}.{10 + i}" for i, name in enumerate(names)}
    dns = f"{subnet}.2"
    setup = [
        ["ip", "netns", "add", namespace],
        ["ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if],
        ["ip", "link", "set", ns_if, "netns", namespace],
        ["ip", "addr", "add", f"{subnet}.1/24", "dev", host_if],
        ["ip", "link", "set", host_if, "up"],
        ["ip", "netns", "exec", namespace, "ip", "link", "set", "lo", "up"],
        ["ip", "netns", "exec", namespace, "ip", "addr", "add", f"{dns}/24", "dev", ns_if],
        *(
            ["ip", "netns", "exec", namespace, "ip", "addr", "add", f"{ip}/32", "dev", ns_if]
            for ip in sorted(set(addresses.values()))
        ),
        ["ip", "netns", "exec", namespace, "ip", "link", "set", ns_if, "up"],
    ]
    server: subprocess.Popen[str] | None = None
    try:
        for argv in setup:
            subprocess.run(argv, check=True, capture_output=True)
        cert, key = _make_cert(folder)
        argv = [sys.executable, "-c", SERVER, json.dumps(addresses), dns, str(cert), str(key)]
        server = subprocess.Popen(
            ["ip", "netns", "exec", namespace, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        yield FakeInternet(namespace, dns, addresses, subnet)
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run(["ip", "link", "del", host_if], check=False, capture_output=True)
        subprocess.run(["ip", "netns", "del", namespace], check=False, capture_output=True)
