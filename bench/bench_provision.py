"""Time to ready of `local` sandboxes through Pulumi: stack up -> handle -> readiness, then destroy.

Compare with bench/bench_local_sandbox.py (the same sandbox started directly, no engine) to see
the engine's share.

    .venv/bin/python bench/bench_provision.py [--runs 5] [--parallel 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from ale_iac.contract import UnitSpec
from ale_iac.engine import Engine
from ale_iac.profile import resolve_profile
from ale_iac.provision import UNIT_NAME, destroy_stack, new_stack_name, up_unit
from ale_iac.sandbox.readiness import wait_ready


def one(engine: Engine, index: int) -> tuple[float, float, float]:
    """(up seconds, ready seconds after up, destroy seconds) for one unit in its own stack."""
    profile = resolve_profile("local").profile
    stack = new_stack_name("bench", str(index))
    start = time.perf_counter()
    handle = up_unit(engine, profile, stack, UnitSpec(name=UNIT_NAME))
    up = time.perf_counter() - start
    try:
        asyncio.run(wait_ready(handle, 120))
        ready = time.perf_counter() - start - up
    finally:
        t0 = time.perf_counter()
        destroy_stack(engine, stack)
        destroy = time.perf_counter() - t0
    return up, ready, destroy


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--parallel", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        os.environ["ALE_IAC_HOME"] = home
        engine = Engine()
        single = [one(engine, i) for i in range(args.runs)]
        batches = []
        for r in range(args.runs):
            with ThreadPoolExecutor(args.parallel) as pool:
                batches.extend(pool.map(lambda i: one(engine, 1000 * (r + 1) + i), range(args.parallel)))  # noqa: B023
    print(f"{'case':<34} {'p50':>7} {'p95':>7}   (seconds; {args.runs} runs)")
    for label, rows in (("1 unit", single), (f"{args.parallel} units in parallel", batches)):
        to_ready = [u + r for u, r, _ in rows]
        for name, values in (
            ("pulumi up (create)", [u for u, _, _ in rows]),
            ("up -> ready (total)", to_ready),
            ("destroy + stack rm", [d for _, _, d in rows]),
        ):
            print(f"{label + ': ' + name:<34} {statistics.median(values):7.2f} {pct(values, 0.95):7.2f}")


if __name__ == "__main__":
    main()
