"""What a unit's egress policy costs: its proxy (``substrates.egress``) against a direct route, on the same
fake internet (``tests/support/fake_internet.py``: a namespace of this script's own on a /24 of 198.18.0.0/15).

    .venv/bin/python bench/bench_egress.py [--substrates local docker] [--requests 30] [--mb 50] [--units 3]

One client (raw sockets, a new connection per request, ``Connection: close``) runs on three paths:

- ``direct``: on this host, straight to the fake server (the baseline: the host's route to the namespace);
- ``proxy``: on this host, through the unit's proxy's Unix socket (the proxy alone: its check, its DNS query
  to the fake resolver, its own connection);
- ``unit``: inside the unit (the image's python3, through the computer-server), to ``127.0.0.1:4011``: the
  forwarder, the egress channel over the unit's endpoint, the proxy.

Per path: the median and p90 of ``--requests`` small GETs (about 30 bytes), and the throughput of one GET of
``--mb`` MB (the best of 3). Also the proxy's memory (RSS of its process and proxy.py's acceptor, after
start and after the requests), and for ``--units`` units a unit's ready time without a policy (start to its
endpoint's status) and what its egress adds (the proxy started and the channel opened).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil

from ale_iac import procs
from ale_iac.egress_policy import EgressPolicy
from ale_iac.images import require_image
from ale_iac.substrates.authproxy import EGRESS_PORT
from ale_iac.substrates.egress import UnitEgress
from tests.support.fake_internet import FakeInternet, fake_internet
from tests.support.sandbox import Endpoint, new_sandbox_id, run, wait_for_status

CLIENT = r"""
import json, socket, sys, time
where, host, path, count = json.loads(sys.argv[1])
def one(target):
    if isinstance(where, str):
        sock = socket.socket(socket.AF_UNIX); sock.connect(where)
    else:
        sock = socket.create_connection(tuple(where))
    sock.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    size = 0
    while chunk := sock.recv(1 << 20):
        size += len(chunk)
    sock.close()
    return size
target = path if sys.argv[2] == "direct" else f"http://{host}{path}"
times, sizes = [], []
for _ in range(count):
    start = time.perf_counter(); sizes.append(one(target)); times.append(time.perf_counter() - start)
print(json.dumps({"times": times, "sizes": sizes}))
"""


def _host_client(where: Any, host: str, path: str, count: int, mode: str) -> dict[str, Any]:
    import subprocess

    argv = [sys.executable, "-c", CLIENT, json.dumps([where, host, path, count]), mode]
    return json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)


def _unit_client(endpoint: Endpoint, host: str, path: str, count: int) -> dict[str, Any]:
    code = base64.b64encode(CLIENT.encode()).decode()
    args = json.dumps([["127.0.0.1", EGRESS_PORT], host, path, count]).replace("'", "")
    reply = run(
        endpoint, f"python3 -c \"import base64; exec(base64.b64decode('{code}'))\" '{args}' proxy", http_timeout=600
    )
    assert reply["return_code"] == 0, reply
    return json.loads(reply["stdout"].strip().splitlines()[-1])


def _figures(result: dict[str, Any], mb: int | None = None) -> dict[str, float]:
    times = sorted(result["times"])
    if mb is not None:
        assert all(size > mb * 1_000_000 for size in result["sizes"]), result["sizes"]
        return {"mb_per_s": round(mb / min(times), 1)}
    return {
        "median_ms": round(statistics.median(times) * 1000, 2),
        "p90_ms": round(times[int(len(times) * 0.9)] * 1000, 2),
    }


def _paths(net: FakeInternet, endpoint: Endpoint, egress: UnitEgress, requests: int, mb: int) -> dict[str, Any]:
    host, ip = "allowed.test", net.addresses["allowed.test"]
    big = f"/{mb * 1_000_000}"
    found: dict[str, Any] = {}
    for name, call in (
        ("direct", lambda path, n: _host_client([ip, 80], host, path, n, "direct")),
        ("proxy", lambda path, n: _host_client(str(egress.socket), host, path, n, "proxy")),
        ("unit", lambda path, n: _unit_client(endpoint, host, path, n)),
    ):
        found[name] = {**_figures(call("/", requests)), **_figures(call(big, 3), mb)}
    return found


def _memory_mb(egress: UnitEgress) -> dict[str, float]:
    """The proxy's memory: RSS and PSS (shared pages split between the proxy and its forked acceptor)."""
    assert egress.proc is not None
    pids = [egress.proc.pid, *procs.descendants(egress.proc.pid)]
    pss = sum(psutil.Process(pid).memory_full_info().pss for pid in pids)
    return {"rss": round(procs.rss_bytes(pids) / 2**20, 1), "pss": round(pss / 2**20, 1), "processes": len(pids)}


