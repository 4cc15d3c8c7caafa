"""Resource limits of a local sandbox: memory, number of tasks, CPU time (control groups, v1 or v2).

A sandbox gets its own cgroup (per controller on v1, one on v2), named ``ale-iac-<id>-<hash>``. What
was asked for and what became of it is recorded (:class:`LimitRecord`), never silently dropped, and
:func:`host_limits` predicts the same for ``ale-iac doctor``.

* cgroup v1 (one hierarchy per controller): the cgroup goes below the supervisor's own in each
  hierarchy, so the host's limits on ale-iac still apply above it. Needs write access there: root,
  or a hierarchy an admin delegated.
* cgroup v2 (unified): the kernel lets no cgroup that holds processes enable controllers for its
  children (the "no internal processes" rule), so the sandbox's cgroup goes into a *delegated* parent
  (:func:`v2_parent`): ``ALE_IAC_CGROUP``, else our own cgroup if it already hands controllers down
  (the root cgroup), else the parent of our own (a systemd user service's slice, a scope made with
  ``systemd-run --user --scope -p Delegate=yes``): the sandbox's cgroup is then a sibling of ours,
  still inside the same delegated subtree. ``memory.max`` with ``memory.swap.max=0`` (no swap beyond
  it), ``pids.max``, ``cpu.max`` from the shape's vCPUs.
* Where no pids cgroup can be had, the sandbox's tasks are bounded by ``RLIMIT_NPROC`` set in its
  user namespace: since Linux 5.14 the kernel counts it per user namespace, so it counts the sandbox's
  own tasks only (:func:`nproc_fallback`).

Standard library only: the supervisor imports it.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ale_iac.hostcheck import Check, fit_cpu_quota

ROOT: Final = Path("/sys/fs/cgroup")
CPU_PERIOD_US: Final = 100_000
EMPTY_TIMEOUT_S: Final = 10.0
PARENT_ENV: Final = "ALE_IAC_CGROUP"
"""A cgroup v2 path (below the mount, e.g. ``/ale-iac``) that ale-iac may put sandboxes in."""
NPROC_KERNEL: Final = (5, 14)
V1_CONTROLLERS: Final = {"memory_gb": "memory", "pids_limit": "pids", "vcpus": "cpu"}
"""Limit name -> the controller that enforces it (the same names on v1 and v2)."""


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


def own_paths(text: str | None = None) -> dict[str, str]:
    """controller (or '' for v2) -> our cgroup path, from /proc/self/cgroup (or ``text`` in its format)."""
    if text is None:
        text = Path("/proc/self/cgroup").read_text()
    paths: dict[str, str] = {}
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def is_v1(root: Path = ROOT) -> bool:
    return (root / "memory" / "cgroup.procs").is_file() or (root / "pids" / "cgroup.procs").is_file()


def _kernel() -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", os.uname().release)[:2])


def v2_parent(root: Path, own: str, explicit: str | None = None) -> tuple[Path | None, str]:
    """The delegated cgroup a sandbox's cgroup goes into on a unified hierarchy, or None and why.

    ``own`` is our cgroup (``0::<path>`` of /proc/self/cgroup); ``explicit`` is ``ALE_IAC_CGROUP``.
    A candidate must let us make cgroups in it and move processes into them (write access to the
    folder and its ``cgroup.procs``; the kernel also checks the common ancestor of the source and
    target cgroups, which is the candidate or below it).
    """
    own_dir = root / own.lstrip("/")
    if explicit:
        folder = root / explicit.lstrip("/")
        if not folder.is_dir():
            return None, f"{PARENT_ENV}={explicit}: no such cgroup under {root}"
        if not _writable(folder):
            return None, f"{PARENT_ENV}={explicit}: not writable by uid {os.geteuid()} (not delegated to it)"
        return folder, f"{PARENT_ENV}={explicit}"
    if _writable(own_dir) and (_enabled(own_dir) or own in ("", "/")):
        # The root cgroup is exempt from the no-internal-processes rule.
        return own_dir, f"our own cgroup {own or '/'} (it hands controllers down)"
    parent = own_dir.parent
    if own not in ("", "/") and parent != root.parent and _writable(parent):
        return parent, f"the parent of our own cgroup {own} (delegated to us)"
    return None, (
        f"our cgroup {own} holds processes and its parent is not delegated to uid {os.geteuid()}: "
        f"run ale-iac in a delegated cgroup (systemd-run --user --scope -p Delegate=yes ale-iac ...), "
        f"or set {PARENT_ENV} to one"
    )


def _writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK) and os.access(folder / "cgroup.procs", os.W_OK)


def _enabled(folder: Path) -> set[str]:
    try:
        return set((folder / "cgroup.subtree_control").read_text().split())
    except OSError:
        return set()


def _available(folder: Path) -> set[str]:
    try:
        return set((folder / "cgroup.controllers").read_text().split())
    except OSError:
        return set()


class SandboxCgroups:
    """The cgroups of one sandbox: made by :meth:`apply`, joined by :meth:`join`, removed by :func:`remove`.

    ``root`` and ``own`` (the contents of /proc/self/cgroup) are the real ones unless a test passes a
    folder laid out like a cgroup file system.
    """

    def __init__(self, sandbox_id: str, state_dir: str, *, root: Path = ROOT, own: str | None = None) -> None:
        self.name = cgroup_name(sandbox_id, state_dir)
        self.root = root
        self.own = own_paths(own)
        self.paths: list[Path] = []
        self.records: list[LimitRecord] = []

    def apply(self, limits: Limits, host_cpus: int) -> None:
        cpus, fitted = fit_cpu_quota(limits.cpus, host_cpus)
        if fitted is not None:
            self.records.append(LimitRecord("vcpus", str(limits.cpus), False, fitted))
            limits = Limits(limits.memory_gb, limits.pids_max, cpus)
        if is_v1(self.root):
            self._apply_v1(limits)
        else:
            self._apply_v2(limits)

    def record(self, name: str) -> LimitRecord | None:
        return next((r for r in self.records if r.name == name), None)

    # --- v1 ----------------------------------------------------------------------------------

    def _v1_dir(self, controller: str) -> Path:
        base = self.root / controller
        if not (base / "cgroup.procs").is_file():
            raise CgroupError(f"no cgroup-v1 {controller} hierarchy at {base}")
        own = base / self.own.get(controller, "/").lstrip("/")
        if not os.access(own, os.W_OK):
            raise CgroupError(
                f"cgroup v1 {controller}: {own} is not writable by uid {os.geteuid()} (v1 hierarchies are "
                "root's; rootless limits need cgroup v2 with a delegated subtree, or an admin-delegated v1 cgroup)"
            )
        folder = own / self.name
        folder.mkdir(exist_ok=True)
        if folder not in self.paths:
            self.paths.append(folder)
        return folder

    def _apply_v1(self, limits: Limits) -> None:
        if limits.memory_gb is not None:
            memory = int(limits.memory_gb * 2**30)
            values = {"memory.limit_in_bytes": memory}
            if (self.root / "memory" / "memory.memsw.limit_in_bytes").exists():
                values["memory.memsw.limit_in_bytes"] = memory  # no swap beyond the limit
            self._set("memory_gb", str(limits.memory_gb), "memory", values)
        if limits.pids_max is not None:
            self._set("pids_limit", str(limits.pids_max), "pids", {"pids.max": limits.pids_max})
        if limits.cpus is not None:
            quota = limits.cpus * CPU_PERIOD_US
            self._set("vcpus", str(limits.cpus), "cpu", {"cpu.cfs_period_us": CPU_PERIOD_US, "cpu.cfs_quota_us": quota})

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
            self.records.append(LimitRecord(name, requested, True, f"cgroup v1: {detail} in {folder}"))

    # --- v2 ----------------------------------------------------------------------------------

    def _apply_v2(self, limits: Limits) -> None:
        wanted = _wanted_v2(limits)
        if not wanted:
            return
        parent, why = v2_parent(self.root, self.own.get("", "/"), os.environ.get(PARENT_ENV))
        if parent is None:
            self.records.extend(LimitRecord(n, r, False, f"cgroup v2: {why}") for n, r, _ in wanted.values())
            return
        for controller, reason in _enable_controllers(parent, set(wanted)).items():
            name, requested, _ = wanted.pop(controller)
            self.records.append(LimitRecord(name, requested, False, f"cgroup v2: {reason}"))
        folder = parent / self.name
        try:
            folder.mkdir(exist_ok=True)
        except OSError as exc:
            reason = f"cgroup v2: cannot make {folder} ({exc.strerror})"
            self.records.extend(LimitRecord(n, r, False, reason) for n, r, _ in wanted.values())
            return
        self.paths.append(folder)
        for name, requested, settings in wanted.values():
            self.records.append(_write_v2(folder, name, requested, settings))

    # --- membership ----------------------------------------------------------------------------

    def join(self, pid: int | None = None) -> None:
        """Move ``pid`` (default: the caller) into every cgroup of the sandbox."""
        for folder in self.paths:
            (folder / "cgroup.procs").write_text(str(pid if pid is not None else os.getpid()))


def _wanted_v2(limits: Limits) -> dict[str, tuple[str, str, dict[str, str]]]:
    """Per cgroup v2 controller: the limit's name, its requested value, the files to write."""
    wanted: dict[str, tuple[str, str, dict[str, str]]] = {}
    if limits.memory_gb is not None:
        memory = str(int(limits.memory_gb * 2**30))
        wanted["memory"] = ("memory_gb", str(limits.memory_gb), {"memory.max": memory, "memory.swap.max": "0"})
    if limits.pids_max is not None:
        wanted["pids"] = ("pids_limit", str(limits.pids_max), {"pids.max": str(limits.pids_max)})
    if limits.cpus is not None:
        wanted["cpu"] = ("vcpus", str(limits.cpus), {"cpu.max": f"{limits.cpus * CPU_PERIOD_US} {CPU_PERIOD_US}"})
    return wanted


