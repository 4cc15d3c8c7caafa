"""A ``docker`` pool unit's reset on two builds of the ``desktop`` image side by side, alternating, in one run.

A reset is what happens between two leases of a pool unit: ``runtime.reset`` removes the old container (its
network and volumes too) and starts a fresh one of the same spec under the same id, then the runner waits until
its computer-server runs a command and takes a screenshot (``wait_ready``). Timed in its two parts, with the CPU
time each process of the fresh unit spent by the time it was ready (openbox, the computer-server, ...).

* ``before``: a unit of an earlier build still in the engine (``--before-tag``; by default the newest other
  ``ale-iac/desktop`` tag). desktop-c88734330cf7: the last build whose font folders had fractional mtimes, so
  that every fontconfig cache was stale once exported as a tar layer.
* ``after``: a unit of the current build (``ale_iac.images.ensure_docker_image``).

Both have the ``docker`` profile's shape (1 vCPU, 2 GB).

    .venv/bin/python bench/bench_docker_reset.py [--rounds 10] [--before-tag ale-iac/desktop:<hash12>]

Needs root, the Docker engine (``scripts/dockerd.sh``) and the ``desktop`` image. Removes what it starts.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from pydantic import SecretStr

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ale_iac import docker_engine  # noqa: E402
from ale_iac.contract import LINUX_DESKTOP_PATHS  # noqa: E402
from ale_iac.images import ensure_docker_image  # noqa: E402
from ale_iac.sandbox.handle import SandboxHandle  # noqa: E402
from ale_iac.sandbox.readiness import wait_ready  # noqa: E402
from ale_iac.substrates.docker import runtime  # noqa: E402
from ale_iac.substrates.docker.runtime import DockerSandboxSpec, DockerSandboxState  # noqa: E402
from tests.support.sandbox import new_sandbox_id  # noqa: E402

READY_TIMEOUT_S = 60.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def handle_of(state: DockerSandboxState) -> SandboxHandle:
    return SandboxHandle(
        stack="-",
        unit=state.sandbox_id,
        provider="docker",
        endpoint=state.endpoint,
        endpoint_token=SecretStr(state.token),
        snapshot="desktop",
        image="desktop",
        resource_id=state.sandbox_id,
        paths=LINUX_DESKTOP_PATHS,
    )


def cpu_by_program(container_id: str) -> dict[str, float]:
    """CPU-seconds each program of the container has spent (user + system), by its name."""
    client = docker_engine.client()
    try:
        rows = client.containers.get(container_id).top(ps_args="-eo pid")["Processes"]
    finally:
        client.close()
    spent: dict[str, float] = defaultdict(float)
    for (pid,) in rows:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        words = [a.decode() for a in argv if a]
        name = Path(words[0]).name if words else "?"
        if name.startswith("python") and len(words) > 1:
            name = words[2] if words[1] == "-m" and len(words) > 2 else Path(words[1]).name
        spent[name] += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return dict(spent)


def reset_once(sandbox_id: str) -> tuple[float, float, dict[str, float]]:
    t0 = time.monotonic()
    state = runtime.reset(sandbox_id)
    t1 = time.monotonic()
    asyncio.run(wait_ready(handle_of(state), READY_TIMEOUT_S))
    t2 = time.monotonic()
    return t1 - t0, t2 - t1, cpu_by_program(state.container_id)


def default_before(current: str) -> str:
    client = docker_engine.client()
    try:
        tags = [
            tag
            for image in sorted(client.images.list("ale-iac/desktop"), key=lambda i: i.attrs["Created"], reverse=True)
            for tag in image.tags
            if tag != current
        ]
    finally:
        client.close()
    if not tags:
        raise SystemExit("no earlier ale-iac/desktop image in the engine: name one with --before-tag")
    return tags[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--before-tag", help="the before arm's engine image (default: the newest other build)")
    args = parser.parse_args()
    current = ensure_docker_image("desktop")
    arms = {"before": args.before_tag or default_before(current), "after": current}
    units: dict[str, str] = {}
    results: dict[str, list[tuple[float, float, dict[str, float]]]] = {arm: [] for arm in arms}
    try:
        for arm, tag in arms.items():
            spec = DockerSandboxSpec(sandbox_id=new_sandbox_id("bench"), image=tag, vcpus=1, memory_gb=2)
            units[arm] = spec.sandbox_id
            state = runtime.start(spec)
            asyncio.run(wait_ready(handle_of(state), READY_TIMEOUT_S))
        for _ in range(args.rounds):  # alternating: both arms meet the same load
            for arm in arms:
                results[arm].append(reset_once(units[arm]))
    finally:
        for sandbox_id in units.values():
            runtime.stop(sandbox_id)
    print(f"docker unit reset, {args.rounds} rounds per arm, alternating (1 vCPU, 2 GB)")
    for arm, rows in results.items():
        resets = [r[0] for r in rows]
        readies = [r[1] for r in rows]
        totals = [r[0] + r[1] for r in rows]
        programs = sorted({name for r in rows for name in r[2]})
        cpu = ", ".join(f"{name} {statistics.median(r[2].get(name, 0.0) for r in rows):.2f}" for name in programs)
        print(
            f"{arm:6s} {arms[arm]}: reset + ready p50 {statistics.median(totals):.3f} s "
            f"(runtime.reset {statistics.median(resets):.3f}, then ready {statistics.median(readies):.3f}); "
            f"max {max(totals):.3f}; CPU-s at ready, p50: {cpu}"
        )


if __name__ == "__main__":
    main()
