"""Which live run owns which ephemeral stack, so ``ale-iac gc`` can tell orphans from work in flight.

A run writes ``<home>/runs/<run id>.json`` with its pid (and the pid's start time, so a recycled pid
is not mistaken for it) and claims every stack *before* bringing it up. A stack named ``run-*``
that no live run claims was left by a crash and may be destroyed.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from ale_iac import procs
from ale_iac.files import write_json_atomic
from ale_iac.paths import ale_home


def runs_dir() -> Path:
    return ale_home() / "runs"


@dataclass(frozen=True)
class RunClaim:
    run_id: str
    pid: int
    pid_start: float | None
    run_dir: str
    stacks: list[str]
    retained: list[str]

    @property
    def alive(self) -> bool:
        return procs.is_running(self.pid, self.pid_start)


class RunRegistry:
    """The current process's claims. Thread-safe; the file is rewritten atomically on each change."""

    def __init__(self, run_id: str, run_dir: Path, keep_retained: bool = False) -> None:
        """``keep_retained``: a resumed run keeps the stacks its earlier attempt retained."""
        self.run_id = run_id
        self.run_dir = run_dir
        self.path = runs_dir() / f"{run_id}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._stacks: list[str] = []
        earlier = next((c for c in read_claims() if c.run_id == run_id), None) if keep_retained else None
        self._retained: list[str] = list(earlier.retained) if earlier else []
        self._lock = threading.Lock()
        self._write()

    def _write(self) -> None:
        data = {
            "run_id": self.run_id,
            "pid": os.getpid(),
            "pid_start": procs.start_time(os.getpid()),
            "run_dir": str(self.run_dir),
            "stacks": self._stacks,
            "retained": self._retained,
        }
        write_json_atomic(self.path, data)

    def claim(self, stack: str) -> None:
        with self._lock:
            self._stacks.append(stack)
            self._write()

    def release(self, stack: str) -> None:
        with self._lock:
            if stack in self._stacks:
                self._stacks.remove(stack)
                self._write()

    def retain(self, stack: str) -> None:
        """Keep the stack on purpose (cleanup mode): gc leaves it alone until it is destroyed by hand."""
        with self._lock:
            if stack in self._stacks:
                self._stacks.remove(stack)
            self._retained.append(stack)
            self._write()

    @property
    def stacks(self) -> list[str]:
        with self._lock:
            return list(self._stacks)

    @property
    def retained(self) -> list[str]:
        with self._lock:
            return list(self._retained)

    def close(self) -> None:
        """End of the run: forget it, unless it retained stacks (their record keeps gc off them)."""
        with self._lock:
            if self._retained:
                self._write()
            else:
                self.path.unlink(missing_ok=True)


def read_claims() -> list[RunClaim]:
    claims = []
    for path in sorted(runs_dir().glob("*.json")):
        try:
            data = json.loads(path.read_text())
            claims.append(
                RunClaim(
                    run_id=data["run_id"],
                    pid=int(data["pid"]),
                    pid_start=data.get("pid_start"),
                    run_dir=data.get("run_dir", ""),
                    stacks=list(data.get("stacks", [])),
                    retained=list(data.get("retained", [])),
                )
            )
        except (OSError, ValueError, KeyError):
            continue
    return claims
