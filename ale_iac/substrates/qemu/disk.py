"""The qcow2 export of a built image: a bootable disk with Debian's kernel and initramfs, cached by hash.

``export_qcow2(rootfs, image_dir, ...)`` makes, once per (recipe hash, export hash)::

    <image dir>/qcow2-<export hash8>/
        disk.qcow2      the guest's root file system (ext4, label alegroot): the image's rootfs plus
                        linux-image-amd64 and initramfs-tools, the guest init and agent, the forwarder
        vmlinuz, initrd.img   booted directly by QEMU (-kernel/-initrd): no boot loader in the disk
        manifest.json   sizes, kernel version, step times

The image folder is named by the recipe hash, so an edited recipe gets a new export; the export hash
covers this substrate's guest files (``guest/``) and the forwarder, so an edited guest init does too.
The work happens in a temporary folder renamed into place under a lock; an interrupted export leaves
only that folder, removed by the next one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from filelock import FileLock

from ale_iac.clock import utc_now
from ale_iac.errors import AleIacError

if TYPE_CHECKING:
    from ale_iac.image_build import ExportContext

LogFn = Callable[[str], None]

GUEST_DIR = Path(__file__).resolve().parent / "guest"
PROXY_SOURCE = Path(__file__).resolve().parent.parent / "authproxy.py"
EXPORT_SCRIPT = GUEST_DIR / "export.sh"
DISK = "disk.qcow2"
KERNEL = "vmlinuz"
INITRD = "initrd.img"
MANIFEST = "manifest.json"
DISK_GB = 8
"""Size of the guest's root file system (sparse: only what is written takes space)."""


class QemuDiskError(AleIacError):
    """The qcow2 export failed; the message names the step and ends with its output."""


@dataclass(frozen=True)
class QemuDisk:
    """A finished qcow2 export: what ``launch.sh`` boots."""

    path: Path
    hash: str

    @property
    def disk(self) -> Path:
        return self.path / DISK

    @property
    def kernel(self) -> Path:
        return self.path / KERNEL

    @property
    def initrd(self) -> Path:
        return self.path / INITRD

    def manifest(self) -> dict[str, object]:
        data: dict[str, object] = json.loads((self.path / MANIFEST).read_text())
        return data


def export_hash() -> str:
    """First 8 hex digits of a SHA-256 over the guest files, the export script and the forwarder."""
    digest = hashlib.sha256()
    for path in [*sorted(GUEST_DIR.iterdir()), PROXY_SOURCE]:
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    digest.update(f"disk_gb={DISK_GB}".encode())
    return digest.hexdigest()[:8]


def find_export(image_dir: Path) -> QemuDisk | None:
    """The finished export of the current guest files for the image in ``image_dir``, or None."""
    found = QemuDisk(image_dir / f"qcow2-{export_hash()}", export_hash())
    return found if (found.path / MANIFEST).is_file() else None


ExportEnv = dict[str, str]
"""The environment of an export script: the image builder's chroot environment plus the host's apt and CA."""


def script_env(env: dict[str, str], apt_conf: str, ca_bundle: Path | None) -> ExportEnv:
    found = {**env, "ALE_APT_CONF": apt_conf}
    if ca_bundle is not None:
        found["ALE_CA_BUNDLE"] = str(ca_bundle)
    return found


def export_env(context: ExportContext) -> ExportEnv:
    """The export scripts' environment for a built image (its :class:`~ale_iac.image_build.ExportContext`)."""
    return script_env(context.env, context.apt_conf, context.ca_bundle)


