"""Runner overhead and throughput on a host profile (``local`` by default; ``--profile docker`` or ``qemu``).

Runs the reference agent on the demo's CLI task as 8 units (repeats) at concurrency 1, 2 and 4 and
prints, per concurrency: wall time, units per hour, and the median per-unit runner overhead (unit
time minus agent time: stack up, readiness, staging, setup, grading, destroy).

With ``--pool N`` the units lease from a pool stack of N units instead (brought up first, as ``pulumi up`` on
``stacks/Pulumi.<profile>.yaml`` would, and destroyed at the end): each unit is reset to a fresh sandbox,
container or guest between leases. With ``--shared-stack`` each run makes its own such stack (``shared_stack:
true``: a sandbox per -j slot, one ``up`` and one ``destroy`` for the run) instead of a stack per unit; with
``--both``, each -j runs a stack per unit and then a shared stack, side by side. With ``--pool N --checkpoint
both`` (local) the pool runs without and then with ``checkpoint: true`` (each reset a CRIU restore of the unit's
checkpoint).

    .venv/bin/python bench/bench_runner.py [--profile local|docker|qemu] [--units 8] [--jobs 1 2 4]
        [--pool 2 [--checkpoint off|on|both] | --shared-stack | --both]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import yaml
from bench_pool import with_checkpoint
from pulumi import automation as auto
from rich.console import Console

from ale_iac.engine import Engine
from ale_iac.infra.program import inline_program, pool_units
from ale_iac.profile import PoolSpec, resolve_profile
from ale_iac.provision import UpAhead
from ale_iac.runner.evaluation import run_experiment
from ale_iac.runner.experiment import load_experiment

T = TypeVar("T")
REPO = Path(__file__).resolve().parent.parent
POOL = "bench-runner-pool"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--units", type=int, default=8)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--task", default="examples/tasks/cli-log-stats")
    parser.add_argument("--profile", choices=("local", "docker", "qemu"), default="local")
    parser.add_argument("--pool", type=int, default=0, help="lease from a pool stack of this many units")
    parser.add_argument(
        "--shared-stack", action="store_true", help="one stack for each run (shared_stack: true), not one per unit"
    )
    parser.add_argument(
        "--both", action="store_true", help="at each -j, a stack per unit and then a shared stack, side by side"
    )
    parser.add_argument(
        "--checkpoint",
        choices=("off", "on", "both"),
        default="off",
        help="checkpoint: true on the local route (its pool units: with --pool or --shared-stack)",
    )
    args = parser.parse_args()
    _time_cli_calls()
    _time_held_ups()
    checkpoints = {"off": [False], "on": [True], "both": [False, True]}[args.checkpoint]
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("ALE_IAC_HOME", str(Path(tmp) / "home"))
        if not args.pool:
            arms = [False, True] if args.both else [args.shared_stack]
            rows = [
                _measure(
                    args,
                    Path(tmp),
                    {
                        "profile": _profile_file(Path(tmp), args.profile, checkpoint),
                        "shared_stack": shared,
                        "checkpoint": checkpoint,
                    },
                    jobs,
                )
                for jobs in args.jobs
                for shared in arms
                for checkpoint in checkpoints
            ]
        else:
            engine = Engine()
            rows = []
            for checkpoint in checkpoints:
                profile = resolve_profile(args.profile).profile
                if args.checkpoint != "off":
                    profile = with_checkpoint(profile, checkpoint)
                engine.up(POOL, inline_program(profile, pool_units(PoolSpec(units=args.pool), POOL), POOL))
                try:
                    source = {"pool": POOL, "checkpoint": checkpoint}
                    rows += [_measure(args, Path(tmp), source, jobs) for jobs in args.jobs]
                finally:
                    engine.destroy(POOL)
    print(f"{args.units} units of {args.task} with the scripted agent, {args.profile} profile")
    print(f"{'source':>26} {'jobs':>4} {'wall s':>8} {'units/hour':>10} {'overhead/unit s':>16} {'agent s':>8}")
    for label, jobs, wall, over, agent, _ in rows:
        print(f"{label:>26} {jobs:>4} {wall:8.1f} {3600 * args.units / wall:10.0f} {over:16.2f} {agent:8.2f}")
    print("median seconds per phase:")
    for label, jobs, *_, phases in rows:
        cells = ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in phases.items())
        print(f"  {label}, -j {jobs}: {cells}")
    for (label, jobs), lines in ENGINE_LINES.items():
        for line in lines:
            print(f"  {label}, -j {jobs}: {line}")


def _profile_file(tmp: Path, name: str, checkpoint: bool) -> str:
    """The shipped profile, or a copy of it whose route has ``checkpoint: true`` (local only)."""
    if not checkpoint:
        return name
    if name != "local":
        raise SystemExit("--checkpoint is for the local profile")
    document = yaml.safe_load((REPO / "stacks" / "Pulumi.local.yaml").read_text())
    profile = document["config"]["ale-iac:profile"]
    profile["snapshots"][profile["default_snapshot"]]["checkpoint"] = True
    path = tmp / "Pulumi.local-checkpoint.yaml"
    path.write_text(yaml.safe_dump(document))
    return str(path)


Row = tuple[str, int, float, float, float, dict[str, list[float]]]
"""source, -j, wall seconds, median overhead per unit, median agent seconds, seconds per phase."""

ENGINE_LINES: dict[tuple[str, int], list[str]] = {}
"""Per (source, concurrency): the engine-time summary of that run's stacks."""
CLI_CALLS: dict[str, list[tuple[str, float]]] = {}
"""Per stack: each Pulumi CLI call the run made on it (operation, seconds), timed around the SDK's call."""


