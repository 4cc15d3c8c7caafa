"""What the model channel costs, per substrate: a real unit, the real forwarder in it, the host's
:class:`~ale_iac.substrates.channel.ModelChannel` and the run's gateway in this process.

    .venv/bin/python bench/bench_model_channel.py [--substrates local docker qemu gce] [--calls 50] [--mb 20]
        [--idle-s 30]

``gce`` is no substrate but a remote unit: the GCE export of ale-iac's cloud disk (the archive's own disk.raw)
booted under QEMU as GCE would (``substrates/qemu/cloud_boot.py``: GRUB, virtio-scsi, DHCP, the stand-in metadata
server its guest agent takes its token from), reached through its endpoint alone, as the runner reaches a cloud VM.

Per unit, a client inside the unit (the image's python3, run through the computer-server) makes
``--calls`` streamed model calls (about 1 kB of SSE each) to the channel's ``127.0.0.1:4010``, each on a new
connection (what pairs a reverse connection and opens a replacement) and all on one keep-alive connection;
then three calls whose answer streams ``--mb`` MB (the median one counts). The same client code runs on this
host against the gateway directly for the baseline, so "added" is what the unit's side, the channel and the
endpoint's path add
(under qemu without KVM, the in-guest client itself runs under TCG: part of it is the guest's CPU).
Idle cost: the reverse connections held, and the memory of this process and of the unit's forwarder
(local: the supervisor; docker: the forwarder's process; qemu: the guest agent) before and after the pool opens;
then the forwarder's CPU over ``--idle-s`` seconds with no channel open and again with the channel's idle pool
open (in a guest, read from inside: the guest agent's /proc stat, in a command that waits the whole window; on
the host, the forwarder's process), with this process's CPU and, for a guest, its QEMU process's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.server
import json
import os
import secrets
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from ale_iac import profile
from ale_iac.contract import UnitSpec
from ale_iac.llm.gateway import ModelGateway
from ale_iac.sandbox.client import ComputerServerClient
from ale_iac.substrates import registry
from ale_iac.substrates.channel import ModelChannel
from ale_iac.substrates.relay import unix_connector

GUEST_FORWARDER = "ale-guest-agent"
"""The guest's forwarder (the model and egress channels are threads of the guest agent, on qemu and the cloud disk)."""

SMALL = b"".join(
    b"event: delta\ndata: " + json.dumps({"type": "delta", "i": i, "pad": "x" * 80}).encode() + b"\n\n"
    for i in range(10)
)


class Upstream(http.server.BaseHTTPRequestHandler):
    """A model API stand-in: ``small`` answers ~1 kB of SSE; a body asking ``mb`` gets that many MB."""

    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # head and body: two writes

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        megabytes = int(body.get("mb", 0))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        if megabytes:
            chunk = b"data: " + b"y" * (64 * 1024 - 8) + b"\n\n"
            self.send_header("Content-Length", str(len(chunk) * 16 * megabytes))
            self.end_headers()
            for _ in range(16 * megabytes):
                self.wfile.write(chunk)
            return
        self.send_header("Content-Length", str(len(SMALL)))
        self.end_headers()
        self.wfile.write(SMALL)

    def log_message(self, *_args: object) -> None:
        pass


CLIENT = r"""
import http.client, json, socket, sys, time
host, port, token, calls, mb = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
body = json.dumps({"model": "m", "max_tokens": 1, "stream": True, "messages": [{"role": "user", "content": "b"}]})
headers = {"x-api-key": token, "content-type": "application/json"}
def connect():
    conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.connect()
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as the CLIs' clients do
    return conn
def one(conn, payload=body):
    started = time.perf_counter()
    conn.request("POST", "/v1/messages", body=payload, headers=headers)
    reply = conn.getresponse()
    size = 0
    while chunk := reply.read(262144):
        size += len(chunk)
    assert reply.status == 200, reply.status
    return time.perf_counter() - started, size
fresh = []
for _ in range(calls):
    conn = connect()
    fresh.append(one(conn)[0]); conn.close()
conn = connect()
kept = [one(conn)[0] for _ in range(calls)]
big = json.dumps({"model": "m", "stream": True, "messages": [], "mb": mb})
streams = sorted(one(conn, big) for _ in range(3))
seconds, size = streams[1]
print(json.dumps({"fresh": fresh, "kept": kept, "stream_s": seconds, "stream_bytes": size}))
"""


def p50(values: list[float]) -> float:
    return statistics.median(values) * 1000


def rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def on_host(root: str, token: str, calls: int, mb: int) -> dict[str, Any]:
    import subprocess
    import sys

    url = httpx.URL(root)
    argv = [sys.executable, "-c", CLIENT, str(url.host), str(url.port), token, str(calls), str(mb)]
    return dict(json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout))


def forwarder_pid(kind: str, state: Any) -> int | None:
    """The host process the unit's forwarder lives in, where it is one (docker: the forwarder's own)."""
    if kind == "local":
        return int(state.supervisor_pid)
    if kind != "docker":
        return None
    for proc in psutil.process_iter(["cmdline"]):
        if any("/opt/ale-iac/authproxy.py" in part for part in proc.info["cmdline"] or []):
            with contextlib.suppress(OSError):
                if state.container_id in Path(f"/proc/{proc.pid}/cgroup").read_text():
                    return int(proc.pid)
    return None


@dataclass
class Unit:
    endpoint: str
    token: str
    forwarder_pid: int | None  # on this host (local, docker)
    qemu_pid: int | None  # the cloud disk's QEMU (not looked up for the qemu substrate's)
    ready_s: float


@contextlib.asynccontextmanager
async def host_unit(kind: str) -> AsyncIterator[Unit]:
    substrate = registry.get(kind)
    route = profile.parse_profile({"name": "b", "snapshots": {"s": {"provider": kind}}}, "bench").profile.route("s")[1]
    inputs = substrate.inputs_for(UnitSpec(name="u0"), route, "bench-u0", {})
    sandbox_id = f"bench-{secrets.token_hex(4)}"
    if kind == "qemu":
        substrate.prepare_images([route], print)
    started = time.monotonic()
    state = await asyncio.to_thread(substrate.create, sandbox_id, inputs)
    try:
        async with ComputerServerClient(state.endpoint, token=state.endpoint_token, timeout=600) as client:
            while True:
                try:
                    await client.run_command("true")
                    break
                except Exception:
                    await asyncio.sleep(0.2)
        ready_s = time.monotonic() - started
        yield Unit(state.endpoint, state.endpoint_token, forwarder_pid(kind, state), None, ready_s)
    finally:
        await asyncio.to_thread(substrate.destroy, sandbox_id, None)


@contextlib.asynccontextmanager
async def gce_unit() -> AsyncIterator[Unit]:
    """The GCE artifact booted under QEMU with the stand-in metadata server (what tests/substrates/qemu/
    test_cloud_disk.py boots), its token from there."""
    from ale_iac.images import require_image
    from ale_iac.substrates.qemu import cloud, cloud_boot

    archive = await asyncio.to_thread(cloud.ensure_cloud_export, require_image("desktop").name, "gce", print)
    with tempfile.TemporaryDirectory(prefix="bench-gce-") as folder:
        disk_raw = await asyncio.to_thread(cloud_boot.unpack_gce, archive, Path(folder) / "unpacked")
        token = secrets.token_urlsafe(32)
        guest = cloud_boot.boot(disk_raw, Path(folder) / "guest", {"ale-endpoint-token": token})
        try:
            ready_s = await asyncio.to_thread(cloud_boot.wait_ready, guest, token, time.monotonic() + 900)
            yield Unit(guest.endpoint, token, None, guest.process.pid, ready_s)
        finally:
            guest.stop()


IDLE_PROBE = r"""
import os, subprocess, sys, time
pid = int(subprocess.run(["pgrep", "-o", "-f", sys.argv[1]], capture_output=True, text=True).stdout.split()[0])
def ticks():
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])
before, started = ticks(), time.monotonic()
time.sleep(float(sys.argv[2]))
after, window = ticks(), time.monotonic() - started
name = open(f"/proc/{pid}/cmdline").read().replace("\0", " ").strip()
print((after - before) / os.sysconf("SC_CLK_TCK"), window, after / os.sysconf("SC_CLK_TCK"), name)
"""


def cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


