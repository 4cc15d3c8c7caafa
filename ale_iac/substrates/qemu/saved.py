"""Saved guest memory states: one cold boot per (disk, machine shape, runner), restored by every unit.

``ensure_saved_state`` boots a guest from the qcow2 export onto an overlay of its own, waits until its
agent reports ``waiting`` (the desktop and the computer-server are up, no unit's identity has been given:
nothing of any unit is in it), then stops it, writes its memory state with QMP ``migrate`` to
``state.bin`` (a file this process opens and hands QEMU over QMP: QEMU, unprivileged and barred from
spawning, neither names nor makes a file) and exits QEMU. The overlay, taken out of QEMU's folder and
frozen from then on (root's, 0444), becomes the read-only base of each restored unit's own overlay;
``launch.sh --incoming`` loads the state. The folder, named by a hash of its key, is renamed into place
under a lock; an interrupted save leaves a ``.b-*`` folder (with the pid of its QEMU in ``launched.json``)
that the next save, or ``ale-iac gc``, removes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from ale_iac.clock import utc_now
from ale_iac.paths import cache_root
from ale_iac.substrates.qemu.launcher import (
    LAUNCH_SCRIPT,
    Launched,
    Machine,
    QemuSubstrateError,
    Runner,
    alive,
    free_port,
    kill,
    launch,
    vm_dir,
    wait_for_sockets,
)
from ale_iac.substrates.qemu.qmp import AgentChannel, Qmp

LogFn = Callable[[str], None]
STATE = "state.bin"
OVERLAY = "disk.qcow2"
MANIFEST = "manifest.json"
LAUNCHED = "launched.json"
BOOT_TIMEOUT_S = 900.0
"""A cold boot under TCG takes about a minute on an idle 2-core host; far longer under load."""
SAVE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class SavedState:
    path: Path
    key: str

    @property
    def overlay(self) -> Path:
        return self.path / OVERLAY

    @property
    def state(self) -> Path:
        return self.path / STATE

    def manifest(self) -> dict[str, object]:
        data: dict[str, object] = json.loads((self.path / MANIFEST).read_text())
        return data


def states_dir() -> Path:
    return cache_root() / "qemu" / "states"


@functools.cache
def _host_qemu_version() -> str:
    done = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True, text=True, check=False)
    lines = done.stdout.splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else "unknown"


def state_key(machine: Machine, runner: Runner, runner_image: str | None = None) -> str:
    """What a saved state must match exactly to be restored: the disk, the machine shape, the QEMU that saved
    it (the host's version, or the runner image's tag: a state loads only into the same QEMU) and the launch
    script that started it."""
    qemu = f"container:{runner_image}" if runner == "container" else f"host:{_host_qemu_version()}"
    return (
        f"{machine.base}|{machine.kernel}|{machine.initrd}|{machine.accel}|{machine.vcpus}c|"
        f"{machine.memory_mb}m|{machine.width}x{machine.height}|{qemu}|launch:{_launch_digest()}"
    )


@functools.cache
def _launch_digest() -> str:
    """The launch script's hash: its command line is the machine the state was saved from (its devices, and
    how the state is read), so a state saved by an earlier script is never loaded by a later one."""
    return hashlib.sha256(LAUNCH_SCRIPT.read_bytes()).hexdigest()[:12]


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def find_saved_state(machine: Machine, runner: Runner, runner_image: str | None = None) -> SavedState | None:
    key = state_key(machine, runner, runner_image)
    found = SavedState(states_dir() / _digest(key), key)
    return found if (found.path / MANIFEST).is_file() else None


def record_launch(folder: Path, launched: Launched) -> None:
    (folder / LAUNCHED).write_text(json.dumps(dataclasses.asdict(launched)) + "\n")


def read_launch(folder: Path) -> Launched | None:
    try:
        data = json.loads((folder / LAUNCHED).read_text())
        return Launched(runner=data["runner"], pid=data.get("pid"), container_id=data.get("container_id"))
    except (OSError, ValueError, KeyError):
        return None


def stale_builds() -> list[Path]:
    """Save folders whose saver died: nobody holds their key's lock (a live save holds it throughout)."""
    from filelock import Timeout

    root = states_dir()
    found: list[Path] = []
    for folder in sorted(root.glob(".b-*")) if root.is_dir() else []:
        digest = folder.name.split("-")[1]
        try:
            with FileLock(str(root / f".{digest}.lock"), timeout=0):
                found.append(folder)
        except Timeout:
            continue
    return found