def _run(step: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> float:
    return run_step(step, "qcow2", argv, log_path, env)


def run_step(step: str, what: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> float:
    """Run one step of the ``what`` export, its output appended to ``log_path``; its seconds, or an error
    naming the step with the log's tail."""
    started = time.monotonic()
    with log_path.open("ab") as logf:
        logf.write(f"\n=== {step}: {' '.join(argv)}\n".encode())
        logf.flush()
        done = subprocess.run(
            argv, check=False, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, env=env
        )
    if done.returncode != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
        raise QemuDiskError(f"{what} export: step '{step}' failed with exit code {done.returncode}\n{tail}")
    return round(time.monotonic() - started, 2)


def export_qcow2(
    rootfs: Path, image_dir: Path, *, env: dict[str, str], apt_conf: str, ca_bundle: Path | None, log: LogFn
) -> QemuDisk:
    """The qcow2 export of ``rootfs`` (the built image in ``image_dir``), made if missing (as root).

    ``env``: PATH, proxies and pip settings for the chroot (the image builder's); ``apt_conf``: the
    host's apt Acquire settings; ``ca_bundle``: the CA file the host trusts.
    """
    existing = find_export(image_dir)
    if existing is not None:
        return existing
    check_export_host()
    digest = export_hash()
    final = image_dir / f"qcow2-{digest}"
    with FileLock(str(image_dir / f".qcow2-{digest}.lock")):
        existing = find_export(image_dir)
        if existing is not None:
            return existing
        for stale in image_dir.glob(f".qcow2-{digest}-build-*"):
            log(f"removing the leftover of an interrupted export: {stale}")
            remove_tree(stale)
        work = image_dir / f".qcow2-{digest}-build-{os.getpid()}"
        out = work / "out"
        work.mkdir()
        log_path = work / "export.log"
        log(f"exporting {image_dir.name} as qcow2 ({final.name})")
        started = time.monotonic()
        try:
            steps = _export_steps(rootfs, work, script_env(env, apt_conf, ca_bundle), log_path, log)
            manifest = {
                "export_hash": digest,
                "image": image_dir.name,
                "built_at": utc_now("seconds"),
                "export_seconds": round(time.monotonic() - started, 1),
                "steps": steps,
                "kernel": kernel_version(log_path),
                "disk_bytes": (out / DISK).stat().st_size,
                "disk_gb": DISK_GB,
            }
            (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
            shutil.copyfile(log_path, out / "export.log")
            for name in (DISK, KERNEL, INITRD):
                (out / name).chmod(0o444)
            out.rename(final)
        finally:
            remove_tree(work)
    log(f"qcow2 export {final} made in {time.monotonic() - started:.1f} s")
    return QemuDisk(final, digest)


def check_export_host() -> None:
    if os.geteuid() != 0:
        raise QemuDiskError("exporting a qcow2 disk needs root (overlay mount, chroot, mkfs); run it as root")
    for tool, package in (("qemu-img", "qemu-utils"), ("mkfs.ext4", "e2fsprogs"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            raise QemuDiskError(f"{tool} is not installed; run: apt-get install -y {package}")


def _export_steps(rootfs: Path, work: Path, script_env: dict[str, str], log_path: Path, log: LogFn) -> dict[str, float]:
    """The export's steps in ``work``: the guest's kernel and its ext4 disk (the export script, in a private mount
    namespace), then the disk converted to ``out/disk.qcow2``; returns each step's seconds."""
    out = work / "out"
    steps: dict[str, float] = {}
    argv = ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", str(EXPORT_SCRIPT)]
    args = [str(rootfs), str(work / "tree"), str(out), str(GUEST_DIR), str(PROXY_SOURCE), str(DISK_GB)]
    steps["kernel and ext4"] = _run("kernel and ext4", argv + args, log_path, script_env)
    log(f"[kernel and ext4] done in {steps['kernel and ext4']:.1f} s")
    convert = ["qemu-img", "convert", "-O", "qcow2", str(out / "disk.raw"), str(out / DISK)]
    steps["qcow2"] = _run("qcow2", convert, log_path)
    (out / "disk.raw").unlink()
    remove_tree(work / "tree")
    return steps


def kernel_version(log_path: Path) -> str | None:
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith("Setting up linux-image-"):
            return line.split()[2]
    return None


def remove_tree(path: Path) -> None:
    """Delete a work tree; the overlay lived in a mount namespace that is gone, but check anyway."""
    if not path.exists():
        return
    prefix = str(path.resolve())
    with open("/proc/self/mountinfo") as mountinfo:
        mounted = [line.split()[4] for line in mountinfo if line.split()[4].startswith(prefix)]
    if mounted:
        raise QemuDiskError(f"refusing to delete {path}: still mounted: {', '.join(mounted)}")
    shutil.rmtree(path)


def ensure_export(name: str = "desktop", log: LogFn | None = None) -> QemuDisk:
    """The built image ``name`` as a bootable qcow2 disk (:func:`export_qcow2`), made once per recipe and
    guest-file hash."""
    from ale_iac.image_build import export_context
    from ale_iac.images import require_image

    existing = find_export(require_image(name).path)
    if existing is not None:
        return existing
    context = export_context(name) if log is None else export_context(name, log)
    return export_qcow2(
        context.image.rootfs,
        context.image.path,
        env=context.env,
        apt_conf=context.apt_conf,
        ca_bundle=context.ca_bundle,
        log=log or stderr_log,
    )


def stderr_log(message: str) -> None:
    import sys

    print(message, file=sys.stderr, flush=True)
