"""Leasing units of a pool stack so two runs never share one.

Each pool unit has a lock file ``<home>/leases/<stack>/<unit>.lock``; a run holds an exclusive
``flock`` on it for as long as it uses the unit. The kernel drops the lock when the process dies, so
a crashed run never leaves a unit leased.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ale_iac.errors import AleIacError
from ale_iac.paths import ale_home


@dataclass
class Lease:
    stack: str
    unit: str
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1


def _try_lock(path: Path) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def try_lease(stack: str, units: Iterable[str]) -> Lease | None:
    folder = ale_home() / "leases" / stack
    folder.mkdir(parents=True, exist_ok=True)
    for unit in sorted(units):
        fd = _try_lock(folder / f"{unit}.lock")
        if fd is not None:
            return Lease(stack=stack, unit=unit, fd=fd)
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
