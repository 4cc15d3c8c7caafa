"""Time to run the cloud programs under Pulumi mocks, for pools of 10, 100 and 500 units per cloud.

    .venv/bin/python bench/bench_plan.py [--sizes 10 100 500] [--repeats 3]

Each measurement is one complete program run, as ``ale-iac plan`` does it: ``declare()`` of N units
of the cloud's route from the shipped stack file, under fresh recording mocks, until every Output
has resolved (all registrations done and every unit's handle built and validated). The SDK imports
are paid once, before timing. Prints the median of ``--repeats`` runs, wall and CPU (all threads of
the process), the CPU per unit, and that figure relative to the smallest pool: linear growth means
a constant CPU ms/unit (1.00x). CPU is the figure to compare on a shared machine, where wall time
also counts the time other processes hold the cores.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pulumi

from ale_iac.infra.cloud_common import use_clock
from ale_iac.infra.declaration import UnitSpec, declare
from ale_iac.infra.mocks import RecordingMocks, run_program
from ale_iac.infra.plan import PLAN_EPOCH
from ale_iac.profile import Profile, resolve_profile

CLOUDS = {"gcloud": "cpu-free-ubuntu", "aws": "cpu-free-ubuntu", "aliyun": "cpu-free-ubuntu"}


def run_once(profile: Profile, snapshot: str, units: int) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, resources) of one program run with ``units`` units."""
    specs = [UnitSpec(name=f"u{i}", snapshot=snapshot) for i in range(units)]
    mocks = RecordingMocks(symbolic_addresses=True)
    gc.collect()  # the previous run's garbage is not this run's cost
    wall, cpu = time.perf_counter(), time.process_time()
    with use_clock(lambda: PLAN_EPOCH):
        handles: Any = run_program(
            lambda: pulumi.Output.from_input(declare(profile, specs, "bench")), mocks, stack="bench"
        )
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert len(handles) == units, "every unit's handle must resolve"
    return wall, cpu, len(mocks.resources)


def sdk_floor(resources: int) -> float:
    """CPU ms per resource of a program of ``resources`` bare GCE firewalls: the SDK's own cost."""
    import pulumi_gcp as gcp

    def program() -> Any:
        rules = [
            gcp.compute.Firewall(
                f"fw{i}",
                network="default",
                source_ranges=["10.0.0.0/8"],
                allows=[gcp.compute.FirewallAllowArgs(protocol="tcp", ports=["8000"])],
            )
            for i in range(resources)
        ]
        return pulumi.Output.all(*(rule.id for rule in rules))

    gc.collect()
    cpu = time.process_time()
    run_program(program, RecordingMocks())
    return (time.process_time() - cpu) / resources * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 500])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    # Warm-up: SDK imports and first-use costs are not part of the per-pool figures.
    for cloud, snapshot in CLOUDS.items():
        run_once(resolve_profile(cloud).profile, snapshot, 1)

    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    header = (
        f"{'cloud':8} {'units':>6} {'resources':>10} {'wall s':>8} {'CPU s':>7} {'CPU ms/unit':>12} {'vs smallest':>12}"
    )
    print(header)
    print("-" * len(header))
    for cloud, snapshot in CLOUDS.items():
        profile = resolve_profile(cloud).profile
        base = None
        for size in args.sizes:
            runs = [run_once(profile, snapshot, size) for _ in range(args.repeats)]
            wall = statistics.median(r[0] for r in runs)
            cpu = statistics.median(r[1] for r in runs)
            per_unit = cpu / size * 1000
            base = base or per_unit
            print(
                f"{cloud:8} {size:6d} {runs[0][2]:10d} {wall:8.2f} {cpu:7.2f} {per_unit:12.1f} {per_unit / base:11.2f}x"
            )
    floor = sdk_floor(2000)
    print(f"reference: 2000 bare gcp.compute.Firewall resources cost {floor:.1f} CPU ms each (SDK + mocks floor)")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak_mb:.0f} MB")


if __name__ == "__main__":
    main()
