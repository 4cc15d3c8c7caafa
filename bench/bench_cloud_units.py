"""Engine time of a run of cloud units: a stack per unit against the run's shared stack (``shared_stack: true``).

The cloud is a MOCK: no cloud API or provider plugin is reachable here, so the ``gcp`` provider plugin the real
Pulumi CLI talks to is ``tests/support/mock_cloud_plugin.py`` (served from this process, attached with
``PULUMI_DEBUG_PROVIDERS``), which answers every create at once. Everything else is real: the CLI, the file
backend, ale-iac's gcloud program (VM, firewall rules, egress walls per unit), the runner's provisioning code.
The mock's VMs run no computer-server, so a recreated sandbox's readiness check is skipped (named below) and
each unit's work is a sleep drawn from ``--work`` (seeded: both paths get the same durations).

* **a stack per unit** (today's path for a cloud profile): per unit, ``stack init``, ``up`` of its one unit,
  ``destroy``, in ``--jobs`` threads, as the runner's ``StackProvisioner`` does (without its ``up`` held ahead);
* **shared stack**: the runner's own ``SharedStack``: ``min(jobs, units)`` sandboxes in stacks of at most
  ``--shard-units`` (``shared_stack.SHARD_UNITS``), an ``up`` each; its slot provisioners hand them to the units
  (``--jobs`` at a time); each ending unit's sandbox is recreated for a unit still to come or removed, in targeted
  updates that units ending together share; a ``destroy`` per stack.

Printed per path: wall time, the CLI calls and their summed wall time ("engine time", as bench_runner counts it),
the CPU seconds of the CLI processes (children of this process) and of this process (the programs and the mock
plugin run here), and the CLI's peak memory (summed RSS of its processes) per unit in flight.

    .venv/bin/python bench/bench_cloud_units.py [--units 100] [--jobs 10 100] [--work 5 15] [--shard-units 16 100]
        [--skip-per-unit-at 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
from pulumi import automation as auto

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ale_iac.contract import Shape, UnitSpec  # noqa: E402
from ale_iac.engine import Engine  # noqa: E402
from ale_iac.provision import destroy_stack, up_unit  # noqa: E402
from ale_iac.runner import shared_slots, shared_stack  # noqa: E402
from ale_iac.runner.run_claims import RunRegistry  # noqa: E402
from ale_iac.runner.shared_stack import SharedStack  # noqa: E402
from ale_iac.runner.status import UnitStatus  # noqa: E402
from tests.support.cloud import gcloud_route, profile  # noqa: E402
from tests.support.mock_cloud_plugin import serving  # noqa: E402

CALLS: list[tuple[str, float]] = []
"""Every Pulumi CLI call: (operation, seconds)."""
_calls_guard = threading.Lock()


def _time_cli_calls() -> None:
    plain = auto.PulumiCommand.run

    def timed(self: auto.PulumiCommand, args: list[str], *rest: Any, **kw: Any) -> Any:
        start = time.perf_counter()
        try:
            return plain(self, args, *rest, **kw)
        finally:
            words = [a for a in args if not a.startswith("-")]
            operation = " ".join(words[:2]) if words[:1] == ["stack"] else words[0]
            operation += " --target" if "--target" in args else ""
            with _calls_guard:
                CALLS.append((operation, time.perf_counter() - start))

    auto.PulumiCommand.run = timed  # type: ignore[method-assign]


@contextmanager
def _cli_memory() -> Iterator[list[float]]:
    """Sample the summed RSS (MiB) of this process's ``pulumi`` CLI children every 50 ms; yields the samples."""
    samples: list[float] = []
    stop = threading.Event()
    me = psutil.Process()

    def sample() -> None:
        while not stop.wait(0.05):
            total = 0
            for child in me.children(recursive=True):
                try:
                    if child.name() == "pulumi":
                        total += child.memory_info().rss
                except psutil.Error:
                    continue
            samples.append(total / 2**20)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join()


def _cpu() -> tuple[float, float]:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = resource.getrusage(resource.RUSAGE_SELF)
    return children.ru_utime + children.ru_stime, own.ru_utime + own.ru_stime


def _spec(name: str) -> UnitSpec:
    return UnitSpec(name=name, snapshot="g", labels={"run": "bench"})


def per_unit(engine: Engine, works: list[float], jobs: int) -> None:
    cloud = profile({"g": gcloud_route()})

    def one(index: int) -> None:
        stack = f"bench-unit-{index}"
        engine.init(stack)
        up_unit(engine, cloud, stack, _spec("u0"), None, True)
        time.sleep(works[index])
        destroy_stack(engine, stack)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, range(len(works))))


class _Record:
    """What a provisioner writes to a unit's record: nothing kept here."""

    def event(self, name: str, **fields: object) -> None:
        del name, fields