def _enable_controllers(parent: Path, controllers: set[str]) -> dict[str, str]:
    """Enable ``controllers`` for ``parent``'s children where they are not yet; those that cannot be, with why."""
    refused: dict[str, str] = {}
    for controller in sorted(controllers - _enabled(parent)):
        if controller not in _available(parent):
            refused[controller] = f"the {controller} controller is not available in {parent} (cgroup.controllers)"
            continue
        try:
            (parent / "cgroup.subtree_control").write_text(f"+{controller}")
        except OSError as exc:
            refused[controller] = f"cannot enable {controller} in {parent}/cgroup.subtree_control ({exc.strerror})"
    return refused


def _write_v2(folder: Path, name: str, requested: str, settings: dict[str, str]) -> LimitRecord:
    """Write one limit's files in the sandbox's cgroup; the record says what was applied (or the error)."""
    written: list[str] = []
    try:
        for key, value in settings.items():
            if key == "memory.swap.max" and not (folder / key).exists():
                written.append("no swap accounting here (memory.swap.max absent): swap is not counted")
                continue
            (folder / key).write_text(value)
            written.append(f"{key}={value}")
    except OSError as exc:
        return LimitRecord(name, requested, False, f"cgroup v2 {key}: {exc.strerror}")
    return LimitRecord(name, requested, True, f"cgroup v2: {', '.join(written)} in {folder}")


