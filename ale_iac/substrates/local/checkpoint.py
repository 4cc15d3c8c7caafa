"""CRIU for a checkpointed local pool unit: which CRIU, and the dump and restore command lines.

A local unit whose spec asks for a checkpoint (``LocalSandboxSpec.checkpoint``: pool units of a route with
``checkpoint: true``) is dumped once, ready and untouched, by its first supervisor; every reset then
restores that dump into a fresh writable layer instead of booting the desktop again (docs/checkpoint.md).
The supervisor imports this module, so it uses the standard library and ``ale_iac.paths`` only.

CRIU must be 4.2 or later on current kernels (``scripts/criu.sh`` says why and fetches Debian unstable's
build into ale-iac's cache, with an executable that runs it through its own dynamic loader); ``ALE_IAC_CRIU``
(an executable) comes before it, a ``criu`` of at least that version on ``PATH`` after it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from ale_iac.paths import cache_root

MIN_VERSION = (4, 2)
CHECKPOINT_DIR = "checkpoint"
"""In the unit's state dir (0700): ``images/`` (CRIU's), ``layer.tar`` (the writable layer and logs as they
were at the dump: an archive, so that no file the sandbox wrote lies on the host's file system), ``meta.json``;
kept across resets, removed with the unit."""
IMAGES = "images"
LAYER_COPY = "layer.tar"
META_FILE = "meta.json"
PIDFILE = "restored.pid"


class CheckpointError(Exception):
    pass


def _version(argv: list[str]) -> tuple[int, ...] | None:
    try:
        done = subprocess.run([*argv, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return None
    found = re.search(r"Version:\s*(\d+)\.(\d+)", done.stdout)
    return (int(found.group(1)), int(found.group(2))) if found else None


def criu_command() -> list[str]:
    """The argv that runs CRIU here (``ALE_IAC_CRIU``, then ale-iac's fetched copy, then ``criu`` on PATH)."""
    override = os.environ.get("ALE_IAC_CRIU")
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise CheckpointError(f"ALE_IAC_CRIU={override} is not an executable file")
        return [override]
    fetched = cache_root() / "criu" / "current" / "criu"  # scripts/criu.sh's
    if os.access(fetched, os.X_OK):
        return [str(fetched)]
    system = shutil.which("criu")
    if system is not None:
        version = _version([system])
        if version is not None and version >= MIN_VERSION:
            return [system]
        shown = ".".join(map(str, version)) if version else "unknown"
        raise CheckpointError(
            f"{system} is CRIU {shown}; checkpoints need {'.'.join(map(str, MIN_VERSION))} or later "
            "(scripts/criu.sh fetch)"
        )
    raise CheckpointError("no CRIU: run scripts/criu.sh fetch (checkpointed local units need CRIU 4.2 or later)")


def criu_status() -> tuple[bool, str]:
    """Whether CRIU can checkpoint local units here, and which (what ``doctor`` prints)."""
    try:
        argv = criu_command()
    except CheckpointError as exc:
        return False, str(exc)
    version = _version(argv)
    if version is None or version < MIN_VERSION:
        return False, f"{argv[-1]} does not report CRIU {'.'.join(map(str, MIN_VERSION))} or later"
    done = subprocess.run([*argv, "check"], capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        problem = (done.stderr or done.stdout).strip().splitlines()
        return False, f"criu check failed: {problem[-1] if problem else done.returncode}"
    return True, f"CRIU {'.'.join(map(str, version))} ({argv[-1]}): criu check passes"


def external_file_key(pid: int, fd: int) -> str:
    """CRIU's name for a file a task holds that lies outside its dump (``file[<mount id>:<inode>]``, hex)."""
    with open(f"/proc/{pid}/fdinfo/{fd}") as handle:
        mount_id = next(int(line.split()[1]) for line in handle if line.startswith("mnt_id:"))
    inode = os.stat(f"/proc/{pid}/fd/{fd}").st_ino
    return f"file[{mount_id:x}:{inode:x}]"


def dump_argv(criu: list[str], pid: int, images: Path, log_mount: str, external_file: str) -> list[str]:
    """Dump the tree of ``pid`` (the sandbox's init) into ``images``; the tree is killed once dumped.

    ``mnt[]``: every mount CRIU cannot dump (the binds bubblewrap made of the supervisor's) is external;
    the logs' bind is named so that a restore can give it the new layer's logs folder."""
    # fmt: off
    return [
        *criu, "dump", "--tree", str(pid), "--images-dir", str(images), "--log-file", "dump.log",
        "--external", "mnt[]", "--external", f"mnt[{log_mount}]:logs", "--external", external_file,
        "--manage-cgroups=ignore",
    ]
    # fmt: on


def restore_argv(criu: list[str], images: Path, root: str, logs: str, inherit_fd: int, external_file: str) -> list[str]:
    """Restore the dump in ``images`` under the root ``root`` as a sibling of CRIU (so a child of its
    caller, the supervisor), detached, in the caller's cgroups; ``logs`` is the new layer's logs folder and
    ``inherit_fd`` the caller's descriptor standing for the external file."""
    # fmt: off
    return [
        *criu, "restore", "--images-dir", str(images), "--log-file", "restore.log",
        "--root", root, "--ext-mount-map", "auto", "--external", f"mnt[logs]:{logs}",
        "--inherit-fd", f"fd[{inherit_fd}]:{external_file}",
        "--manage-cgroups=ignore", "--restore-detached", "--restore-sibling",
        "--pidfile", str(images.parent / PIDFILE),
    ]
    # fmt: on
