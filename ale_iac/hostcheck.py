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


def _which(tool: str) -> Check:
    path = shutil.which(tool)
    return Check(tool, path is not None, path or "not installed")


def other_substrate_checks() -> list[Check]:
    """The tools other substrates' images need (debootstrap builds the qemu-runner image). The Docker engine
    and QEMU are checked by their substrates' own rows in ``ale-iac doctor``, which say more."""
    return [_which("debootstrap")]
