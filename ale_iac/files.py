"""Writing files whole: a reader sees the old content or the new, never half of it (standard library only)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ale_iac import procs


def write_atomic(path: Path, data: str | bytes, mode: int = 0o600) -> None:
    """Write ``path`` through a temporary file in the same folder and a rename; ``mode`` for a new file.

    The temporary name is unique per writer, so concurrent writers of one file never mix their bytes.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: Any, mode: int = 0o600) -> None:
    write_atomic(path, json.dumps(data, indent=2, default=str) + "\n", mode)


UNIX_PATH_MAX = 107
"""Longest path a Unix socket address holds (``sun_path`` is 108 bytes with its terminating NUL)."""


@contextlib.contextmanager
def unix_address(path: Path | str) -> Iterator[str]:
    """An address for ``bind``/``connect`` to the Unix socket at ``path``, however long the path: a
    long one is reached through a descriptor of its folder (``/proc/self/fd/<fd>/<name>``), which
    stays valid while the ``with`` lasts (a bound socket or a made connection outlives it)."""
    path = Path(path)
    if len(os.fsencode(path)) <= UNIX_PATH_MAX:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


PRIVATE_PREFIX = "ale-iac-p"


def sweep_private_dirs(root: Path | None = None, *, dry_run: bool = False) -> list[Path]:
    """Remove :class:`PrivateDir` folders (and the secrets in them) whose process is gone: one killed with
    SIGKILL never ran its cleanup. Only this user's, in ``root`` (the temp dir). ``ale-iac gc`` calls it."""
    removed: list[Path] = []
    for folder in sorted(Path(root or tempfile.gettempdir()).glob(f"{PRIVATE_PREFIX}*-*")):
        owner = folder.name[len(PRIVATE_PREFIX) :].split("-", 1)[0]
        with contextlib.suppress(OSError):
            if not owner.isdigit() or procs.alive(int(owner)) or folder.lstat().st_uid != os.getuid():
                continue
            if not folder.is_dir() or folder.is_symlink():
                continue
            if not dry_run:
                shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


class PrivateDir:
    """A folder only this user can enter (0700, made on first use), for secrets a child process reads
    from a file; ``remove`` deletes it with what it holds (so does garbage collection, or the exit of
    the process, if nobody called it)."""

    def __init__(self, parent: str | None = None) -> None:
        self._parent = parent
        self._path: Path | None = None
        self._cleanup: weakref.finalize[[str, bool], PrivateDir] | None = None

    def write(self, name: str, text: str) -> Path:
        if self._path is None:
            # The owner's pid in the name: what a SIGKILL leaves, sweep_private_dirs (ale-iac gc) finds.
            self._path = Path(tempfile.mkdtemp(prefix=f"{PRIVATE_PREFIX}{os.getpid()}-", dir=self._parent))
            self._cleanup = weakref.finalize(self, shutil.rmtree, str(self._path), True)
        path = self._path / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        return path

    def remove(self) -> None:
        if self._cleanup is not None:
            self._cleanup()  # runs rmtree once
        self._path = self._cleanup = None
