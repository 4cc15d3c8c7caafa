"""Engine overhead: `up` + `destroy` (+ stack rm) of an empty stack and of a one-dynamic-resource
stack, median of N, and the same for 4 stacks in parallel threads. Real CLI, local file backend.

    .venv/bin/python bench/bench_engine.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ["PYTHONPATH"] = str(REPO)

from ale_iac.engine import Engine  # noqa: E402
from tests.support.engine import marker_program  # noqa: E402


def _empty() -> None:
    """A program that declares nothing."""


def cycle(engine: Engine, name: str, program: object) -> float:
    start = time.perf_counter()
    engine.up(name, program)  # type: ignore[arg-type]
    engine.destroy(name)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        os.environ["ALE_IAC_HOME"] = home
        engine = Engine()
        print(f"pulumi {engine.toolchain.version}, backend {engine.backend_url}")
        rows = []
        empty = [cycle(engine, f"b-empty-{i}", _empty) for i in range(args.runs)]
        rows.append(("empty stack, up+destroy+rm", empty))
        marker = [cycle(engine, f"b-dyn-{i}", marker_program(f"{home}/m{i}", "x")) for i in range(args.runs)]
        rows.append(("1 dynamic resource, up+destroy+rm", marker))
        par = []
        for r in range(args.runs):
            start = time.perf_counter()
            names = [f"b-par-{r}-{i}" for i in range(4)]
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(lambda n: cycle(engine, n, marker_program(f"{home}/{n}", "x")), names))
            par.append(time.perf_counter() - start)
        rows.append(("4 such stacks in parallel (wall)", par))
        print(f"{'case':<40} {'median':>8} {'min':>8} {'max':>8}   (seconds, {args.runs} runs)")
        for label, values in rows:
            print(f"{label:<40} {statistics.median(values):8.2f} {min(values):8.2f} {max(values):8.2f}")


if __name__ == "__main__":
    main()
