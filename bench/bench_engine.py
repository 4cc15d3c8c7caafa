"""Engine overhead: `up` + `destroy` (+ stack rm) of an empty stack and of a one-dynamic-resource
stack, median of N, and the same for 4 stacks in parallel threads. Real CLI, local file backend.

Also the ephemeral unit's path (``Engine.up_new`` + ``destroy``: three CLI calls) against the SDK's
(``create_or_select`` + ``up`` + its read-backs), and with ``--many N``: the engine's CPU time and peak
memory when N units (a no-op dynamic resource each) start at once, as N one-unit stacks (in N threads,
as a run at -j N does) against one stack of N units.

With ``--unit-path``: only the ephemeral unit's path split into its three CLI calls, each CLI call
starting its own provider plugin against the engine's one shared provider process.

    .venv/bin/python bench/bench_engine.py [--runs 5] [--many 100] [--unit-path]
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


def split_cycle(engine: Engine, name: str, program: Any) -> tuple[float, float, float, float]:
    """The ephemeral unit's path, each step timed: ``stack init`` (made ahead of the unit's turn by the
    runner), ``up`` (the unit's critical path), ``destroy --remove`` (after the unit gave its slot back);
    and the CPU seconds the CLIs and provider processes spent on all three."""
    host = psutil.Process(engine.provider_pid) if engine.provider_pid else None
    cpu = _children_cpu() + (_cpu_of(host) if host else 0.0)
    t0 = time.perf_counter()
    engine.init(name)
    t1 = time.perf_counter()
    engine.up_new(name, program, initialized=True)
    t2 = time.perf_counter()
    engine.destroy(name)
    t3 = time.perf_counter()
    host = host or (psutil.Process(engine.provider_pid) if engine.provider_pid else None)
    used = _children_cpu() + (_cpu_of(host) if host else 0.0) - cpu
    return t1 - t0, t2 - t1, t3 - t2, used


def _cpu_of(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def unit_path(runs: int, home: str) -> None:
    """The unit path with each CLI call starting its own provider plugin (as before) and with the engine's
    shared provider process (now), medians of ``runs``."""
    print(f"ephemeral unit path, one no-op dynamic resource, median of {runs} (seconds):")
    print(f"  {'providers':<28} {'init':>6} {'up':>6} {'destroy':>8} {'engine total':>13} {'CPU':>6}")
    for label, shared in (("a plugin per CLI call", False), ("the engine's shared process", True)):
        with Engine(shared_providers=shared) as engine:
            split_cycle(engine, f"b-warm-{shared}", marker_program(f"{home}/w{shared}", "x"))  # imports, host start
            rows = [
                split_cycle(engine, f"b-split-{shared}-{i}", marker_program(f"{home}/p{i}", "x")) for i in range(runs)
            ]
        init, up, destroy, cpu = (statistics.median(column) for column in zip(*rows, strict=True))
        total = statistics.median(a + b + c for a, b, c, _ in rows)
        print(f"  {label:<28} {init:6.2f} {up:6.2f} {destroy:8.2f} {total:13.2f} {cpu:6.2f}")


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
    parser.add_argument("--unit-path", action="store_true", help="only the unit path, split per CLI call")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        os.environ["ALE_IAC_HOME"] = home
        if args.unit_path:
            unit_path(args.runs, home)
            return
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