def nproc_fallback(record: LimitRecord | None, pids_max: int) -> LimitRecord | None:
    """When the pids cgroup was not applied: the ``RLIMIT_NPROC`` to set in the sandbox instead.

    Returns the record that replaces ``record`` (None: nothing to do). The limit is set in the
    sandbox's user namespace, where (Linux 5.14 and newer) the kernel counts the tasks of that
    namespace's uid 0 alone, so it bounds the sandbox's tasks whatever else the host runs.
    """
    if record is None or record.applied:
        return None
    if _kernel() < NPROC_KERNEL:
        return None
    return LimitRecord(
        "pids_limit",
        str(pids_max),
        True,
        f"RLIMIT_NPROC={pids_max} in the sandbox's user namespace (counted per user namespace; no pids cgroup: "
        f"{record.detail})",
    )


def _members(folder: Path) -> set[int]:
    try:
        return {int(pid) for pid in (folder / "cgroup.procs").read_text().split()}
    except OSError:
        return set()


def kill_members(paths: list[Path]) -> list[int]:
    """SIGKILL every process in the sandbox's cgroups; the pids killed.

    All of them are the sandbox's: the supervisor puts only the sandbox's processes there (and stays outside),
    and every process they start inherits them. This reaches one that no other way finds, such as a task CRIU
    had not finished restoring when its unit was stopped. A pid is signalled through a pidfd opened while it is
    still a member, so a pid reused by another process meanwhile is never hit."""
    killed = []
    for folder in paths:
        for pid in sorted(_members(folder)):
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            try:
                if pid in _members(folder):  # the process the pidfd holds is still the member
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    killed.append(pid)
            except ProcessLookupError:
                pass
            finally:
                os.close(fd)
    return killed