def shared(engine: Engine, works: list[float], jobs: int, home: Path) -> int:
    """The shared stack's path through the runner's own ``SharedStack`` (its shares, its slot provisioners);
    returns how many stacks it made."""
    cloud = profile({"g": gcloud_route()})
    plans: list[Any] = [SimpleNamespace(task=SimpleNamespace(card=SimpleNamespace(snapshot="g", resources=Shape())))]
    plans *= len(works)
    stack = SharedStack(engine, cloud, "bench-run", RunRegistry("bench-run", home / "run"))
    stack.open(plans, jobs)

    async def run() -> None:
        # As the runner sizes it (runner/evaluation.py): each unit's give-back waits in a thread for its update.
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=max(8, jobs * 3)))
        limit = asyncio.Semaphore(jobs)

        async def unit(index: int) -> None:
            provisioner = stack.provisioner_for(plans[index], 600)
            async with limit:
                await provisioner.acquire(plans[index], _Record())  # type: ignore[arg-type]
                await asyncio.sleep(works[index])
            outcome = await provisioner.release(UnitStatus.SUCCEEDED)
            assert outcome in (shared_slots.RECREATED, shared_slots.REMOVED), outcome

        await asyncio.gather(*(unit(i) for i in range(len(works))))

    try:
        asyncio.run(run())
    finally:
        stack.close()
    return len(stack.stacks)


def measure(label: str, path: Callable[[], object], units: int, jobs: int) -> None:
    CALLS.clear()
    cpu_before = _cpu()
    start = time.perf_counter()
    with _cli_memory() as memory:
        extra = path()
    wall = time.perf_counter() - start
    cli_cpu, own_cpu = (after - before for after, before in zip(_cpu(), cpu_before, strict=True))
    engine_s = sum(seconds for _, seconds in CALLS)
    by_op: dict[str, list[float]] = {}
    for operation, seconds in CALLS:
        by_op.setdefault(operation, []).append(seconds)
    split = ", ".join(f"{op} {len(v)}x{statistics.median(v):.2f}" for op, v in sorted(by_op.items()))
    in_flight = min(jobs, units)
    peak = max(memory, default=0.0)
    print(
        f"{label:>18} -j {jobs:<3}: wall {wall:6.1f} s; engine time {engine_s:7.1f} s in {len(CALLS)} CLI calls "
        f"({split}); CPU: CLIs {cli_cpu:6.1f} s, this process {own_cpu:5.1f} s; CLI peak RSS {peak:6.0f} MiB = "
        f"{peak / in_flight:5.1f} MiB per unit in flight ({in_flight})"
        + (f"; {extra} stack(s)" if isinstance(extra, int) else ""),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--units", type=int, default=100)
    parser.add_argument("--jobs", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--work", type=float, nargs=2, default=[5.0, 15.0], help="a unit's work: uniform, seconds")
    parser.add_argument(
        "--shard-units",
        type=int,
        nargs="+",
        default=[shared_stack.SHARD_UNITS],
        help="the shared arm once per value of shared_stack.SHARD_UNITS (sandboxes per stack)",
    )
    parser.add_argument(
        "--skip-per-unit-at",
        type=int,
        default=20,
        help="no stack-per-unit run above this -j (that many concurrent CLIs do not fit on 2 cores / 24 GiB)",
    )
    args = parser.parse_args()
    rng = random.Random(7)
    works = [rng.uniform(*args.work) for _ in range(args.units)]

    async def no_server(handle: object, timeout_s: float) -> None:
        """MOCK cloud: its VMs run no computer-server, so a recreated one is not waited for."""
        del handle, timeout_s

    shared_slots.wait_ready = no_server  # type: ignore[assignment]
    _time_cli_calls()
    print(f"{args.units} gcloud units (mock provider plugin), work {args.work[0]:.0f}-{args.work[1]:.0f} s each")
    with tempfile.TemporaryDirectory(prefix="bench-cloud-") as tmp, serving(("gcp",)) as plugins:
        os.environ["ALE_IAC_HOME"] = tmp
        with Engine(Path(tmp)) as engine:
            for jobs in args.jobs:
                if jobs <= args.skip_per_unit_at:
                    measure("stack per unit", lambda jobs=jobs: per_unit(engine, works, jobs), args.units, jobs)
                for shard in args.shard_units:
                    shared_stack.SHARD_UNITS = shard
                    measure(
                        f"shared, {shard}/stack",
                        lambda jobs=jobs: shared(engine, works, jobs, Path(tmp)),
                        args.units,
                        jobs,
                    )
        live = sum(len(plugin.live) for plugin in plugins.values())
        print(f"left in the mock cloud after the runs: {live} resources")


if __name__ == "__main__":
    main()
