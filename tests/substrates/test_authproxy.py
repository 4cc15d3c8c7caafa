"""The authenticating forwarder, run on its own (``python -m ale_iac.substrates.authproxy``) in front of
a small upstream on 127.0.0.1 that reports what reached it."""

from __future__ import annotations

import http.server
import json
import secrets
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

TOKEN = secrets.token_urlsafe(32)
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Recorder(http.server.BaseHTTPRequestHandler):
    """Answers every request with what it received: method, path, headers, body size and digest."""

    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[dict[str, Any]]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        record = {
            "method": self.command,
            "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body_bytes": len(body),
            "body_sum": sum(body) % 65521,
        }
        Recorder.seen.append(record)
        if self.headers.get("Upgrade"):
            self.send_response(101)
            self.send_header("Upgrade", "echo")
            self.send_header("Connection", "Upgrade")
            self.end_headers()
            self.wfile.flush()
            while chunk := self.connection.recv(4096):  # echo until the client closes
                self.connection.sendall(chunk.upper())
            self.close_connection = True
            return
        payload = json.dumps(record).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self._answer()

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture(scope="module")
def upstream() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def proxy(upstream: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    token_file = tmp_path_factory.mktemp("proxy") / "token"
    token_file.write_text(TOKEN + "\n")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ale_iac.substrates.authproxy",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            f"127.0.0.1:{upstream}",
            "--token-file",
            str(token_file),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("listening on 127.0.0.1:"), line
        yield f"http://127.0.0.1:{line.rsplit(':', 1)[1].strip()}"
    finally:
        process.kill()
        process.wait()


@pytest.fixture(autouse=True)
def fresh_records() -> None:
    Recorder.seen.clear()


def test_no_token_or_a_wrong_one_is_refused_before_the_upstream(proxy: str) -> None:
    assert httpx.get(f"{proxy}/status", timeout=10).status_code == 401
    wrong = {"Authorization": "Bearer " + secrets.token_urlsafe(32)}
    assert httpx.post(f"{proxy}/cmd", json={"x": 1}, headers=wrong, timeout=10).status_code == 401
    assert httpx.get(f"{proxy}/status", headers={"Authorization": TOKEN}, timeout=10).status_code == 401
    assert Recorder.seen == []


def test_an_authorized_request_arrives_whole_and_without_the_token(proxy: str) -> None:
    body = secrets.token_bytes(3 * 2**20)
    reply = httpx.post(f"{proxy}/cmd?x=1", content=body, headers=AUTH, timeout=30)
    assert reply.status_code == 200
    record = reply.json()
    assert record["path"] == "/cmd?x=1" and record["body_bytes"] == len(body)
    assert record["body_sum"] == sum(body) % 65521
    assert "authorization" not in record["headers"]
    assert TOKEN not in json.dumps(Recorder.seen)


def test_every_request_of_a_keep_alive_connection_is_checked(proxy: str) -> None:
    with httpx.Client(headers=AUTH, timeout=10) as client:
        assert [client.get(f"{proxy}/n{i}").json()["path"] for i in range(3)] == ["/n0", "/n1", "/n2"]
        with pytest.raises(httpx.HTTPError):  # same connection, no token: dropped, never forwarded
            client.get(f"{proxy}/sneaky", headers={"Authorization": ""})
    assert [r["path"] for r in Recorder.seen] == ["/n0", "/n1", "/n2"]


def raw_exchange(proxy: str, data: bytes) -> bytes:
    host, port = proxy.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


def test_a_chunked_request_body_is_refused(proxy: str) -> None:
    request = (
        f"POST /cmd HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nTransfer-Encoding: chunked\r\n\r\n"
        "3\r\nabc\r\n0\r\n\r\n"
    ).encode()
    assert raw_exchange(proxy, request).startswith(b"HTTP/1.1 411 ")
    assert Recorder.seen == []


def test_a_malformed_or_oversized_head_is_dropped(proxy: str) -> None:
    assert raw_exchange(proxy, b"GET / HTTP/1.1\r\nno colon here\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    two_lengths = (
        f"POST /cmd HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 3\r\nContent-Length: 10\r\n\r\nabc"
    ).encode()
    assert raw_exchange(proxy, two_lengths).startswith(b"HTTP/1.1 400 ")
    huge = b"GET / HTTP/1.1\r\nX-Pad: " + b"a" * 100_000 + b"\r\n\r\n"
    assert raw_exchange(proxy, huge) == b""
    assert Recorder.seen == []


def test_an_upgraded_connection_becomes_a_byte_pipe(proxy: str) -> None:
    host, port = proxy.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            f"GET /ws HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nUpgrade: echo\r\n"
            "Connection: Upgrade\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(4096)
        assert head.startswith(b"HTTP/1.1 101 "), head
        sock.sendall(b"hello, no headers here")
        echoed = b""
        while len(echoed) < len(b"hello, no headers here"):
            echoed += sock.recv(4096)
        assert echoed == b"HELLO, NO HEADERS HERE"
    assert [r["path"] for r in Recorder.seen] == ["/ws"]


def test_a_short_token_is_refused(tmp_path: Path) -> None:
    from ale_iac.substrates.authproxy import AuthProxy, tcp_connector

    with pytest.raises(ValueError, match="at least 16"):
        AuthProxy("short", tcp_connector("127.0.0.1", 9))


def test_the_model_channel_s_reserved_path_needs_the_token_and_is_never_forwarded(proxy: str) -> None:
    """Without the token the reserved path is refused like any other; with it, it is the forwarder's own (this
    forwarder serves no model channel: 404), and nothing of it reaches the computer-server."""
    upgrade = "Connection: Upgrade\r\nUpgrade: ale-model-channel\r\n"
    path = "/.ale-iac/model-channel"
    assert raw_exchange(proxy, f"GET {path} HTTP/1.1\r\n{upgrade}\r\n".encode()).startswith(b"HTTP/1.1 401 ")
    wrong = f"Authorization: Bearer {secrets.token_urlsafe(32)}\r\n"
    assert raw_exchange(proxy, f"GET {path} HTTP/1.1\r\n{wrong}{upgrade}\r\n".encode()).startswith(b"HTTP/1.1 401 ")
    right = f"Authorization: Bearer {TOKEN}\r\n"
    assert raw_exchange(proxy, f"GET {path}?x HTTP/1.1\r\n{right}{upgrade}\r\n".encode()).startswith(b"HTTP/1.1 404 ")
    assert Recorder.seen == []


def test_the_reserved_path_takes_only_an_upgrade_on_a_fresh_connection(tmp_path: Path, upstream: int) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    argv = [sys.executable, "-m", "ale_iac.substrates.authproxy", "--listen", "127.0.0.1:0"]
    argv += ["--upstream", f"127.0.0.1:{upstream}", "--token-file", str(token_file), "--model-listen", "127.0.0.1:0"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        endpoint = "http://" + process.stdout.readline().split(" on ")[1].strip()
        right = f"Authorization: Bearer {TOKEN}\r\n"
        path = "/.ale-iac/model-channel"
        no_upgrade = raw_exchange(endpoint, f"GET {path} HTTP/1.1\r\n{right}\r\n".encode())
        assert no_upgrade.startswith(b"HTTP/1.1 400 "), no_upgrade
        # After a forwarded request on the same connection: dropped, not answered.
        later = f"GET /status HTTP/1.1\r\n{right}\r\nGET {path} HTTP/1.1\r\n{right}Upgrade: ale-model-channel\r\n\r\n"
        assert b"101 Switching" not in raw_exchange(endpoint, later.encode())
        taken = raw_exchange(endpoint, f"GET {path} HTTP/1.1\r\n{right}Upgrade: ale-model-channel\r\n\r\n".encode())
        assert taken.startswith(b"HTTP/1.1 101 Switching Protocols\r\n"), taken
        assert [r["path"] for r in Recorder.seen] == ["/status"]
    finally:
        process.kill()
        process.wait()