def memory_oom_kills(paths: list[Path]) -> int:
    """How many processes the sandbox's memory limit has killed (0 where it has no memory cgroup)."""
    for folder in paths:
        for name, key in (("memory.events", "oom_kill"), ("memory.oom_control", "oom_kill")):
            try:
                text = (folder / name).read_text()
            except OSError:
                continue
            for line in text.splitlines():
                field, _, value = line.partition(" ")
                if field == key:
                    return int(value)
    return 0


def host_limits(*, rootless: bool, root: Path = ROOT, own: str | None = None) -> list[Check]:
    """What a sandbox started by this process would get of each limit here (``ale-iac doctor``);
    informational checks: a sandbox records a missing one as not applied, it is not refused."""
    paths = own_paths(own)
    checks: list[Check] = []
    if is_v1(root):
        checks.append(Check("cgroups", True, f"v1 (one hierarchy per controller under {root})", required=False))
        for name, controller in V1_CONTROLLERS.items():
            folder = root / controller / paths.get(controller, "/").lstrip("/")
            ok = (root / controller / "cgroup.procs").is_file() and os.access(folder, os.W_OK)
            detail = (
                f"cgroup v1 {controller} below {folder}" if ok else f"{folder} is not writable by uid {os.geteuid()}"
            )
            checks.append(_limit_check(name, ok, detail, rootless))
    else:
        parent, why = v2_parent(root, paths.get("", "/"), os.environ.get(PARENT_ENV))
        checks.append(Check("cgroups", True, f"v2 (unified at {root}); sandboxes go into: {why}", required=False))
        for name, controller in V1_CONTROLLERS.items():
            if parent is None:
                checks.append(_limit_check(name, False, why, rootless))
                continue
            ok = controller in _enabled(parent) or controller in _available(parent)
            detail = f"{controller} in {parent}" if ok else f"the {controller} controller is not available in {parent}"
            checks.append(_limit_check(name, ok, detail, rootless))
    return checks


def _limit_check(name: str, ok: bool, detail: str, rootless: bool) -> Check:
    if not ok and name == "pids_limit" and _kernel() >= NPROC_KERNEL:
        return Check(f"limit {name}", True, f"RLIMIT_NPROC in the sandbox's user namespace ({detail})", required=False)
    fix = (
        "cgroup v2 with a delegated subtree: run ale-iac under `systemd-run --user --scope -p Delegate=yes`, or set "
        f"{PARENT_ENV} to a cgroup delegated to you"
        if rootless
        else "mount the cgroup controllers (memory, pids, cpu), or set ALE_IAC_CGROUP on cgroup v2"
    )
    return Check(f"limit {name}", ok, detail, fix, required=False)


def find(sandbox_id: str, state_dir: str, root: Path = ROOT) -> list[Path]:
    """Every cgroup named for the sandbox, wherever it is (for a supervisor that died before saving)."""
    name = cgroup_name(sandbox_id, state_dir)
    found: list[Path] = []
    roots = [p for p in root.iterdir() if p.is_dir() and not p.is_symlink()] if is_v1(root) else [root]
    for base in roots:
        found.extend(base.rglob(name))
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
