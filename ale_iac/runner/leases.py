"""Leasing units of a pool stack so two runs never share one.

Each pool unit has a lock file ``<home>/leases/<stack>/<unit>.lock``; a run holds an exclusive
lock on it (``filelock``, an ``flock`` underneath) for as long as it uses the unit. The kernel drops
the lock when the process dies, so a crashed run never leaves a unit leased.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass

from filelock import FileLock, Timeout

from ale_iac.errors import AleIacError
from ale_iac.paths import ale_home


@dataclass
class Lease:
    stack: str
    unit: str
    lock: FileLock | None

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None


def try_lease(stack: str, units: Iterable[str]) -> Lease | None:
    folder = ale_home() / "leases" / stack
    folder.mkdir(parents=True, exist_ok=True)
    for unit in sorted(units):
        # thread_local=False: a lease is taken in the event loop and may be released from any thread.
        # No soft-lock fallback (it would outlive a crash) and the file stays (unlinking a lock file on
        # release lets two later holders lock two different files).
        lock = FileLock(
            folder / f"{unit}.lock",
            mode=0o600,
            thread_local=False,
            fallback_to_soft=False,
            preserve_lock_file=True,
        )
        try:
            lock.acquire(timeout=0)
        except Timeout:
            continue
        return Lease(stack=stack, unit=unit, lock=lock)
    return None


async def lease(stack: str, units: Iterable[str], timeout_s: float) -> Lease:
    """Wait (up to ``timeout_s``) for a free unit of the pool and lease it."""
    names = list(units)
    if not names:
        raise AleIacError(f"pool stack '{stack}' exports no units")
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while True:
        got = try_lease(stack, names)
        if got is not None:
            return got
        if time.monotonic() >= deadline:
            raise AleIacError(f"no free unit in pool '{stack}' after {timeout_s:.0f} s (all {len(names)} leased)")
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)
