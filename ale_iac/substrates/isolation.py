"""What the inside-out isolation suite needs of a substrate's unit, from the host's side.

The suite (``tests/substrates/test_isolation.py``) probes a running unit from the inside, as a hostile agent
would, and checks the host's side of each wall through an :class:`IsolationProbe`: one class per substrate
(``ale_iac/substrates/<kind>/isolation.py``), built from the unit's state object. A check that does not mean
anything on a substrate is not silently left out: the probe's :meth:`IsolationProbe.not_applicable` names
the reason (each probe module's ``NOT_APPLICABLE``), and the suite collects the check only where it applies.

:data:`CHECKS` names every check of the suite; ``docs/isolation.md`` has one row per check.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final, Protocol

ROOT_UNPRIVILEGED: Final = "root-is-unprivileged-on-the-host"
KERNEL_SETTINGS: Final = "host-kernel-settings-read-only"
NO_USERNS_INSIDE: Final = "no-user-namespace-inside"
NO_NAMESPACE_DESCRIPTOR: Final = "no-namespace-descriptor-inside"
SECCOMP: Final = "seccomp-families-denied"
CAPABILITIES: Final = "capabilities-cut"
SETUID_FILES: Final = "setuid-files-never-raise-on-the-host"
NO_HOST_PATH: Final = "no-host-path-visible"
NO_HOST_FILE_WRITABLE: Final = "no-host-file-writable"
WRITABLE_NOSUID: Final = "writable-mounts-nosuid-nodev"
DISK_BOUNDED: Final = "disk-bounded"
HOST_READS_SAFELY: Final = "host-reads-without-following-links"
NETWORK_LOOPBACK_ONLY: Final = "no-network-but-loopback"
GATEWAY_CHANNEL: Final = "model-channel-only-to-what-the-host-joins"
ENDPOINT_TOKEN: Final = "endpoint-needs-the-token"
OTHER_USER: Final = "another-host-user-cannot-drive-it"
TASKS_BOUNDED: Final = "tasks-bounded"
CGROUPS_OUT_OF_REACH: Final = "cgroups-out-of-reach"
HOST_PROCESS_CONFINED: Final = "host-process-confined"
HOST_PROCESS_UNPRIVILEGED: Final = "host-process-unprivileged"

CHECKS: Final = (
    ROOT_UNPRIVILEGED,
    KERNEL_SETTINGS,
    NO_USERNS_INSIDE,
    NO_NAMESPACE_DESCRIPTOR,
    SECCOMP,
    CAPABILITIES,
    SETUID_FILES,
    NO_HOST_PATH,
    NO_HOST_FILE_WRITABLE,
    WRITABLE_NOSUID,
    DISK_BOUNDED,
    HOST_READS_SAFELY,
    NETWORK_LOOPBACK_ONLY,
    GATEWAY_CHANNEL,
    ENDPOINT_TOKEN,
    OTHER_USER,
    TASKS_BOUNDED,
    CGROUPS_OUT_OF_REACH,
    HOST_PROCESS_CONFINED,
    HOST_PROCESS_UNPRIVILEGED,
)


class IsolationProbe(Protocol):
    """A unit seen from the host, for the isolation suite."""

    def host_pids(self) -> list[int]:
        """Every host process that belongs to the unit (helpers included)."""

    def host_paths(self) -> list[Path]:
        """Host folders the substrate keeps for the unit (state, logs, its disk)."""

    def read_log(self, name: str) -> str:
        """A log the unit wrote, read by the host the way ale-iac reads it."""

    def tasks_in_use(self) -> int:
        """Tasks the unit holds, as its task limit counts them."""

    def not_applicable(self, check: str) -> str | None:
        """Why the check named ``check`` (one of :data:`CHECKS`) does not apply to this substrate; None when it
        applies."""


def unknown_check(check: str) -> None:
    """Refuse a name that is not one of :data:`CHECKS` (a typo would otherwise read as "applies")."""
    if check not in CHECKS:
        raise KeyError(f"no isolation check named {check!r}")


def pids_current(pid: int, proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """The ``pids.current`` of the pids cgroup process ``pid`` is in, on cgroup v1 (the ``pids`` hierarchy)
    or v2 (the unified one, at the root or at ``unified/`` on a hybrid host), whatever the engine's cgroup
    driver named it: the path comes from the host's ``/proc/<pid>/cgroup``."""
    for line in (proc / str(pid) / "cgroup").read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        if number == "0" and controllers == "":
            hybrid = cgroup_root / "unified"
            candidate = (hybrid if (hybrid / "cgroup.procs").exists() else cgroup_root) / path.lstrip("/")
        elif "pids" in controllers.split(","):
            candidate = cgroup_root / controllers / path.lstrip("/")
        else:
            continue
        if (candidate / "pids.current").exists():
            return int((candidate / "pids.current").read_text())
    raise FileNotFoundError(f"process {pid} is in no pids cgroup with a pids.current")


def threads_of(pids: list[int]) -> int:
    """Tasks (threads) of the given host processes that still run."""
    total = 0
    for pid in pids:
        try:
            total += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            continue
    return total
