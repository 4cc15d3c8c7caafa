"""What this host can run: the facts ``ale-iac doctor`` prints and the runner checks before a job."""

from __future__ import annotations

import shutil
import subprocess
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


def docker_engine() -> Check:
    if shutil.which("docker") is None:
        return Check("docker engine", False, "docker client not installed")
    try:
        out = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return Check("docker engine", False, str(exc))
    if out.returncode != 0:
        return Check("docker engine", False, "no engine answers (dockerd not running)")
    return Check("docker engine", True, f"server {out.stdout.strip()}")


def other_substrate_checks() -> list[Check]:
    return [_which("qemu-system-x86_64"), _which("qemu-img"), docker_engine(), _which("debootstrap")]