async def idle_cpu(client: ComputerServerClient, unit: Unit, seconds: float) -> dict[str, Any]:
    """CPU seconds over ``seconds`` of idling: the unit's forwarder, this process, the unit's QEMU (and, to show
    which process was read, the forwarder's CPU since it started and its command line or pid)."""
    me = os.getpid()
    pids = {"host": me, "qemu": unit.qemu_pid, "fwd": unit.forwarder_pid}
    marks = {name: cpu_s(pid) for name, pid in pids.items() if pid}
    started = time.monotonic()
    if unit.forwarder_pid is None:  # a guest: read from inside, in one command that spans the window
        await client.write_text("/tmp/bench_idle.py", IDLE_PROBE)
        probe = f"python3 /tmp/bench_idle.py {GUEST_FORWARDER} {seconds}"
        done = await client.run_command(probe, timeout=seconds + 300)
        assert done.exit_code == 0, done.stderr
        spent, took, total, name = done.stdout.split(" ", 3)
        forwarder, window, seen = (
            float(spent),
            float(took),
            {"forwarder_cpu_since_start_s": float(total), "of": name.strip()},
        )
    else:
        await asyncio.sleep(seconds)
        forwarder, window = cpu_s(unit.forwarder_pid) - marks["fwd"], time.monotonic() - started
        seen = {"forwarder_cpu_since_start_s": cpu_s(unit.forwarder_pid), "of": f"pid {unit.forwarder_pid}"}
    wall = time.monotonic() - started
    return {
        "window_s": round(window, 1),
        "forwarder_cpu_s": round(forwarder, 3),
        "forwarder_cpu_pct": round(100 * forwarder / window, 3),
        "host_process_cpu_s": round(cpu_s(me) - marks["host"], 3),
        "qemu_cpu_pct": round(100 * (cpu_s(unit.qemu_pid) - marks["qemu"]) / wall, 1) if unit.qemu_pid else None,
        **seen,
    }


async def measure(kind: str, calls: int, mb: int, upstream: str, idle_s: float) -> dict[str, Any]:
    started_unit = gce_unit() if kind == "gce" else host_unit(kind)
    async with started_unit as unit, ComputerServerClient(unit.endpoint, token=unit.token, timeout=900) as client:
        with ModelGateway() as gateway, tempfile.TemporaryDirectory() as folder:
            grant = gateway.grant(f"bench-{kind}", api="anthropic", upstream_base_url=upstream, api_key=None)
            sock = Path(folder) / "gateway.sock"
            grant.attach_unix(sock)
            me = psutil.Process()
            pid = unit.forwarder_pid
            idle_closed = await idle_cpu(client, unit, idle_s) if idle_s else None
            unit_before = rss_mb(pid) if pid else None
            host_before = me.memory_info().rss / 2**20
            channel = ModelChannel(unit.endpoint, unit.token, unix_connector(str(sock)))
            await channel.open()
            while channel.idle < 4:
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)
            idle = {
                "connections": channel.idle,
                "host_rss_delta_mb": round(me.memory_info().rss / 2**20 - host_before, 2),
                "unit_forwarder_rss_delta_mb": round(rss_mb(pid) - unit_before, 2) if pid and unit_before else None,
            }
            idle_open = await idle_cpu(client, unit, idle_s) if idle_s else None
            await client.write_text("/tmp/bench_model_channel.py", CLIENT)
            script = f"python3 /tmp/bench_model_channel.py 127.0.0.1 4010 {grant.token} {calls} {mb}"
            done = await client.run_command(script, timeout=900)
            assert done.exit_code == 0, done.stderr
            inside = json.loads(done.stdout)
            await channel.aclose()
            direct = await asyncio.to_thread(on_host, gateway.tcp_root, grant.token, calls, mb)
    return {
        "substrate": kind,
        "ready_s": round(unit.ready_s, 1),
        "fresh_p50_ms": round(p50(inside["fresh"]), 2),
        "kept_p50_ms": round(p50(inside["kept"]), 2),
        "direct_fresh_p50_ms": round(p50(direct["fresh"]), 2),
        "direct_kept_p50_ms": round(p50(direct["kept"]), 2),
        "stream_mb_s": round(inside["stream_bytes"] / inside["stream_s"] / 2**20, 1),
        "direct_stream_mb_s": round(direct["stream_bytes"] / direct["stream_s"] / 2**20, 1),
        "idle": idle,
        "idle_cpu_no_channel": idle_closed,
        "idle_cpu_channel_open": idle_open,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--substrates", nargs="+", default=["local", "docker", "qemu"], help="and gce: see above")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--mb", type=int, default=20)
    parser.add_argument("--idle-s", type=float, default=30.0, help="idle CPU window (0: skip)")
    args = parser.parse_args()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    upstream = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for kind in args.substrates:
            print(json.dumps(asyncio.run(measure(kind, args.calls, args.mb, upstream, args.idle_s))), flush=True)
    finally:
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    main()
