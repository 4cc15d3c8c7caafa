#!/usr/bin/env python3
"""What a docker unit's walls cost: units with them and without them, one after another, on ale-iac's engine.

    .venv/bin/python bench/bench_docker_walls.py [--runs 5]

* "with": a unit as ``runtime.start`` makes it (user namespace, ale-iac's seccomp profile, its own disk).
* "without": the weakened unit of the isolation suite (the host's user namespace, the engine's default
  seccomp profile, plain engine volumes on the host's disk).
* per mode: ``start()``, start to the first 200 through the forwarder, idle memory (cgroup v1 usage and rss);
  then ``docker run --rm --network none IMAGE /bin/true`` remapped and with ``--userns=host`` (twice as many runs).

Run as root with the engine up (scripts/dockerd.sh) and the image built. Stops everything it starts.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ale_iac import docker_engine
from ale_iac.images import ensure_docker_image
from ale_iac.substrates.docker import runtime, walls
from tests.support.sandbox import Endpoint, wait_for_status


def _weak_options(_security: walls.EngineSecurity) -> tuple[dict[str, Any], list[tuple[str, bool, str]]]:
    return {"security_opt": ["no-new-privileges:true"], "userns_mode": "host"}, []


def _plain_volumes(
    engine: Any, spec: runtime.DockerSandboxSpec, labels: dict[str, str], _security: walls.EngineSecurity
) -> tuple[dict[str, dict[str, str]], list[runtime.Limit]]:
    volumes = {}
    for role, mount in runtime.VOLUMES.items():
        volume = engine.volumes.create(f"{runtime.container_name(spec.sandbox_id)}-{role}", labels=labels)
        volumes[str(volume.name)] = {"bind": mount, "mode": "rw"}
    return volumes, []


def _memory_mib(container_id: str) -> tuple[float, float]:
    folder = Path(f"/sys/fs/cgroup/memory/docker/{container_id}")
    stat = dict(line.split() for line in (folder / "memory.stat").read_text().splitlines())
    return int((folder / "memory.usage_in_bytes").read_text()) / 2**20, int(stat["total_rss"]) / 2**20


def _span(values: list[float]) -> str:
    return f"p50 {statistics.median(values):.3f} s [{min(values):.3f}-{max(values):.3f}]"


def _units(image: str, mode: str, runs: int) -> None:
    starts: list[float] = []
    readies: list[float] = []
    memory: list[tuple[float, float]] = []
    for index in range(runs):
        began = time.monotonic()
        spec = runtime.DockerSandboxSpec(sandbox_id=f"bench-walls-{mode}-{index}", image=image, memory_gb=2)
        state = runtime.start(spec)
        starts.append(time.monotonic() - began)
        try:
            wait_for_status(Endpoint(state.endpoint, state.token))
            readies.append(time.monotonic() - began)
            time.sleep(3)  # let it settle before measuring idle memory, not a readiness wait
            memory.append(_memory_mib(state.container_id))
        finally:
            runtime.stop(state.sandbox_id)
    usage = statistics.median(m[0] for m in memory)
    rss = statistics.median(m[1] for m in memory)
    print(
        f"{mode}: start() {_span(starts)}; ready {_span(readies)}; idle memory {usage:.0f} MiB usage, {rss:.0f} MiB rss"
    )


def _runs(image: str, userns: str, runs: int) -> None:
    times = []
    for _ in range(runs):
        began = time.monotonic()
        extra = ["--userns=host"] if userns == "host" else []
        argv = ["docker", "-H", docker_engine.engine_url(), "run", "--rm", "--network", "none", *extra]
        subprocess.run([*argv, "--entrypoint", "/bin/true", image], check=True)
        times.append(time.monotonic() - began)
    print(f"docker run --rm /bin/true, user namespace {userns}: {_span(times)} over {runs} runs")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    image = ensure_docker_image("desktop")
    _units(image, "with", args.runs)
    options, volumes = walls.container_options, runtime._volumes
    walls.container_options, runtime._volumes = _weak_options, _plain_volumes  # type: ignore[assignment]
    try:
        _units(image, "without", args.runs)
    finally:
        walls.container_options, runtime._volumes = options, volumes
    for userns in ("remapped", "host"):
        _runs(image, userns, args.runs * 2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
