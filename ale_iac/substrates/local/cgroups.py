"""Resource limits of a local sandbox as control groups: memory, number of tasks, CPU time.

A sandbox gets one cgroup per controller (``ale-iac-<id>``), made under the supervisor's own
cgroup so that the host's limits on ale-iac still apply above it. What was asked for and what
became of it is recorded (:class:`LimitRecord`), never silently dropped.

cgroup v1 (one hierarchy per controller) is handled in full. On a unified (v2) hierarchy the
limits need a delegated subtree whose parent holds no processes; where the kernel refuses that,
the record says so. Standard library only: the supervisor imports it.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ROOT: Final = Path("/sys/fs/cgroup")
CPU_PERIOD_US: Final = 100_000
EMPTY_TIMEOUT_S: Final = 10.0


class CgroupError(Exception):
    pass


@dataclass(frozen=True)
class LimitRecord:
    """One resource hint and what became of it on this host."""

    name: str
    requested: str
    applied: bool
    detail: str


@dataclass(frozen=True)
class Limits:
    memory_gb: float | None = None
    pids_max: int | None = None
    cpus: int | None = None
    """CPU time as a number of CPUs (a CFS quota), not a set of CPUs."""


def cgroup_name(sandbox_id: str, state_dir: str) -> str:
    """``ale-iac-<id>-<hash of the state dir>``: cgroups are host-wide, sandbox ids only unique per
    ale-iac home, so two homes (two users, two test runs) never share a sandbox's cgroups."""
    digest = hashlib.sha256(state_dir.encode()).hexdigest()[:10]
    return f"ale-iac-{sandbox_id}-{digest}"


def _own_paths() -> dict[str, str]:
    """controller (or '' for v2) -> our cgroup path, from /proc/self/cgroup."""
    paths: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def is_v1() -> bool:
    return (ROOT / "memory" / "cgroup.procs").is_file() or (ROOT / "pids" / "cgroup.procs").is_file()