def _time_cli_calls() -> None:
    """Wrap the SDK's ``PulumiCommand.run`` (what every engine operation ends in) to time each CLI call."""
    plain = auto.PulumiCommand.run

    def timed(self: auto.PulumiCommand, args: list[str], *rest: object, **kw: object) -> object:
        words = [a for a in args if not a.startswith("-")]
        stack = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--stack"), words[-1] if words else "")
        start = time.perf_counter()
        try:
            return plain(self, args, *rest, **kw)  # type: ignore[arg-type]
        finally:
            operation = " ".join(words[:2]) if words[:1] == ["stack"] else (words[0] if words else "")
            CLI_CALLS.setdefault(stack, []).append((operation, time.perf_counter() - start))

    auto.PulumiCommand.run = timed  # type: ignore[method-assign]


HELD: dict[str, float] = {}
"""Per stack whose ``up`` started ahead of its unit's turn (``UpAhead``): the seconds its program waited."""
TURN: dict[str, float] = {}
"""Per such stack: the seconds from its unit's turn to the end of the ``up`` (``UpAhead.go``)."""


def _time_held_ups() -> None:
    """Wrap ``UpAhead``'s wait for the unit's turn, so that the time an ``up`` was held is not counted as
    engine time (the CLI waits idle meanwhile), and its ``go``: the part of the ``up`` on the critical path."""
    UpAhead._wait = _timed(UpAhead._wait, HELD)  # type: ignore[method-assign,assignment]
    UpAhead.go = _timed(UpAhead.go, TURN)  # type: ignore[method-assign,assignment]


def _timed(method: Callable[[UpAhead], T], seconds: dict[str, float]) -> Callable[[UpAhead], T]:
    """``method``, recording how long each call took in ``seconds``, by the ``UpAhead``'s stack."""

    def timed(self: UpAhead) -> T:
        start = time.perf_counter()
        try:
            return method(self)
        finally:
            seconds[self.stack] = time.perf_counter() - start

    return timed


def engine_time_lines() -> list[str]:
    """Median engine time per ephemeral unit stack: all of its CLI calls, and the ``up`` alone (the part
    on the unit's critical path: ``stack init`` is made ahead, ``destroy`` runs after the unit's slot; of an
    ``up`` started ahead, from the unit's turn to its end). The time an ``up`` was held is not counted."""
    units = {stack: calls for stack, calls in CLI_CALLS.items() if stack.startswith("run-")}
    if not units:
        return []
    shared = [calls for stack, calls in units.items() if "-shared-" in stack]
    if shared:
        [calls] = shared
        total_s = sum(seconds for _, seconds in calls)
        split = ", ".join(f"{op} {seconds:.2f}" for op, seconds in calls)
        return [f"engine time of the run's shared stack: {total_s:.2f} s in {len(calls)} CLI calls ({split})"]
    total = [sum(seconds for _, seconds in calls) - HELD.get(stack, 0.0) for stack, calls in units.items()]
    ups = [TURN.get(stack, sum(seconds for op, seconds in calls if op == "up")) for stack, calls in units.items()]
    held = sum(1 for stack in units if stack in HELD)
    counts = statistics.median(len(calls) for calls in units.values())
    by_operation: dict[str, list[float]] = {}
    for stack, calls in units.items():
        for operation, seconds in calls:
            by_operation.setdefault(operation, []).append(seconds - (HELD.get(stack, 0.0) if operation == "up" else 0))
    split = ", ".join(f"{op} {statistics.median(v):.2f}" for op, v in sorted(by_operation.items()))
    return [
        f"engine time per unit stack (median of {len(units)}): {statistics.median(total):.2f} s in {counts:.0f} CLI "
        f"calls ({split}); on the unit's critical path (up): {statistics.median(ups):.2f} s; {held} of "
        f"{len(units)} ups started ahead of their unit's turn (held time not counted)"
    ]


def _measure(args: argparse.Namespace, tmp: Path, source: dict[str, object], jobs: int) -> Row:
    label = "pool stack" if "pool" in source else "shared stack" if source.get("shared_stack") else "a stack per unit"
    label += " (checkpoint)" if source.pop("checkpoint", False) else ""
    exp = tmp / "bench.yaml"
    exp.write_text(
        json.dumps(
            {
                "name": "bench",
                "agents": [str(REPO / "agents" / "scripted" / "preset.yaml")],
                "tasks": [str(REPO / args.task)],
                "repeats": args.units,
                **source,
                "output_root": str(tmp / "runs"),
            }
        )
    )
    quiet = Console(file=open(os.devnull, "w"))  # noqa: SIM115 - lives for the whole benchmark
    CLI_CALLS.clear()
    HELD.clear()
    TURN.clear()
    start = time.perf_counter()
    summary = run_experiment(load_experiment(exp, {"concurrency": jobs}), console=quiet)
    wall = time.perf_counter() - start
    bad = [o for o in summary.outcomes if o.status != "succeeded"]
    if bad:
        raise SystemExit(f"units failed: {[(o.unit_id, o.status, o.error) for o in bad]}")
    overhead = [o.duration_s - o.agent_s for o in summary.outcomes]
    agent = [o.agent_s for o in summary.outcomes]
    phases: dict[str, list[float]] = {}
    for o in summary.outcomes:
        run = json.loads((summary.run_dir / o.unit_id / "run.json").read_text())
        for name, phase in run["phases"].items():
            phases.setdefault(name, []).append(phase.get("seconds", 0.0))
    ENGINE_LINES[(label, jobs)] = engine_time_lines()
    return label, jobs, wall, statistics.median(overhead), statistics.median(agent), phases


if __name__ == "__main__":
    main()
