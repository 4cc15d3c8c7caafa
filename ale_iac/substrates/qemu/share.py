"""The guest share as a bulk transport: the host half (files into and out of a unit's share folder).

The share is the unit folder's ``share/`` exported to the guest over 9p (``security_model=mapped-xattr``:
what the guest makes there, owners, modes, links and device nodes included, is only metadata in extended
attributes on the host, never a real device node or link) and mounted at ``/mnt/ale-share``. A transfer is
a folder of its own in the share (``in-<hex>``/``out-<hex>``), removed afterwards on both sides; the guest
half is one shell command run through the computer-server (:func:`stage_command`, :func:`collect_command`).
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
from pathlib import Path

from ale_iac.errors import AleIacError

GUEST_SHARE = "/mnt/ale-share"
_CHUNK = 1 << 20
MISSING_EXIT = 3
"""Exit code of :func:`collect_command` when the remote folder does not exist."""


class ShareError(AleIacError):
    """A transfer through the guest share failed; the message names the path."""


def new_transfer(share: Path, direction: str) -> tuple[Path, str]:
    """A fresh transfer folder, owned like the share (QEMU's unprivileged id serves it to the guest): its host
    path and its path in the guest."""
    name = f"{direction}-{secrets.token_hex(8)}"
    host = share / name
    host.mkdir(mode=0o700)
    owner = share.stat()
    os.chown(host, owner.st_uid, owner.st_gid)
    return host, f"{GUEST_SHARE}/{name}"


def put_tree(local: Path, dest: Path) -> int:
    """Copy a host folder's regular files and folders (no links) into ``dest``, each owned like ``dest``;
    returns the file count."""
    owner = dest.stat()
    count = 0
    for root, dirs, files in os.walk(local, followlinks=False):
        rel = Path(root).relative_to(local)
        folder = dest / rel
        folder.mkdir(parents=True, exist_ok=True)
        os.chown(folder, owner.st_uid, owner.st_gid)
        dirs[:] = [d for d in dirs if not (Path(root) / d).is_symlink()]
        for name in files:
            source = Path(root) / name
            if source.is_symlink() or not source.is_file():
                continue
            shutil.copy2(source, folder / name)
            os.chown(folder / name, owner.st_uid, owner.st_gid, follow_symlinks=False)
            count += 1
    return count


def take_tree(source: Path, local: Path) -> int:
    """Move the regular files under ``source`` (what the guest copied out) into ``local``, never writing
    outside it; returns the file count."""
    local.mkdir(parents=True, exist_ok=True)
    root = local.resolve()
    count = 0
    for folder, dirs, files in os.walk(source, followlinks=False):
        rel = Path(folder).relative_to(source)
        dirs[:] = [d for d in dirs if not (Path(folder) / d).is_symlink()]
        for name in files:
            path = Path(folder) / name
            if path.is_symlink() or not path.is_file():
                continue
            dest = root / rel / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            if not dest.parent.resolve().is_relative_to(root):
                raise ShareError(f"refusing to pull {rel / name}: it points outside {local}")
            if dest.is_symlink():
                dest.unlink()
            with path.open("rb") as src, dest.open("wb") as sink:
                shutil.copyfileobj(src, sink, _CHUNK)
            count += 1
    return count


def stage_command(guest_transfer: str, remote: str) -> str:
    """The guest half of staging: copy the transfer folder into ``remote`` (parents made, root-owned)."""
    src, dst = shlex.quote(guest_transfer), shlex.quote(remote)
    return f"mkdir -p {dst} && cp -R --preserve=mode,timestamps {src}/. {dst}/; rc=$?; rm -rf {src}; exit $rc"


def collect_command(remote: str, guest_transfer: str) -> str:
    """The guest half of collecting: copy the regular files under ``remote`` into the transfer folder."""
    src, dst = shlex.quote(remote), shlex.quote(guest_transfer)
    return (
        f"test -d {src} || exit {MISSING_EXIT}; cd {src} && "
        f"find . -type f -print0 | xargs -0 -r cp --parents --preserve=mode,timestamps -t {dst}"
    )
