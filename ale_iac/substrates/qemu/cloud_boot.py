"""Booting a cloud export under QEMU, as the cloud would: the proof that the artifact itself works.

The GCE export's archive is unpacked (its one member, ``disk.raw``: nothing else is booted) and QEMU starts on a
disposable overlay of it with the devices a cloud VM has: the disk on virtio-scsi, booted by SeaBIOS through the
disk's own GRUB (no ``-kernel``), a virtio-net NIC that gets its address by DHCP, virtio-rng. QEMU's user network
(``restrict=on``: no way out) is placed so that it contains 169.254.169.254, the metadata address, which
``guestfwd`` forwards to :mod:`metadata_standin` (libslirp forwards only addresses inside its network), and
``hostfwd`` gives the guest's endpoint (the forwarder, port 8443) a port on the host's 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ale_iac.cloud_routes import GUEST_AGENT_PORT
from ale_iac.substrates.qemu import launcher
from ale_iac.substrates.qemu.disk import QemuDiskError

STANDIN = Path(__file__).resolve().parent / "metadata_standin.py"
NETWORK = "net=169.254.169.0/24,host=169.254.169.1,dhcpstart=169.254.169.15,dns=169.254.169.3"
"""QEMU's user network, placed to contain the clouds' metadata address (the guest gets 169.254.169.15)."""
METADATA = "169.254.169.254:80"
QEMU_NAME = "ale-cloud-guest,process=ale-qemu"
OWNER = "owner.pid"
"""The guest folder's record of the process that started it: a guest whose starter is gone is gc's to remove."""


@dataclass
class CloudGuest:
    """A cloud disk running under QEMU: its folder (overlay, serial log, the stand-in's values and log)."""

    unit_dir: Path
    port: int
    process: subprocess.Popen[bytes]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def serial_log(self) -> Path:
        return self.unit_dir / "serial.log"

    @property
    def metadata_log(self) -> Path:
        return self.unit_dir / "metadata.log"

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        """Stop QEMU (SIGTERM, then SIGKILL) and remove the folder."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=launcher.STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.unit_dir, ignore_errors=True)


def unpack_gce(archive: Path, into: Path) -> Path:
    """``disk.raw`` out of a GCE archive (sparse, as GNU tar restores it), refusing an archive that holds anything
    else: what GCE would import is exactly what boots."""
    into.mkdir(parents=True, exist_ok=True)
    if any(into.iterdir()):
        raise QemuDiskError(f"{into} is not empty: unpack a GCE archive into an empty folder")
    done = subprocess.run(["tar", "-xSzf", str(archive), "-C", str(into)], capture_output=True, text=True, check=False)
    found = sorted(path.name for path in into.iterdir())
    if done.returncode != 0 or found != ["disk.raw"]:
        raise QemuDiskError(f"{archive}: not a GCE image archive (members {found}): {done.stderr.strip()}")
    return into / "disk.raw"


def qemu_argv(guest_dir: Path, port: int, *, vcpus: int, memory_mb: int) -> list[str]:
    standin = f"{sys.executable} {STANDIN} {guest_dir / 'metadata.json'} {guest_dir / 'metadata.log'}"
    if "," in standin:
        raise QemuDiskError(f"the stand-in's command cannot contain a comma (QEMU option syntax): {standin}")
    kvm = launcher.accel() == "kvm"
    netdev = (
        f"user,id=n0,restrict=on,{NETWORK},hostfwd=tcp:127.0.0.1:{port}-:{GUEST_AGENT_PORT},"
        f"guestfwd=tcp:{METADATA}-cmd:{standin}"
    )
    return [
        "qemu-system-x86_64", "-name", QEMU_NAME, "-accel", "kvm" if kvm else "tcg",
        "-cpu", "host" if kvm else "max", "-m", str(memory_mb), "-smp", str(vcpus),
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
        "-serial", f"file:{guest_dir / 'serial.log'}",
        "-drive", f"file={guest_dir / 'disk.qcow2'},if=none,id=boot,format=qcow2,discard=unmap",
        "-device", "virtio-scsi-pci,id=scsi0", "-device", "scsi-hd,drive=boot,bus=scsi0.0,bootindex=0",
        "-netdev", netdev, "-device", "virtio-net-pci,netdev=n0", "-device", "virtio-rng-pci",
    ]  # fmt: skip


def boot(
    disk_raw: Path, guest_dir: Path, metadata: dict[str, str], *, vcpus: int = 2, memory_mb: int = 2048
) -> CloudGuest:
    """Start QEMU on an overlay of ``disk_raw`` (never written), with ``metadata`` served as the instance's
    attributes; returns at once (the caller waits for the endpoint)."""
    guest_dir.mkdir(parents=True, mode=0o700)
    (guest_dir / OWNER).write_text(f"{os.getpid()}\n")
    values = guest_dir / "metadata.json"
    values.touch(mode=0o600)
    values.write_text(json.dumps(metadata))
    overlay = [
        "qemu-img",
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        str(disk_raw),
        "-F",
        "raw",
        str(guest_dir / "disk.qcow2"),
    ]
    subprocess.run(overlay, check=True)
    port = launcher.free_port()
    log = os.open(guest_dir / "qemu.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        process = subprocess.Popen(
            qemu_argv(guest_dir, port, vcpus=vcpus, memory_mb=memory_mb),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        os.close(log)
    return CloudGuest(guest_dir, port, process)


def wait_ready(guest: CloudGuest, token: str, deadline: float) -> float:
    """Until the guest's endpoint answers ``GET /status`` with 200 for ``token`` (its forwarder has the token from
    the metadata and the computer-server is up); the seconds it took. Fails at once when QEMU exits, and at the
    monotonic ``deadline`` with the serial log's tail."""
    import time

    import httpx

    started = time.monotonic()
    headers = {"Authorization": f"Bearer {token}"}
    while True:
        if not guest.alive():
            raise QemuDiskError(f"QEMU exited while booting the cloud disk: {_tail(guest.unit_dir / 'qemu.log')}")
        try:
            if httpx.get(f"{guest.endpoint}/status", headers=headers, timeout=5).status_code == 200:
                return round(time.monotonic() - started, 1)
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise QemuDiskError(f"the cloud disk did not answer in time; serial log: {_tail(guest.serial_log)}")
        time.sleep(1.0)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(none)"
    return " | ".join(text.strip().splitlines()[-lines:]) or "(empty)"