def _start(kind: str, image: Any) -> tuple[Any, Any, Endpoint]:
    if kind == "docker":
        from ale_iac.images import ensure_docker_image
        from ale_iac.substrates.docker import runtime

        spec: Any = runtime.DockerSandboxSpec(
            sandbox_id=new_sandbox_id("bench-egress"), image=ensure_docker_image(image.name)
        )
        state = runtime.start(spec)
        return runtime, state, Endpoint(state.endpoint, state.token)
    from ale_iac.substrates.local import runtime as local_runtime
    from ale_iac.substrates.local.sandboxes import LocalSandboxSpec

    state = local_runtime.start(LocalSandboxSpec(sandbox_id=new_sandbox_id("bench-egress"), rootfs=str(image.rootfs)))
    return local_runtime, state, Endpoint.of(state)


async def _ready_times(kind: str, image: Any, net: FakeInternet, policy: EgressPolicy, root: Path) -> dict[str, Any]:
    """A unit's ready time without a policy, and what starting its egress adds (its proxy and channel)."""
    started = time.monotonic()
    runtime, state, endpoint = await asyncio.to_thread(_start, kind, image)
    try:
        await asyncio.to_thread(wait_for_status, endpoint)
        ready = time.monotonic() - started
        assert endpoint.token is not None
        egress = UnitEgress(endpoint.url, endpoint.token, policy, root=root)
        begun = time.monotonic()
        await egress.start()
        added = time.monotonic() - begun
        await egress.stop()
    finally:
        await asyncio.to_thread(runtime.stop, state.sandbox_id)
    return {"ready_s": round(ready, 2), "egress_start_s": round(added, 3)}


async def measure(kind: str, net: FakeInternet, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    image = require_image("desktop")
    policy = EgressPolicy(allow=["allowed.test"], resolver=net.dns)
    runtime, state, endpoint = await asyncio.to_thread(_start, kind, image)
    try:
        await asyncio.to_thread(wait_for_status, endpoint)
        assert endpoint.token is not None
        egress = UnitEgress(endpoint.url, endpoint.token, policy, root=root)
        await egress.start()
        try:
            rss_idle = _memory_mb(egress)
            paths = await asyncio.to_thread(_paths, net, endpoint, egress, args.requests, args.mb)
            rss_used = _memory_mb(egress)
        finally:
            attempts = len(await egress.stop())
    finally:
        await asyncio.to_thread(runtime.stop, state.sandbox_id)
    ready = [await _ready_times(kind, image, net, policy, root) for _ in range(args.units)]
    return {
        "substrate": kind,
        "paths": paths,
        "proxy_memory_mb": {"idle": rss_idle, "after": rss_used},
        "attempts_logged": attempts,
        "ready": ready,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--substrates", nargs="+", default=["local", "docker"], choices=["local", "docker"])
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--mb", type=int, default=50)
    parser.add_argument("--units", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch, fake_internet(["allowed.test"], Path(scratch)) as net:
        for kind in args.substrates:
            print(json.dumps(asyncio.run(measure(kind, net, args, Path(scratch) / "egress"))), flush=True)


if __name__ == "__main__":
    main()
