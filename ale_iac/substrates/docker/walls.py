"""The walls of a docker unit beyond what the engine gives every container, each recorded as applied or not.

* **User namespace.** ale-iac's own engine (``scripts/dockerd.sh``) runs with ``userns-remap``: root in a
  unit is the first id of an unprivileged host range (the ``dockremap`` user's ``/etc/subuid`` range). An
  engine without it (a user's own, named by ``DOCKER_HOST``) still runs units; they record ``userns`` as not
  applied. :func:`engine_security` reads what the engine has from ``docker info``.
* **Seccomp.** ale-iac's own policy (``ale_iac/substrates/seccomp.py``, the local substrate's), rendered to
  the engine's JSON profile format and passed per container, never the engine's default profile.
* **AppArmor.** The engine's ``docker-default`` profile where the host kernel has AppArmor and the engine
  uses it; recorded as not applied, with the reason, elsewhere.
* **The unit's disk.** Its four volumes live on one ext4 file system of ``disk_gb`` in a sparse file of its
  own (``<home>/docker-units/<id>/disk.img``), loop-mounted ``nosuid,nodev`` on the host; each volume is a
  bind of one folder of it (the engine's ``local`` driver with ``o=bind``), and a bind keeps the
  ``nosuid,nodev`` of the mount it comes from. So a unit fills at most its own disk, and a setuid file it
  plants raises no one, inside or on the host. :func:`make_disk` / :func:`remove_disk`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ale_iac.errors import AleIacError
from ale_iac.hostcheck import Check
from ale_iac.paths import ale_home
from ale_iac.substrates.seccomp import docker_profile

if TYPE_CHECKING:
    from docker import DockerClient

DISK_FILE = "disk.img"
MOUNT_DIR = "mnt"
LABELS_FILE = "labels.json"
MOUNT_OPTIONS = "loop,nosuid,nodev,noatime"
APPARMOR_PROFILE = "docker-default"


class DiskError(AleIacError):
    """A unit's disk could not be made or removed; the message names the unit."""


@dataclass(frozen=True)
class EngineSecurity:
    """What the engine confines containers with (``docker info``)."""

    userns: bool
    remap_uid: int
    """The host uid of root in a container (0 without ``userns-remap``)."""
    remap_gid: int
    apparmor: bool
    seccomp: bool
    cgroup_version: str


def engine_security(engine: DockerClient) -> EngineSecurity:
    info = engine.info()
    options = " ".join(str(option) for option in info.get("SecurityOptions") or [])
    userns = "name=userns" in options
    uid = gid = 0
    found = re.fullmatch(r"(\d+)\.(\d+)", Path(str(info.get("DockerRootDir") or "")).name)
    if userns and found:
        uid, gid = int(found.group(1)), int(found.group(2))
    return EngineSecurity(
        userns=userns and uid > 0,
        remap_uid=uid,
        remap_gid=gid,
        apparmor="name=apparmor" in options,
        seccomp="name=seccomp" in options,
        cgroup_version=str(info.get("CgroupVersion") or "1"),
    )


def tool_checks() -> list[Check]:
    """The host tools a unit's disk needs."""
    checks = [
        Check(tool, shutil.which(tool) is not None, shutil.which(tool) or "not installed", f"apt-get install -y {pkg}")
        for tool, pkg in (("mkfs.ext4", "e2fsprogs"), ("mount", "mount"))
    ]
    loop = Path("/dev/loop-control").exists()
    checks.append(Check("loop devices", loop, "/dev/loop-control" if loop else "missing", "modprobe loop"))
    return checks


def host_has_apparmor() -> bool:
    try:
        return Path("/sys/module/apparmor/parameters/enabled").read_text().strip() == "Y"
    except OSError:
        return False


def container_options(security: EngineSecurity) -> tuple[dict[str, Any], list[tuple[str, bool, str]]]:
    """The container's arguments for these walls (``security_opt``), and what became of each wall:
    (name, applied, detail)."""
    options = ["no-new-privileges:true", "seccomp=" + json.dumps(docker_profile())]
    records = [
        (
            "userns",
            security.userns,
            f"root inside is host uid {security.remap_uid}"
            if security.userns
            else "the engine runs without userns-remap: root inside is the host's root (start ale-iac's own engine: "
            "scripts/dockerd.sh)",
        ),
        ("seccomp", True, "ale-iac's policy (the local substrate's), not the engine's default profile"),
    ]
    if security.apparmor:
        options.append(f"apparmor={APPARMOR_PROFILE}")
        records.append(("apparmor", True, APPARMOR_PROFILE))
    else:
        why = "the engine does not use it" if host_has_apparmor() else "the host kernel has no AppArmor"
        records.append(("apparmor", False, why))
    return {"security_opt": options}, records