def remove_build(folder: Path) -> None:
    launched = read_launch(folder)
    if launched is not None:
        kill(launched, folder)
    shutil.rmtree(folder, ignore_errors=True)


def ensure_saved_state(
    machine: Machine, runner: Runner, *, runner_image: str | None = None, log: LogFn | None = None
) -> SavedState:
    """The saved state for ``machine`` (whose ``base`` is the export's disk), made by one cold boot if missing."""
    existing = find_saved_state(machine, runner, runner_image)
    if existing is not None:
        return existing
    key = state_key(machine, runner, runner_image)
    digest = _digest(key)
    root = states_dir()
    root.mkdir(parents=True, exist_ok=True)
    say = log or (lambda _line: None)
    with FileLock(str(root / f".{digest}.lock")):
        existing = find_saved_state(machine, runner, runner_image)
        if existing is not None:
            return existing
        for stale in root.glob(f".b-{digest}-*"):
            say(f"removing the leftover of an interrupted save: {stale}")
            remove_build(stale)
        work = root / f".b-{digest}-{os.getpid()}"
        work.mkdir(mode=0o700)
        say(f"cold boot of a guest to save its memory state ({key})")
        try:
            booted, saved = _cold_boot_and_save(work, machine, runner, runner_image, digest)
            _seal(work, key, booted, saved)
            final = root / digest
            work.rename(final)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
    say(f"memory state saved in {final} (cold boot {booted:.1f} s, save {saved:.1f} s)")
    return SavedState(final, key)


def _cold_boot_and_save(
    work: Path, machine: Machine, runner: Runner, runner_image: str | None, digest: str
) -> tuple[float, float]:
    """Boot a guest in ``work``, wait for its agent, save its memory state there and stop it; returns the boot's
    and the save's seconds. The guest is killed on any failure."""
    started = time.monotonic()
    launched = launch(runner, work, machine, free_port(), runner_image=runner_image, labels={"saved-state": digest})
    try:
        record_launch(work, launched)
        wait_for_sockets(launched, work, time.monotonic() + 60)
        agent = AgentChannel(vm_dir(work) / "agent.sock")
        try:
            agent.wait_for("waiting", time.monotonic() + BOOT_TIMEOUT_S)
        except TimeoutError:
            raise QemuSubstrateError(f"the guest did not boot within {BOOT_TIMEOUT_S:.0f} s") from None
        finally:
            agent.close()
        booted = time.monotonic() - started
        save_started = time.monotonic()
        _save(work, launched)
        saved = time.monotonic() - save_started
    except BaseException:
        with contextlib.suppress(Exception):
            kill(launched, work)
        raise
    kill(launched, work)
    return booted, saved


def _seal(work: Path, key: str, booted: float, saved: float) -> None:
    """The saved state's folder as it is kept: what only the boot needed removed, the overlay and the state
    read-only, and its manifest."""
    (vm_dir(work) / OVERLAY).rename(work / OVERLAY)  # out of QEMU's folder, root's again
    os.chown(work / OVERLAY, 0, 0)
    shutil.rmtree(vm_dir(work))  # the share, the sockets, the console log
    (work / LAUNCHED).unlink()
    for name in (OVERLAY, STATE):
        (work / name).chmod(0o444)
    manifest = {
        "key": key,
        "made_at": utc_now("seconds"),
        "cold_boot_seconds": round(booted, 2),
        "save_seconds": round(saved, 2),
        "state_bytes": (work / STATE).stat().st_size,
    }
    (work / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def _save(work: Path, launched: Launched) -> None:
    fd = os.open(work / STATE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with Qmp(vm_dir(work) / "qmp.sock", timeout=60) as qmp:
            qmp.execute_with_fd("getfd", fd, fdname="state")
            _migrate(qmp, work, launched)
    finally:
        os.close(fd)


def _migrate(qmp: Qmp, work: Path, launched: Launched) -> None:
    """The stopped guest's memory written to the descriptor QEMU holds as ``state``, to the end."""
    qmp.execute("stop")
    qmp.execute("migrate-set-parameters", **{"max-bandwidth": 8 << 30})
    qmp.execute("migrate", uri="fd:state")
    deadline = time.monotonic() + SAVE_TIMEOUT_S
    while True:
        status = (qmp.execute("query-migrate") or {}).get("status")
        if status == "completed":
            return
        if status in ("failed", "cancelled"):
            raise QemuSubstrateError(f"saving the guest's memory state failed ({status})")
        if time.monotonic() > deadline or not alive(launched, work):
            raise QemuSubstrateError("saving the guest's memory state did not finish")
        time.sleep(0.1)
