"""The egress proxy process on its own (no unit): a leftover of a SIGKILLed runner is found and swept, the
socket it serves is private, a bad policy file fails before it listens, and its memory stays bounded while a
slow reader downloads through it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import ssl
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from ale_iac import procs
from ale_iac.egress_policy import EgressPolicy
from ale_iac.files import unix_address
from ale_iac.substrates import egress
from tests.support.fake_internet import fake_internet

RUNNER = """
import asyncio, json, sys
from pathlib import Path
from ale_iac.egress_policy import EgressPolicy
from ale_iac.substrates.egress import UnitEgress
unit = UnitEgress("http://127.0.0.1:9", "x" * 32, EgressPolicy(allow=["allowed.test"]), root=Path(sys.argv[1]))
unit._start_proxy()  # the proxy alone: this runner is killed before it opens any channel
unit._wait_ready()
print(json.dumps([str(unit.folder), unit.proc.pid]), flush=True)
sys.stdin.read()
"""


def _group(pgid: int) -> list[int]:
    """Live (not zombie) processes of the group ``pgid``."""
    found = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except ProcessLookupError:
            continue
    return found


def test_a_sigkilled_runners_proxy_is_found_and_swept(tmp_path: Path) -> None:
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert runner.stdout is not None
        folder_text, pid = json.loads(runner.stdout.readline())
        folder = Path(folder_text)
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert folder not in egress.leftovers(tmp_path)  # its runner lives
        assert _group(pid)
    finally:
        runner.send_signal(signal.SIGKILL)
        runner.wait()
    assert procs.wait_gone(pid, None, 10)  # the proxy dies with its runner
    assert egress.leftovers(tmp_path) == [folder]
    egress.sweep(folder)
    assert not folder.exists()
    assert _group(pid) == []  # proxy.py's acceptor went with its group


def test_a_bad_policy_file_fails_before_the_proxy_listens(tmp_path: Path) -> None:
    (tmp_path / "policy.json").write_text(json.dumps({"allow": ["1.2.3.4"]}))
    argv = [sys.executable, "-m", "ale_iac.substrates.egress_proxy", "--policy", str(tmp_path / "policy.json")]
    done = subprocess.run(
        [*argv, "--socket", str(tmp_path / "s"), "--log", str(tmp_path / "l")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "is an IP address where a domain is expected" in done.stderr
    assert not (tmp_path / "s").exists()


DOWNLOAD_BYTES = 50_000_000
READ_BYTES = 64 * 1024
READ_PAUSE_S = 0.01
"""The slow reader: 64 KiB a read, a pause after each (at most 6.5 MB/s; the proxy reads its destination over
this host's veth at 150 MB/s and more)."""
SAMPLE_EVERY = 2_000_000
GROWTH_BOUND_MB = 16.0
"""Most the proxy's PSS may grow during the download: a few chunks of 1 MiB per connection in its queues, and
the allocator's slack (measured: 2 to 3 MB). proxy.py as it comes grew by 94 to 98 MB over plain HTTP (its
unbounded queue for the client, and the body it kept of the response) and by 48 MB through a tunnel (the
queue)."""


def _pss_mb(unit: egress.UnitEgress) -> float:
    """The proxy's PSS: its process and proxy.py's forked acceptor (the connection's thread runs there)."""
    assert unit.proc is not None
    pids = [unit.proc.pid, *procs.descendants(unit.proc.pid)]
    return sum(psutil.Process(pid).memory_full_info().pss for pid in pids) / 2**20


def _connected(path: Path, host: str, scheme: str) -> socket.socket | ssl.SSLSocket:
    """A connection to ``host`` through the proxy's socket: the socket itself (plain HTTP, absolute URLs), or a
    ``CONNECT`` tunnel to its port 443 with TLS over it (the fake internet's certificate is self-signed)."""
    sock = socket.socket(socket.AF_UNIX)
    with unix_address(str(path)) as address:
        sock.connect(address)
    if scheme == "http":
        return sock
    sock.sendall(f"CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)  # byte by byte: nothing of the tunnel is read past the proxy's answer
    assert head.startswith(b"HTTP/1.1 200"), head
    return ssl._create_unverified_context().wrap_socket(sock, server_hostname=host)


def _download(
    path: Path, host: str, size: int, scheme: str = "http", sample: Callable[[], float] | None = None
) -> tuple[int, float]:
    """GET ``<scheme>://host/<size>`` through the proxy's socket; with ``sample``, read slowly and take it every
    :data:`SAMPLE_EVERY` bytes. The bytes read and the highest sample."""
    target = f"http://{host}/{size}" if scheme == "http" else f"/{size}"
    with _connected(path, host, scheme) as sock:
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        read, next_sample, next_pause, peak = 0, 0, 0, 0.0
        while chunk := sock.recv(READ_BYTES):  # through TLS, a record (16 KiB) at most
            read += len(chunk)
            if sample is None:
                continue
            if read >= next_sample:
                peak, next_sample = max(peak, sample()), next_sample + SAMPLE_EVERY
            if read >= next_pause:
                time.sleep(READ_PAUSE_S)  # the slowness under test, not a wait for anything
                next_pause += READ_BYTES
    return read, peak


@pytest.mark.needs_root  # the fake internet is a network namespace
@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_slow_reader_keeps_the_proxys_memory_bounded(tmp_path: Path, scheme: str) -> None:
    """Plain HTTP (proxy.py parses the response) and a ``CONNECT`` tunnel (it only relays it)."""
    with fake_internet(["allowed.test"], tmp_path) as net:
        policy = EgressPolicy(allow=["allowed.test"], resolver=net.dns)
        unit = egress.UnitEgress("http://127.0.0.1:9", "x" * 32, policy, root=tmp_path / "egress")
        unit._start_proxy()  # the proxy alone, its socket read from here: no unit, no channel
        try:
            unit._wait_ready()
            # A first connection at full speed: proxy.py's acceptor and a connection's thread exist, and the
            # pages the acceptor shares with its parent settle (PSS before it varies by 10 MB from run to run).
            assert _download(unit.socket, "allowed.test", 1_000_000, scheme)[0] > 1_000_000
            before = _pss_mb(unit)
            size, peak = _download(unit.socket, "allowed.test", DOWNLOAD_BYTES, scheme, lambda: _pss_mb(unit))
        finally:
            attempts = asyncio.run(unit.stop())
    assert size > DOWNLOAD_BYTES
    assert [(a.host, a.allowed) for a in attempts] == [("allowed.test", True)] * 2
    assert attempts[1].bytes_in > DOWNLOAD_BYTES
    assert peak - before < GROWTH_BOUND_MB, f"the proxy grew from {before:.1f} to {peak:.1f} MB PSS"
