"""Engine overhead: `up` + `destroy` (+ stack rm) of an empty stack and of a one-dynamic-resource
stack, median of N, and the same for 4 stacks in parallel threads. Real CLI, local file backend.

Also the ephemeral unit's path (``Engine.up_new`` + ``destroy``: three CLI calls) against the SDK's
(``create_or_select`` + ``up`` + its read-backs), and with ``--many N``: the engine's CPU time and peak
memory when N units (a no-op dynamic resource each) start at once, as N one-unit stacks (in N threads,
as a run at -j N does) against one stack of N units.

    .venv/bin/python bench/bench_engine.py [--runs 5] [--many 100]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ["PYTHONPATH"] = str(REPO)

from ale_iac.engine import Engine  # noqa: E402
from tests.support.engine import Marker, marker_program  # noqa: E402


def _empty() -> None:
    """A program that declares nothing."""


def _markers(folder: str, count: int) -> Any:
    def program() -> None:
        for i in range(count):
            Marker(f"marker-{i}", f"{folder}/m{i}", "x")

    return program


def sdk_cycle(engine: Engine, name: str, program: Any) -> float:
    """The path an ephemeral unit took before: the SDK's up (select, init, up, two outputs, history)."""
    start = time.perf_counter()
    engine.up(name, program)
    engine.destroy(name)
    return time.perf_counter() - start


def unit_cycle(engine: Engine, name: str, program: Any) -> float:
    """The ephemeral unit's path now: stack init, up (outputs come from the program), destroy --remove."""
    start = time.perf_counter()
    engine.up_new(name, program)
    engine.destroy(name)
    return time.perf_counter() - start


class _Sampler:
    """Peak RSS of this process's descendants (the CLIs and their plugins), sampled every 0.1 s."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(0.1):
            total = 0
            for child in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    total += child.memory_info().rss
            self.peak = max(self.peak, total)

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def many(engine: Engine, home: str, count: int) -> None:
    """N units at once: N one-unit stacks against one N-unit stack (CPU of the engine's processes, peak RSS)."""
    print(f"{count} no-op units at once (wall s, CPU s of the CLI and plugin processes, peak RSS MiB):")
    for label, run in (
        ("per-unit stacks", lambda: _per_unit(engine, home, count)),
        ("one batched stack", lambda: _batched(engine, home, count)),
    ):
        cpu, start = _children_cpu(), time.perf_counter()
        with _Sampler() as sampler:
            run()
        wall, used = time.perf_counter() - start, _children_cpu() - cpu
        print(f"  {label:<20} wall {wall:7.1f}  cpu {used:7.1f}  peak {sampler.peak / 2**20:7.0f}")


def _per_unit(engine: Engine, home: str, count: int) -> None:
    names = [f"b-many-{i}" for i in range(count)]
    with ThreadPoolExecutor(count) as pool:
        list(pool.map(lambda n: unit_cycle(engine, n, marker_program(f"{home}/{n}", "x")), names))


def _batched(engine: Engine, home: str, count: int) -> None:
    unit_cycle(engine, "b-batched", _markers(home, count))


def cycle(engine: Engine, name: str, program: object) -> float:
    start = time.perf_counter()
    engine.up(name, program)  # type: ignore[arg-type]
    engine.destroy(name)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--many", type=int, default=0, help="also start this many units at once (0: skip)")
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
        sdk = [sdk_cycle(engine, f"b-sdk-{i}", marker_program(f"{home}/s{i}", "x")) for i in range(args.runs)]
        rows.append(("unit path before: SDK up + destroy", sdk))
        unit = [unit_cycle(engine, f"b-unit-{i}", marker_program(f"{home}/u{i}", "x")) for i in range(args.runs)]
        rows.append(("unit path now: up_new + destroy", unit))
        print(f"{'case':<40} {'median':>8} {'min':>8} {'max':>8}   (seconds, {args.runs} runs)")
        for label, values in rows:
            print(f"{label:<40} {statistics.median(values):8.2f} {min(values):8.2f} {max(values):8.2f}")
        if args.many:
            many(engine, home, args.many)


if __name__ == "__main__":
    main()