class SandboxCgroups:
    """The cgroups of one sandbox: made by :meth:`apply`, joined by :meth:`join`, removed by :func:`remove`."""

    def __init__(self, sandbox_id: str, state_dir: str) -> None:
        self.name = cgroup_name(sandbox_id, state_dir)
        self.paths: list[Path] = []
        self.records: list[LimitRecord] = []

    def apply(self, limits: Limits, host_cpus: int) -> None:
        if is_v1():
            self._apply_v1(limits, host_cpus)
        else:
            self._apply_v2(limits, host_cpus)

    # --- v1 ----------------------------------------------------------------------------------

    def _v1_dir(self, controller: str) -> Path:
        base = ROOT / controller
        if not (base / "cgroup.procs").is_file():
            raise CgroupError(f"no cgroup-v1 {controller} hierarchy at {base}")
        own = _own_paths().get(controller, "/")
        folder = base / own.lstrip("/") / self.name
        folder.mkdir(exist_ok=True)
        if folder not in self.paths:
            self.paths.append(folder)
        return folder

    def _apply_v1(self, limits: Limits, host_cpus: int) -> None:
        if limits.memory_gb is not None:
            memory = int(limits.memory_gb * 2**30)
            self._set("memory_gb", str(limits.memory_gb), "memory", {"memory.limit_in_bytes": memory})
        if limits.pids_max is not None:
            self._set("pids_limit", str(limits.pids_max), "pids", {"pids.max": limits.pids_max})
        if limits.cpus is not None:
            if limits.cpus >= host_cpus:
                self.records.append(
                    LimitRecord("vcpus", str(limits.cpus), False, f"host has {host_cpus} CPUs: not restricted")
                )
            else:
                quota = limits.cpus * CPU_PERIOD_US
                self._set(
                    "vcpus", str(limits.cpus), "cpu", {"cpu.cfs_period_us": CPU_PERIOD_US, "cpu.cfs_quota_us": quota}
                )

    def _set(self, name: str, requested: str, controller: str, values: dict[str, int]) -> None:
        try:
            folder = self._v1_dir(controller)
            for key, value in values.items():
                (folder / key).write_text(str(value))
        except OSError as exc:
            self.records.append(LimitRecord(name, requested, False, f"cgroup v1 {controller}: {exc}"))
        except CgroupError as exc:
            self.records.append(LimitRecord(name, requested, False, str(exc)))
        else:
            detail = ", ".join(f"{k}={v}" for k, v in values.items())
            self.records.append(LimitRecord(name, requested, True, f"{detail} in {folder}"))

    # --- v2 ----------------------------------------------------------------------------------

    def _apply_v2(self, limits: Limits, host_cpus: int) -> None:
        wanted: dict[str, tuple[str, str, str]] = {}
        if limits.memory_gb is not None:
            memory = int(limits.memory_gb * 2**30)
            wanted["memory"] = ("memory_gb", str(limits.memory_gb), f"memory.max={memory}")
        if limits.pids_max is not None:
            wanted["pids"] = ("pids_limit", str(limits.pids_max), f"pids.max={limits.pids_max}")
        if limits.cpus is not None:
            if limits.cpus >= host_cpus:
                self.records.append(
                    LimitRecord("vcpus", str(limits.cpus), False, f"host has {host_cpus} CPUs: not restricted")
                )
            else:
                wanted["cpu"] = ("vcpus", str(limits.cpus), f"cpu.max={limits.cpus * CPU_PERIOD_US} {CPU_PERIOD_US}")
        if not wanted:
            return
        parent = ROOT / _own_paths().get("", "/").lstrip("/")
        try:
            (parent / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in wanted))
            folder = parent / self.name
            folder.mkdir(exist_ok=True)
            self.paths.append(folder)
        except OSError as exc:
            reason = (
                f"cgroup v2: cannot enable {', '.join(wanted)} below {parent} ({exc.strerror}); "
                "run ale-iac from a delegated cgroup with no other processes"
            )
            self.records.extend(LimitRecord(name, requested, False, reason) for name, requested, _ in wanted.values())
            return
        for name, requested, setting in wanted.values():
            key, value = setting.split("=", 1)
            try:
                (folder / key).write_text(value)
            except OSError as exc:
                self.records.append(LimitRecord(name, requested, False, f"cgroup v2 {key}: {exc.strerror}"))
            else:
                self.records.append(LimitRecord(name, requested, True, f"{setting} in {folder}"))

    # --- membership ----------------------------------------------------------------------------

    def join(self, pid: int | None = None) -> None:
        """Move ``pid`` (default: the caller) into every cgroup of the sandbox."""
        for folder in self.paths:
            (folder / "cgroup.procs").write_text(str(pid if pid is not None else os.getpid()))


def find(sandbox_id: str, state_dir: str) -> list[Path]:
    """Every cgroup named for the sandbox, wherever it is (for a supervisor that died before saving)."""
    name = cgroup_name(sandbox_id, state_dir)
    found: list[Path] = []
    roots = [p for p in ROOT.iterdir() if p.is_dir() and not p.is_symlink()] if is_v1() else [ROOT]
    for root in roots:
        found.extend(root.rglob(name))
    return found


def remove(paths: list[Path], sandbox_id: str) -> None:
    """Remove the cgroups once their last process is gone.

    After a supervisor crash its children are reaped by the host's init, and a zombie stays in
    its cgroup until then (rmdir fails with EBUSY); v1 offers no event to wait on, so this
    re-checks until the deadline.
    """
    deadline = time.monotonic() + EMPTY_TIMEOUT_S
    for folder in paths:
        while folder.is_dir():
            try:
                folder.rmdir()
            except OSError as exc:
                if time.monotonic() > deadline:
                    try:
                        members = (folder / "cgroup.procs").read_text().split()
                    except OSError:
                        members = []
                    raise CgroupError(
                        f"sandbox {sandbox_id}: cannot remove {folder} ({exc}); processes still in it: {members}"
                    ) from None
                time.sleep(0.05)
