#!/usr/bin/env python3
"""Benchmark of ``docker`` units (the driver, ``ale_iac/substrates/docker/runtime.py``) on the local engine.

    .venv/bin/python bench/bench_docker_sandbox.py [--runs 5] [--parallel 4] [--staging-mb 300] [--export]

* start -> first 200 from GET /status through the unit's forwarder, one unit at a time and N at once
  (p50/p95, nearest rank); ``start()`` itself (network, volumes, container, copy-in, start) separately.
* memory of an idle unit: the container's cgroup ``memory.usage_in_bytes`` (and ``total_rss``) once ready.
* staging a folder of ``--staging-mb`` MB (64 files of random bytes) into ``/data/tasks``, and pulling it
  back, by each transport: the archive API (one streamed tar) and HTTP (the computer-server's file
  commands: ``runner.tasks.upload_dir`` / ``download_dir``), in MB/s.
* ``--export``: the image export, ``tar | docker import`` of the cached rootfs under a throwaway tag
  (removed afterwards).

Run as root with the engine up (scripts/dockerd.sh) and the image built. Stops everything it starts.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ale_iac.docker_engine import client as docker_client
from ale_iac.images import _docker_import, ensure_docker_image, require_image
from ale_iac.runner.tasks import download_dir, upload_dir
from ale_iac.sandbox.client import ComputerServerClient
from ale_iac.substrates.docker import runtime


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def wait_ready(state: runtime.DockerSandboxState, deadline_s: float = 180.0) -> None:
    headers = {"Authorization": f"Bearer {state.token}"}
    end = time.monotonic() + deadline_s
    with httpx.Client(timeout=2.0, headers=headers) as client:
        while time.monotonic() < end:
            try:
                if client.get(f"{state.endpoint}/status").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)  # poll interval
    raise RuntimeError(f"{state.sandbox_id} not ready in {deadline_s} s")


def start_one(image: str, name: str, out: list[tuple[float, float]], states: list[runtime.DockerSandboxState]) -> None:
    t0 = time.monotonic()
    state = runtime.start(runtime.DockerSandboxSpec(sandbox_id=f"bench-{name}-{os.getpid()}", image=image, memory_gb=2))
    t1 = time.monotonic()
    states.append(state)
    wait_ready(state)
    out.append((t1 - t0, time.monotonic() - t0))


def memory_of(state: runtime.DockerSandboxState) -> tuple[int, int]:
    folder = Path(f"/sys/fs/cgroup/memory/docker/{state.container_id}")
    usage = int((folder / "memory.usage_in_bytes").read_text())
    stat = dict(line.split() for line in (folder / "memory.stat").read_text().splitlines())
    return usage, int(stat.get("total_rss", 0))


async def staging(state: runtime.DockerSandboxState, folder: Path, total_mb: float) -> dict[str, float]:
    out: dict[str, float] = {}
    async with ComputerServerClient(state.endpoint, token=state.token, timeout=600) as client:
        t0 = time.monotonic()
        await asyncio.to_thread(runtime.copy_in, state.container_id, folder, "/data/tasks/bench-a/input")
        out["archive upload MB/s"] = total_mb / (time.monotonic() - t0)
        with tempfile.TemporaryDirectory() as back:
            t0 = time.monotonic()
            await asyncio.to_thread(runtime.copy_out, state.container_id, "/data/tasks/bench-a/input", Path(back))
            out["archive download MB/s"] = total_mb / (time.monotonic() - t0)
        await client.run_command("rm -rf /data/tasks/bench-a")
        t0 = time.monotonic()
        await upload_dir(client, folder, "/data/tasks/bench-h/input")
        out["http upload MB/s"] = total_mb / (time.monotonic() - t0)
        with tempfile.TemporaryDirectory() as back:
            t0 = time.monotonic()
            await download_dir(client, "/data/tasks/bench-h/input", Path(back))
            out["http download MB/s"] = total_mb / (time.monotonic() - t0)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--staging-mb", type=float, default=300)
    parser.add_argument("--export", action="store_true")
    args = parser.parse_args()
    image = ensure_docker_image("desktop")
    states: list[runtime.DockerSandboxState] = []
    try:
        if args.export:
            info = require_image("desktop")
            tag = f"ale-iac/bench-export:{info.hash}"
            t0 = time.monotonic()
            _docker_import(info, tag)
            print(
                f"image export (tar | docker import, {info.size_bytes / 2**20:.0f} MiB): {time.monotonic() - t0:.1f} s"
            )
            client = docker_client()
            client.images.remove(tag, force=True)
            client.close()
        serial: list[tuple[float, float]] = []
        for i in range(args.runs):
            start_one(image, f"s{i}", serial, states)
            if i == 0:
                time.sleep(3)  # let it settle before measuring idle memory, not a readiness wait
                usage, rss = memory_of(states[0])
                print(f"idle unit memory: cgroup usage {usage / 2**20:.0f} MiB, rss {rss / 2**20:.0f} MiB")
            runtime.stop(states.pop().sandbox_id)
        ready_1 = [r for _, r in serial]
        print(
            f"one at a time ({args.runs}): start() p50 {pct([s for s, _ in serial], 50):.2f} s; "
            f"ready p50 {pct(ready_1, 50):.2f} s, p95 {pct(ready_1, 95):.2f} s"
        )
        together: list[tuple[float, float]] = []
        threads = [
            threading.Thread(target=start_one, args=(image, f"p{i}", together, states)) for i in range(args.parallel)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        ready = [r for _, r in together]
        print(f"{args.parallel} at once: ready p50 {pct(ready, 50):.2f} s, p95 {pct(ready, 95):.2f} s")
        for state in states[1:]:
            runtime.stop(state.sandbox_id)
        del states[1:]
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            per_file = int(args.staging_mb * 2**20 / 64)
            for i in range(64):
                (folder / f"f{i:02d}.bin").write_bytes(os.urandom(per_file))
            total_mb = per_file * 64 / 2**20
            for name, value in asyncio.run(staging(states[0], folder, total_mb)).items():
                print(f"staging {total_mb:.0f} MiB, {name}: {value:.1f}")
    finally:
        for state in states:
            runtime.stop(state.sandbox_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
