"""The cloud exports of a built image: one bootable disk, in the format each cloud imports, cached by hash.

The disk is the qemu substrate's guest (the same rootfs, guest init and agent, forwarder) made bootable on
its own: an MBR disk with GRUB, Debian's kernel and initramfs, DHCP on whatever NIC it gets, and the unit's
token taken from the instance metadata service (``cloud-export.sh``). Made once per (recipe hash, cloud
export hash), and each format only on first need::

    <image dir>/cloud-<export hash8>/
        disk.raw        the disk itself (sparse, DISK_GB GiB: GCE wants a whole number of GiB)
        gce.tar.gz      GCE: disk.raw alone in a sparse GNU tar, gzip (gcloud compute images create --source-uri)
        ec2.vmdk        EC2: a stream-optimized VMDK (ec2 import-snapshot / VM Import)
        ecs.qcow2       Alibaba ECS: qcow2 (ecs ImportImage)
        manifest.json   the disk's kernel, sizes and step times; <target>.json: each format's size and time

Like the qcow2 export (``disk.py``), the work happens in a temporary folder renamed into place under a lock.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from ale_iac.clock import utc_now
from ale_iac.substrates.qemu import disk
from ale_iac.substrates.qemu.disk import LogFn, QemuDiskError

CLOUD_SCRIPT = Path(__file__).resolve().parent / "cloud-export.sh"
DISK_GB = 8
RAW = "disk.raw"
MANIFEST = "manifest.json"
FORMATS: dict[str, str] = {"gce": "gce.tar.gz", "ec2": "ec2.vmdk", "ecs": "ecs.qcow2"}
"""Export target -> the file it makes in the cloud disk's folder."""


@dataclass(frozen=True)
class CloudDisk:
    """A finished cloud disk: ``disk.raw`` and the formats made of it so far."""

    path: Path
    hash: str

    @property
    def raw(self) -> Path:
        return self.path / RAW

    def artifact(self, target: str) -> Path:
        return self.path / FORMATS[target]

    def manifest(self) -> dict[str, object]:
        data: dict[str, object] = json.loads((self.path / MANIFEST).read_text())
        return data


def export_hash() -> str:
    """First 8 hex digits of a SHA-256 over the guest files, the forwarder and the cloud export script."""
    digest = hashlib.sha256()
    for path in [*sorted(disk.GUEST_DIR.iterdir()), disk.PROXY_SOURCE, CLOUD_SCRIPT]:
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    digest.update(f"disk_gb={DISK_GB}".encode())
    return digest.hexdigest()[:8]


def find_disk(image_dir: Path) -> CloudDisk | None:
    found = CloudDisk(image_dir / f"cloud-{export_hash()}", export_hash())
    return found if (found.path / MANIFEST).is_file() else None


def _format_argv(target: str, folder: Path, out: Path) -> list[str]:
    if target == "gce":
        # GCE's documented form: oldgnu, sparse (-S), the file named exactly disk.raw at the archive's top.
        return [
            "tar",
            "--format=oldgnu",
            "-S",
            "--use-compress-program=gzip -1",
            "-cf",
            str(out),
            "-C",
            str(folder),
            RAW,
        ]
    if target == "ec2":
        return ["qemu-img", "convert", "-O", "vmdk", "-o", "subformat=streamOptimized", str(folder / RAW), str(out)]
    return ["qemu-img", "convert", "-O", "qcow2", str(folder / RAW), str(out)]


def ensure_format(found: CloudDisk, target: str, log: LogFn) -> Path:
    """The cloud disk in ``target``'s format (:data:`FORMATS`), made from ``disk.raw`` if missing."""
    final = found.artifact(target)
    if final.is_file():
        return final
    with FileLock(str(found.path.parent / f".cloud-{found.hash}-{target}.lock")):
        if final.is_file():
            return final
        partial = final.with_name(f".{final.name}.{os.getpid()}")
        log(f"exporting {found.path.parent.name} for {target} ({final.name})")
        started = time.monotonic()
        try:
            disk.run_step(
                target, f"{target} cloud", _format_argv(target, found.path, partial), found.path / "formats.log"
            )
            partial.chmod(0o444)
            partial.rename(final)
        finally:
            partial.unlink(missing_ok=True)
        seconds = round(time.monotonic() - started, 1)
        record = {"target": target, "file": final.name, "bytes": final.stat().st_size, "seconds": seconds}
        (found.path / f"{target}.json").write_text(json.dumps({**record, "made_at": utc_now("seconds")}) + "\n")
    log(f"{target} export {final} made in {seconds:.1f} s ({final.stat().st_size / 2**20:.0f} MiB)")
    return final


def export_cloud_disk(rootfs: Path, image_dir: Path, *, context: disk.ExportEnv, log: LogFn) -> CloudDisk:
    """The cloud disk of ``rootfs`` (the built image in ``image_dir``), made if missing (as root)."""
    existing = find_disk(image_dir)
    if existing is not None:
        return existing
    disk.check_export_host()
    digest = export_hash()
    final = image_dir / f"cloud-{digest}"
    with FileLock(str(image_dir / f".cloud-{digest}.lock")):
        existing = find_disk(image_dir)
        if existing is not None:
            return existing
        for stale in image_dir.glob(f".cloud-{digest}-build-*"):
            log(f"removing the leftover of an interrupted export: {stale}")
            disk.remove_tree(stale)
        work = image_dir / f".cloud-{digest}-build-{os.getpid()}"
        work.mkdir()
        log(f"exporting {image_dir.name} as a cloud disk ({final.name})")
        started = time.monotonic()
        try:
            _build_disk(rootfs, work, context, log)
            manifest = {
                "export_hash": digest,
                "image": image_dir.name,
                "built_at": utc_now("seconds"),
                "export_seconds": round(time.monotonic() - started, 1),
                "kernel": disk.kernel_version(work / "export.log"),
                "disk_gb": DISK_GB,
                "raw_allocated_bytes": (work / "out" / RAW).stat().st_blocks * 512,
            }
            (work / "out" / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
            shutil.copyfile(work / "export.log", work / "out" / "export.log")
            (work / "out" / RAW).chmod(0o444)
            (work / "out").rename(final)
        finally:
            disk.remove_tree(work)
    log(f"cloud disk {final} made in {time.monotonic() - started:.1f} s")
    return CloudDisk(final, digest)


def _build_disk(rootfs: Path, work: Path, context: disk.ExportEnv, log: LogFn) -> None:
    argv = ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", str(CLOUD_SCRIPT)]
    args = [str(rootfs), str(work / "tree"), str(work / "out"), str(disk.GUEST_DIR), str(disk.PROXY_SOURCE)]
    seconds = disk.run_step(
        "kernel, GRUB and ext4", "cloud disk", [*argv, *args, str(DISK_GB)], work / "export.log", context
    )
    log(f"[cloud disk] done in {seconds:.1f} s")
    disk.remove_tree(work / "tree")


def ensure_cloud_export(name: str, target: str, log: LogFn | None = None) -> Path:
    """The built image ``name`` exported for the cloud ``target`` (gce, ec2, ecs): made once per recipe and
    cloud export hash (the disk), and each format once from it."""
    from ale_iac.image_build import export_context
    from ale_iac.images import require_image

    if target not in FORMATS:
        raise QemuDiskError(f"unknown cloud export {target!r} (known: {', '.join(FORMATS)})")
    emit = log or disk.stderr_log
    found = find_disk(require_image(name).path)
    if found is None:
        context = export_context(name, emit)
        found = export_cloud_disk(context.image.rootfs, context.image.path, context=disk.export_env(context), log=emit)
    return ensure_format(found, target, emit)
