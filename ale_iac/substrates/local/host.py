"""What this host offers local sandboxes: root or rootless mode, the kernel, the tools, user namespaces and
subordinate ids (``ale-iac doctor`` prints these checks; ``start`` enforces them)."""

from __future__ import annotations

import functools
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from ale_iac.hostcheck import Check
from ale_iac.substrates.local import cgroups, linux
from ale_iac.substrates.local.sandboxes import UID_COUNT, SandboxError

MODE_ROOT = "root"
"""ale-iac runs as uid 0: a loop-mounted ext4 layer over an id-mapped image, a uid range no user owns."""
MODE_ROOTLESS = "rootless"
"""ale-iac runs as a normal user: its own uid is root inside, a tmpfs layer over its own copy of the image."""

_COMMON_TOOLS = (
    ("bwrap", "bubblewrap"),
    ("slirp4netns", "slirp4netns"),
    ("setsid", "util-linux"),
)
_ROOT_TOOLS = (
    ("mount", "mount"),
    ("mkfs.ext4", "e2fsprogs"),
)
MIN_KERNEL = (5, 19)
"""Root mode: id-mapped mounts as overlayfs layers."""
MIN_KERNEL_ROOTLESS = (5, 11)
"""Rootless mode: overlayfs mounted in a user namespace (older kernels would need fuse-overlayfs,
which ale-iac does not drive)."""


SUBID_COUNT = UID_COUNT - 1
"""Rootless with subordinate ids: ids 1..65535 inside are the user's /etc/subuid and /etc/subgid range."""


def subordinate_ids() -> tuple[tuple[int, int], tuple[int, int]] | None:
    """The caller's subordinate uid and gid ranges ``(start, count)`` (count capped at 65535), if it has
    ranges of at least that size and ``newuidmap``/``newgidmap`` are installed; else None (rootless
    sandboxes then have uid and gid 0 only inside)."""
    if shutil.which("newuidmap") is None or shutil.which("newgidmap") is None:
        return None
    uid = os.geteuid()
    try:
        import pwd

        names = {str(uid), pwd.getpwuid(uid).pw_name}
    except (KeyError, ImportError):
        names = {str(uid)}
    found: list[tuple[int, int]] = []
    for path in ("/etc/subuid", "/etc/subgid"):
        try:
            lines = Path(path).read_text().splitlines()
        except OSError:
            return None
        ranges = [
            (int(start), min(int(count), SUBID_COUNT))
            for name, start, count in (line.split(":") for line in lines if line.count(":") == 2)
            if name in names and count.isdigit() and start.isdigit() and int(count) >= SUBID_COUNT
        ]
        if not ranges:
            return None
        found.append(ranges[0])
    return found[0], found[1]


def host_mode() -> str:
    """``root`` when ale-iac runs as uid 0, else ``rootless``: one runtime, two ways to build a sandbox."""
    return MODE_ROOT if os.geteuid() == 0 else MODE_ROOTLESS


def kernel_version() -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", os.uname().release)[:2])


def _sysctl(name: str) -> str | None:
    try:
        return Path("/proc/sys", name.replace(".", "/")).read_text().strip()
    except OSError:
        return None


def host_checks() -> list[Check]:
    """Everything a local sandbox needs of this host, in the mode this process would run it
    (:func:`host_mode`), then what this host's cgroups let it limit: what ``ale-iac doctor`` prints
    and ``start`` enforces (the limits are informational: a sandbox records each as applied or not)."""
    mode = host_mode()
    checks = [
        Check("linux", sys.platform.startswith("linux"), sys.platform, "local sandboxes need Linux"),
        Check(
            "mode",
            True,
            f"{mode} (uid {os.geteuid()})"
            + (
                ": the sandbox's user namespace maps its root to your own uid; its writable layer is a tmpfs"
                if mode == MODE_ROOTLESS
                else ": the sandbox's root is a host uid range no user owns; its writable layer is ext4 on a loop"
            ),
        ),
    ]
    tools = _COMMON_TOOLS + (_ROOT_TOOLS if mode == MODE_ROOT else ())
    for tool, package in tools:
        path = shutil.which(tool)
        checks.append(Check(tool, path is not None, path or "not installed", f"apt-get install -y {package}"))
    try:
        filesystems = Path("/proc/filesystems").read_text()
    except OSError:
        filesystems = ""
    for fs in ("overlay", "ext4") if mode == MODE_ROOT else ("overlay",):
        present = re.search(rf"\b{fs}$", filesystems, re.MULTILINE) is not None
        checks.append(
            Check(f"{fs} file system", present, "in /proc/filesystems" if present else "missing", f"modprobe {fs}")
        )
    release = os.uname().release
    if mode == MODE_ROOT:
        loop = Path("/dev/loop-control").exists()
        checks.append(Check("loop devices", loop, "/dev/loop-control" if loop else "missing", "modprobe loop"))
        checks.append(
            Check(
                "kernel",
                kernel_version() >= MIN_KERNEL,
                release,
                f"Linux {MIN_KERNEL[0]}.{MIN_KERNEL[1]} or newer (id-mapped mounts under overlayfs)",
            )
        )
    else:
        checks.extend(_rootless_checks(release))
    checks.extend(cgroups.host_limits(rootless=mode == MODE_ROOTLESS))
    return checks


