"""What this host can run: the facts ``ale-iac doctor`` prints and the runner checks before a job."""

from __future__ import annotations

import shutil
from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    """What to do when it fails."""
    required: bool = True
    """False for what the host may lack at a cost that is recorded, not refused (a resource limit a
    sandbox records as not applied): doctor prints it, nothing refuses to run for it."""


def fit_cpu_quota(requested: int | None, host_cpus: int) -> tuple[int | None, str | None]:
    """The CPU quota a sandbox gets for a shape's ``requested`` vCPUs on a host with ``host_cpus`` CPUs, and
    what to record when the request is not kept. A quota of at least every CPU restricts nothing, so the
    sandbox gets none: it is fitted to the host (a docker engine even refuses a quota above its CPUs)."""
    if requested is not None and requested >= host_cpus:
        return None, f"fitted to the host: it has {host_cpus} CPUs, the shape asked {requested}; not restricted"
    return requested, None


def _which(tool: str) -> Check:
    path = shutil.which(tool)
    return Check(tool, path is not None, path or "not installed")


def other_substrate_checks() -> list[Check]:
    """The tools other substrates' images need (debootstrap builds the qemu-runner image). The Docker engine
    and QEMU are checked by their substrates' own rows in ``ale-iac doctor``, which say more."""
    return [_which("debootstrap")]
