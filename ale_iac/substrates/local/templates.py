"""Template slots: the checkpoints an ephemeral local unit restores instead of booting (docs/checkpoint.md).

A pool unit is checkpointed in its own state dir and restored at each of its resets. An ephemeral unit lives
once, so a checkpoint of its own would never be restored: it leases a *slot* instead, one of at most
``MAX_SLOTS`` per template. A template is everything a dump depends on (the image, the spec but the unit's id
and labels, the sandbox's command line and seccomp filter, the kernel and CRIU: ``template_key``); a slot is a
folder ``<home>/templates/<key>/<n>/`` holding

- ``lock``: a unit's supervisor holds an exclusive ``flock`` on it for the unit's whole life, so no two live
  units share a slot, and the kernel frees it when the supervisor dies, however it dies (no gc needed);
- ``checkpoint/``: CRIU's images, the layer archive and ``meta.json``, as a pool unit's (``checkpoint.py``),
  made by the first unit that leases the slot (it boots, is dumped, and is restored at once) and restored by
  every later one.

A slot has a uid range of its own (``slot_uid_base``, chosen by the slot's path), not its unit's: a restore
brings back the user namespace the dump was made in, id mapping and all. Units on different slots, of one home or
of two, like any two units, have different ranges (up to ``uid_base_of``'s collisions); units on one slot follow
one another, and nothing of the one before is left when the next starts (its processes, disk and endpoint are
gone with it).

The supervisor imports this module: standard library and small modules of ours only.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ale_iac.substrates.local import checkpoint
from ale_iac.substrates.local.sandboxes import uid_base_of

TEMPLATES_DIR = "templates"
"""In the ale-iac home, beside ``sandboxes/``."""
MAX_SLOTS = 8
"""Slots per template: as many ephemeral units of one template at once restore; the next ones boot."""
LOCK_FILE = "lock"
KEY_LENGTH = 16
UNUSED_FOR_S = 7 * 24 * 3600
"""A slot no unit has leased for this long is ``gc``'s (its lock file's time is the last lease's)."""


@dataclass
class Slot:
    """A leased slot: held until ``lock_fd`` is closed (or its process dies)."""

    folder: Path
    uid_base: int
    lock_fd: int

    @property
    def checkpoint(self) -> Path:
        return self.folder / checkpoint.CHECKPOINT_DIR

    def has_checkpoint(self) -> bool:
        return (self.checkpoint / checkpoint.META_FILE).is_file()

    def drop_checkpoint(self) -> None:
        """Remove the slot's checkpoint (incomplete, or one that did not restore); the lock stays held."""
        if self.checkpoint.exists():
            shutil.rmtree(self.checkpoint)


def templates_dir(home: Path) -> Path:
    return home / TEMPLATES_DIR


def template_key(parts: dict[str, Any]) -> str:
    """A short, stable name for what a dump depends on (``parts``: JSON-serializable)."""
    encoded = json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:KEY_LENGTH]


def slot_uid_base(folder: Path) -> int:
    """The host uid of root in every unit restored from the slot in ``folder`` (one of the sandboxes' ranges,
    chosen by the slot's path: the same template in two ale-iac homes, whose units may live at the same time, has
    slots of different ranges)."""
    return uid_base_of(f"template:{folder}")


def _try_lock(folder: Path) -> int | None:
    """The slot's lock, taken without waiting (its descriptor), or None while a unit holds it."""
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def lease(root: Path, key: str, slots: int = MAX_SLOTS) -> Slot | None:
    """The first free slot of template ``key`` under ``root``, locked for the caller; None when all are taken."""
    template = root / key
    template.mkdir(mode=0o700, parents=True, exist_ok=True)
    for number in range(slots):
        folder = template / str(number)
        folder.mkdir(mode=0o700, exist_ok=True)
        fd = _try_lock(folder)
        if fd is not None:
            os.utime(fd)  # the last lease: gc keeps a slot in use
            return Slot(folder, slot_uid_base(folder), fd)
    return None


def _leased(folder: Path) -> bool:
    fd = _try_lock(folder)
    if fd is None:
        return True
    os.close(fd)  # the probe's own lock goes with it
    return False


def _usable(folder: Path, now: float) -> bool:
    """A slot worth keeping: leased lately, with a complete checkpoint whose image is still there."""
    with contextlib.suppress(OSError):
        if now - (folder / LOCK_FILE).stat().st_mtime > UNUSED_FOR_S:
            return False
    meta_file = folder / checkpoint.CHECKPOINT_DIR / checkpoint.META_FILE
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, ValueError):
        return False
    rootfs = meta.get("rootfs") if isinstance(meta, dict) else None
    return isinstance(rootfs, str) and Path(rootfs).is_dir()


def leftovers(root: Path, now: float | None = None) -> list[Path]:
    """Slots no unit holds that are of no use: no complete checkpoint (a unit killed while it made one), one of
    an image that is gone, or one no unit leased for ``UNUSED_FOR_S`` (a template the code or the kernel no
    longer makes). ``gc`` removes them; a usable slot is kept for the next unit of its template."""
    if not root.is_dir():
        return []
    now = time.time() if now is None else now
    found = []
    for template in sorted(root.iterdir()):
        if not template.is_dir() or template.is_symlink():
            continue
        for folder in sorted(template.iterdir()):
            if folder.is_dir() and not folder.is_symlink() and not _usable(folder, now) and not _leased(folder):
                found.append(folder)
    return found


def remove(folder: Path) -> None:
    """Remove a slot, unless a unit has leased it meanwhile; then its template folder, once it is empty."""
    fd = _try_lock(folder)
    if fd is None:
        return
    try:
        shutil.rmtree(folder)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        folder.parent.rmdir()  # only when empty