def orphans(euid: int | None = None) -> list[tuple[int, Path]]:
    """(QEMU pid, guest folder) of every cloud disk boot whose starter is gone (killed before its ``stop``).

    Only boots the caller (effective uid ``euid``, by default this process's) could remove: root's boots are
    invisible to a normal user's ``gc``, whose unreadable ``owner.pid`` (in root's 0700 folder) would
    otherwise make every live boot of root's look orphaned."""
    import psutil

    me = os.geteuid() if euid is None else euid
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "uids"]):
        argv = proc.info["cmdline"] or []
        if QEMU_NAME not in argv or (me != 0 and proc.info["uids"].real != me):
            continue
        serial = next((a for a in argv if a.startswith("file:") and a.endswith("/serial.log")), None)
        if serial is None:
            continue
        guest_dir = Path(serial.removeprefix("file:")).parent
        try:
            owner: int | None = int((guest_dir / OWNER).read_text())
        except (FileNotFoundError, ValueError):
            owner = None  # killed before it wrote (all of) its record
        except OSError:
            continue  # a folder this user cannot read is not this user's to judge
        if owner is None or not psutil.pid_exists(owner):
            found.append((int(proc.info["pid"]), guest_dir))
    return found


def remove_orphan(pid: int, guest_dir: Path) -> None:
    """Stop an orphaned boot's QEMU (SIGTERM, then SIGKILL) and remove its folder."""
    import psutil

    try:
        proc = psutil.Process(pid)
        proc.terminate()
        try:
            proc.wait(timeout=launcher.STOP_GRACE_S)
        except psutil.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    except psutil.NoSuchProcess:
        pass
    shutil.rmtree(guest_dir, ignore_errors=True)