def _rootless_checks(release: str) -> list[Check]:
    kernel = Check(
        "kernel",
        kernel_version() >= MIN_KERNEL_ROOTLESS,
        release,
        f"Linux {MIN_KERNEL_ROOTLESS[0]}.{MIN_KERNEL_ROOTLESS[1]} or newer (overlayfs in a user namespace; "
        "older kernels would need fuse-overlayfs, which ale-iac does not drive), or run as root",
    )
    overlay = _overlay_check()
    return [kernel, *_userns_checks(), _subids_check(), overlay]


def _userns_checks() -> list[Check]:
    """May this user make user namespaces: the kernel's limit, and the distributions' own switches where set."""
    max_userns = _sysctl("user.max_user_namespaces")
    checks = [
        Check(
            "user namespaces",
            max_userns is not None and max_userns != "0",
            f"user.max_user_namespaces={max_userns}",
            "sysctl -w user.max_user_namespaces=15000",
        )
    ]
    clone = _sysctl("kernel.unprivileged_userns_clone")  # Debian's patch (Debian 10 and older kernels)
    if clone is not None:
        checks.append(
            Check(
                "unprivileged user namespaces",
                clone == "1",
                f"kernel.unprivileged_userns_clone={clone}",
                "sysctl -w kernel.unprivileged_userns_clone=1",
            )
        )
    apparmor = _sysctl("kernel.apparmor_restrict_unprivileged_userns")  # Ubuntu 23.10 and newer
    if apparmor is not None:
        checks.append(
            Check(
                "AppArmor user namespace restriction",
                apparmor == "0",
                f"kernel.apparmor_restrict_unprivileged_userns={apparmor}",
                "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0, or an AppArmor profile that allows "
                "userns for the venv's python",
            )
        )
    return checks


def _subids_check() -> Check:
    subids = subordinate_ids()
    return Check(
        "subordinate ids",
        subids is not None,
        f"uids {subids[0][0]}.., gids {subids[1][0]}.. (newuidmap): ids 0..{SUBID_COUNT} inside"
        if subids
        else "none: only uid and gid 0 exist inside (programs that chown to another id fail, e.g. xterm's pty)",
        "apt-get install -y uidmap, and a range of 65536 ids for your user in /etc/subuid and /etc/subgid "
        "(usermod --add-subuids/--add-subgids)",
        required=False,
    )


def _overlay_check() -> Check:
    """Tried, not inferred: a user namespace of this user's own, a tmpfs and overlayfs in it."""
    scratch = tempfile.mkdtemp(prefix="ale-iac-probe-")
    try:
        failure = linux.probe_rootless_overlay(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return Check(
        "overlay in a user namespace",
        failure is None,
        "a user namespace of your own, a tmpfs and overlayfs in it: works" if failure is None else failure,
        "allow unprivileged user namespaces (see the checks above), or run as root",
    )


@functools.cache
def check_host() -> None:
    """Raise a SandboxError naming every missing requirement of local sandboxes on this host."""
    failed = [check for check in host_checks() if check.required and not check.ok]
    if failed:
        needs = "; ".join(f"{check.name}: {check.detail} ({check.fix})" for check in failed)
        raise SandboxError(f"local sandboxes cannot run on this host: {needs}")
