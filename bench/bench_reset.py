"""A ``local`` pool unit's reset, today's path and the new one side by side, alternating, in one run.

A reset is what happens between two leases of a pool unit: the old sandbox goes, a fresh one of the same spec
comes under the same id, and the runner waits until its computer-server runs a command and takes a screenshot.

* ``before``: the path up to 5b93af2. ``stop`` in order (SIGTERM to the supervisor, which stops the init, which
  stops the server; the log tails kept), ``start``, then ``wait_ready`` pausing 50 ms, doubling up to 1 s, and
  its client trying each request three times (0.1 s, then 0.4 s apart) when the connection breaks: the unit's
  forwarder closes the connection while the server is not listening yet, so one attempt took 0.5 s.
* ``after``: ``runtime.reset`` (the old sandbox killed, ``grace=False``), then ``wait_ready`` as it is now:
  a pause of a twentieth of the time waited (50 ms to 1 s), one try per request.

Each is timed in its three parts: stop, ``start()`` (the supervisor's report), and the wait until ready. A
third arm, ``10 ms poll``, is ``after`` with a wait that asks every 10 ms: not a path anyone takes (it would
poll a booting cloud VM 6,000 times a minute), the floor a readiness check by polling could reach; ``after``
minus it is what the new schedule still loses.

    .venv/bin/python bench/bench_reset.py [--rounds 10] [--before-rootfs ~/.cache/ale-iac/images/desktop-<hash>/rootfs]

``--before-rootfs`` runs the ``before`` arm on an earlier build of the ``desktop`` image (still in the cache), so
that a change of the image is measured beside the current one too (desktop-1334d1561eeb: the last build whose
font caches were stale). The sandboxes have the ``local`` profile's shape (1 vCPU, 2 GB).

Needs root and the ``desktop`` image (``scripts/setup.sh``). Stops everything it starts.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ale_iac.images import require_image  # noqa: E402
from ale_iac.sandbox.readiness import wait_ready  # noqa: E402
from ale_iac.substrates.local import runtime  # noqa: E402
from ale_iac.substrates.local.sandboxes import LocalSandboxSpec  # noqa: E402
from tests.support.sandbox import handle_of  # noqa: E402

READY_TIMEOUT_S = 60.0


def doubling() -> Callable[[float], float]:
    """The pause schedule before: 50 ms, doubled after each attempt, at most 1 s."""
    pauses = itertools.chain((0.05 * 2**n for n in range(5)), itertools.repeat(1.0))
    return lambda _waited_s: next(pauses)


def before(spec: LocalSandboxSpec, home: Path) -> tuple[float, float, float]:
    """Today's reset of 5b93af2 (``spec`` may name the rootfs of an earlier image)."""
    t0 = time.monotonic()
    runtime.stop(spec.sandbox_id, home=home)
    t1 = time.monotonic()
    state = runtime.start(spec, home=home)
    t2 = time.monotonic()
    asyncio.run(wait_ready(handle_of(state), READY_TIMEOUT_S, schedule=doubling(), request_tries=3))
    return t1 - t0, t2 - t1, time.monotonic() - t2


def after(spec: LocalSandboxSpec, home: Path, pause_s: float | None = None) -> tuple[float, float, float]:
    # runtime.reset is stop(grace=False) + start; timed in its parts the same way.
    t0 = time.monotonic()
    runtime.stop(spec.sandbox_id, home=home, grace=False)
    t1 = time.monotonic()
    state = runtime.start(spec, home=home)
    t2 = time.monotonic()
    if pause_s is None:
        asyncio.run(wait_ready(handle_of(state), READY_TIMEOUT_S))
    else:
        asyncio.run(wait_ready(handle_of(state), READY_TIMEOUT_S, schedule=lambda _waited: pause_s))
    return t1 - t0, t2 - t1, time.monotonic() - t2


def after_whole(spec: LocalSandboxSpec, home: Path) -> float:
    """``runtime.reset`` itself, then the wait: what a pool's release runs."""
    t0 = time.monotonic()
    state = runtime.reset(spec.sandbox_id, home=home)
    asyncio.run(wait_ready(handle_of(state), READY_TIMEOUT_S))
    return time.monotonic() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--before-rootfs", type=Path, help="the before arm's image rootfs (default: the current)")
    args = parser.parse_args()
    image = require_image("desktop")
    home = Path(tempfile.mkdtemp(prefix="ale-bench-reset-"))
    spec = LocalSandboxSpec(
        sandbox_id=f"bench-{secrets.token_hex(4)}", rootfs=str(image.rootfs), vcpus=1, memory_gb=2.0
    )
    old_spec = dataclasses.replace(spec, rootfs=str(args.before_rootfs or image.rootfs))
    print(f"before: {old_spec.rootfs}\nafter: {spec.rootfs}")
    arms: dict[str, Callable[[LocalSandboxSpec, Path], tuple[float, float, float]]] = {
        "before": lambda _spec, home: before(old_spec, home),
        "after": after,
        "10 ms poll": lambda spec, home: after(spec, home, pause_s=0.01),
    }
    parts: dict[str, list[tuple[float, float, float]]] = {arm: [] for arm in arms}
    whole: list[float] = []
    load = os.getloadavg()[0]
    try:
        state = runtime.start(spec, home=home)
        asyncio.run(wait_ready(handle_of(state), READY_TIMEOUT_S))
        for round_ in range(args.rounds):
            names = list(arms)
            for arm in names[round_ % len(names) :] + names[: round_ % len(names)]:  # each arm first in turn
                parts[arm].append(arms[arm](spec, home))
            whole.append(after_whole(spec, home))
    finally:
        runtime.stop(spec.sandbox_id, home=home)
        shutil.rmtree(home, ignore_errors=True)
    print(f"{args.rounds} rounds, load average {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    print("| path | stop | start() | until ready | reset + ready, p50 | p95 |")
    print("|---|---|---|---|---|---|")
    for arm, samples in parts.items():
        stops, starts, waits = zip(*samples, strict=True)
        totals = [sum(s) for s in samples]
        print(
            f"| {arm} | {statistics.median(stops):.3f} | {statistics.median(starts):.3f} | "
            f"{statistics.median(waits):.3f} | {statistics.median(totals):.3f} | {_p95(totals):.3f} |"
        )
    print(f"| after, runtime.reset as one call | | | | {statistics.median(whole):.3f} | {_p95(whole):.3f} |")


def _p95(values: list[float]) -> float:
    return sorted(values)[max(0, round(0.95 * len(values)) - 1)]


if __name__ == "__main__":
    main()
