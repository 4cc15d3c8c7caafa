"""Pool leases: lease-to-ready of a reset unit waiting in a pool, and what the reset between leases costs,
per substrate.

Brings up a pool stack of units of one substrate (as ``pulumi up`` on ``stacks/Pulumi.<substrate>.yaml``
does, inline), reads its outputs once (as a run does), then repeats: lease a unit and wait until its
computer-server answers (timed: lease-to-ready, target < 0.3 s), release it (timed apart: the reset to a
fresh sandbox, container or restored guest and its readiness, which happen before the lease is free).
Destroys the pool at the end.

``--checkpoint both`` (local only) runs the same cycles on a pool whose route has ``checkpoint: true`` right after
the plain one, side by side: its resets restore each unit's CRIU checkpoint instead of booting a new sandbox.

    .venv/bin/python bench/bench_pool.py [--substrate local|docker|qemu] [--units 1] [--leases 5]
        [--checkpoint off|on|both]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ale_iac.engine import Engine
from ale_iac.infra.program import inline_program, pool_units
from ale_iac.profile import LocalRoute, PoolSpec, Profile, resolve_profile
from ale_iac.runner.provisioners import Pool, PoolProvisioner
from ale_iac.runner.status import UnitStatus
from ale_iac.sandbox.readiness import wait_ready

STACK = "bench-pool"


class _Record:
    def event(self, name: str, **fields: Any) -> None:
        del name, fields


async def _cycles(pool: Pool, leases: int) -> tuple[list[float], list[float], list[float]]:
    plan: Any = SimpleNamespace(task=SimpleNamespace(card=SimpleNamespace(snapshot=None)))
    leased: list[float] = []
    ready: list[float] = []
    resets: list[float] = []
    for _ in range(leases):
        provisioner = PoolProvisioner(pool, lease_timeout_s=60)
        start = time.perf_counter()
        handle = await provisioner.acquire(plan, _Record())
        leased.append(time.perf_counter() - start)
        await wait_ready(handle, provisioner.ready_timeout_s)
        ready.append(time.perf_counter() - start)
        start = time.perf_counter()
        outcome = await provisioner.release(UnitStatus.SUCCEEDED, 1.0)
        resets.append(time.perf_counter() - start)
        if outcome != "unit reset, lease released":
            raise SystemExit(f"release: {outcome}")
    return leased, ready, resets


def with_checkpoint(profile: Profile, checkpoint: bool) -> Profile:
    """``profile`` with ``checkpoint`` set on its default snapshot's route (a local one)."""
    route = profile.snapshots[profile.default_snapshot]
    if not isinstance(route, LocalRoute):
        raise SystemExit("--checkpoint is for the local substrate")
    routes = {**profile.snapshots, profile.default_snapshot: route.model_copy(update={"checkpoint": checkpoint})}
    return profile.model_copy(update={"snapshots": routes})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--substrate", choices=("local", "docker", "qemu"), default="local")
    parser.add_argument("--units", type=int, default=1)
    parser.add_argument("--leases", type=int, default=5)
    parser.add_argument("--checkpoint", choices=("off", "on", "both"), default="off")
    args = parser.parse_args()
    arms = {"off": [False], "on": [True], "both": [False, True]}[args.checkpoint]
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("ALE_IAC_HOME", str(Path(tmp) / "home"))
        engine = Engine()
        profile = resolve_profile(args.substrate).profile
        for checkpoint in arms:
            if args.checkpoint != "off":
                profile = with_checkpoint(profile, checkpoint)
            engine.up(STACK, inline_program(profile, pool_units(PoolSpec(units=args.units), STACK), STACK))
            try:
                start = time.perf_counter()
                pool = Pool.read(engine, STACK)
                read_s = time.perf_counter() - start
                # The first lease of a fresh pool: its sandbox may still be booting; not counted.
                asyncio.run(_cycles(pool, 1))
                leased, ready, resets = asyncio.run(_cycles(pool, args.leases))
            finally:
                engine.destroy(STACK)
            _report(args, checkpoint, read_s, leased, ready, resets)


def _report(
    args: argparse.Namespace,
    checkpoint: bool,
    read_s: float,
    leased: list[float],
    ready: list[float],
    resets: list[float],
) -> None:
    kind = f"{args.substrate}{' (checkpoint: true)' if checkpoint else ''}"
    print(f"pool of {args.units} {kind} unit(s), {args.leases} leases of a reset unit waiting in the pool")
    print(f"outputs read once per run: {read_s:.2f} s")
    print(f"lease-to-ready s: p50 {_p(ready, 50):.3f}, p95 {_p(ready, 95):.3f}, max {max(ready):.3f} (target < 0.3)")
    print(f"  of which the lease (lock, current endpoint, token) s: p50 {_p(leased, 50):.3f}, p95 {_p(leased, 95):.3f}")
    made = {"local": "new sandbox", "docker": "new container", "qemu": "restored guest"}[args.substrate]
    made = "restored checkpoint" if checkpoint else made
    print(
        f"reset of a {kind} unit ({made} + ready) s: p50 {_p(resets, 50):.2f}, p95 {_p(resets, 95):.2f}, "
        f"max {max(resets):.2f}"
    )


def _p(values: list[float], percent: int) -> float:
    """The ``percent``-th percentile (inclusive method: within the values measured)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[percent - 1]


if __name__ == "__main__":
    main()