# --- the unit's disk ------------------------------------------------------------------------------------


def units_dir(home: Path | None = None) -> Path:
    return (home or ale_home()) / "docker-units"


def unit_dir(sandbox_id: str, home: Path | None = None) -> Path:
    return units_dir(home) / sandbox_id


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise DiskError(f"{what}: {' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")


def make_disk(
    sandbox_id: str, disk_gb: float, roles: list[str], owner: tuple[int, int], labels: dict[str, str]
) -> dict[str, Path]:
    """A sparse ext4 file system of ``disk_gb`` for the unit, mounted ``nosuid,nodev`` on the host, with one
    folder per volume role owned by root inside (``owner``: the engine's remapped root). Returns role ->
    folder. What was made is removed on failure."""
    folder = unit_dir(sandbox_id)
    folder.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    folder.mkdir(mode=0o700)
    try:
        (folder / LABELS_FILE).write_text(json.dumps(labels))
        (folder / LABELS_FILE).chmod(0o600)
        disk = folder / DISK_FILE
        with disk.open("wb") as sink:
            sink.truncate(max(1, round(disk_gb * 2**30)))
        disk.chmod(0o600)
        uid, gid = owner
        _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-E", f"root_owner={uid}:{gid}", str(disk)], f"unit {sandbox_id}")
        mount = folder / MOUNT_DIR
        mount.mkdir(mode=0o700)
        _run(["mount", "-o", MOUNT_OPTIONS, str(disk), str(mount)], f"unit {sandbox_id}")
        shutil.rmtree(mount / "lost+found", ignore_errors=True)
        roles_dirs = {}
        for role in roles:
            path = mount / role
            path.mkdir(mode=0o755)
            os.chown(path, uid, gid)
            roles_dirs[role] = path
        return roles_dirs
    except BaseException:
        with contextlib.suppress(Exception):
            remove_disk(sandbox_id)
        raise


def _mounted(path: Path) -> bool:
    target = str(path)
    with open("/proc/self/mountinfo") as source:
        return any(line.split()[4] == target for line in source)


def remove_disk(sandbox_id: str, home: Path | None = None) -> bool:
    """Unmount and delete the unit's disk (the loop device goes with its last mount); True if there was one.
    Call it after the unit's volumes are gone: they are binds of its folders."""
    folder = unit_dir(sandbox_id, home)
    if not folder.exists():
        return False
    mount = folder / MOUNT_DIR
    if _mounted(mount):
        _run(["umount", str(mount)], f"unit {sandbox_id}")
    shutil.rmtree(folder)
    return True


def disks(home: Path | None = None) -> dict[str, dict[str, str]]:
    """This home's unit disks: sandbox id -> the unit's labels (for ``gc``: a disk whose unit is gone)."""
    found: dict[str, dict[str, str]] = {}
    root = units_dir(home)
    if not root.is_dir():
        return found
    for folder in root.iterdir():
        try:
            labels = json.loads((folder / LABELS_FILE).read_text())
        except (OSError, ValueError):
            labels = {}
        found[folder.name] = {str(k): str(v) for k, v in dict(labels).items()}
    return found


def volume_options(folder: Path) -> dict[str, Any]:
    """The ``local`` driver's options for a volume that is a bind of ``folder`` (nosuid,nodev from its mount)."""
    return {"type": "none", "o": "bind", "device": str(folder)}


# --- doctor ---------------------------------------------------------------------------------------------


def engine_checks(engine: DockerClient) -> list[Check]:
    """What the engine confines units with, for ``ale-iac doctor`` (``DockerSubstrate.host_checks``)."""
    security = engine_security(engine)
    return [
        Check(
            "user namespace",
            security.userns,
            f"root in a unit is host uid {security.remap_uid}" if security.userns else "no userns-remap",
            "use ale-iac's own engine: scripts/dockerd.sh (unset DOCKER_HOST)",
        ),
        Check("seccomp", security.seccomp, "units get ale-iac's profile" if security.seccomp else "off", ""),
        Check(
            "AppArmor",
            security.apparmor,
            APPARMOR_PROFILE if security.apparmor else ("not used by the engine" if host_has_apparmor() else "none"),
            "",
            required=False,
        ),
        Check("cgroup version", True, security.cgroup_version, ""),
    ]
