"""What this host can run: the facts ``ale-iac doctor`` prints and the runner checks before a job."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def _which(tool: str) -> Check:
    path = shutil.which(tool)
    return Check(tool, path is not None, path or "not installed")


def overlay_supported() -> Check:
    try:
        text = Path("/proc/filesystems").read_text()
    except OSError as exc:
        return Check("overlayfs", False, str(exc))
    ok = any(line.split()[-1] == "overlay" for line in text.splitlines() if line.strip())
    return Check("overlayfs", ok, "in /proc/filesystems" if ok else "kernel has no overlay filesystem")


def running_as_root() -> Check:
    ok = os.geteuid() == 0
    return Check("root", ok, "uid 0" if ok else f"uid {os.geteuid()} (local sandboxes mount overlayfs: run as root)")


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


def local_substrate_checks() -> list[Check]:
    """Everything the ``local`` provider needs on the host."""
    return [
        running_as_root(),
        _which("bwrap"),
        _which("slirp4netns"),
        _which("unshare"),
        _which("nsenter"),
        overlay_supported(),
    ]


def other_substrate_checks() -> list[Check]:
    return [_which("qemu-system-x86_64"), _which("qemu-img"), docker_engine(), _which("debootstrap")]
