"""What an earlier test session left running, found and collected when the next one starts.

A test's units live in ale-iac homes under pytest's temporary folders (the per-test home of
``tests/conftest.py``, the session sandbox's own). A session that dies before its teardown (SIGKILL, an
interrupt that kills the workers, a host that ran out of memory) leaves their units running, and pytest
deletes those folders a few sessions later, with the records ``ale-iac gc`` would have needed to find them.
So before pytest makes its new folder (and deletes the oldest), :func:`sweep_earlier_sessions` runs
``ale-iac gc`` in every home of an earlier session that still holds a unit: a local sandbox's state folder or a
qemu unit's folder (a substrate removes its unit's folder when it destroys the unit, so one that is there is a
unit that was never destroyed).

A session that is still running is never touched: pytest's numbered folder holds a ``.lock`` with the pid of
the session that made it (removed at its exit); a folder whose lock names a live process is skipped.
"""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import psutil

UNIT_FOLDERS = ("sandboxes", "qemu")
"""The home's subfolders that hold a folder per live unit (local, qemu)."""
HOME_DEPTHS = ("*", "popen-gw*/*")
"""Where homes sit in a session's folder: ``pytest-N/<home>`` (one process), ``pytest-N/popen-gwK/<home>``
(an xdist worker's ``basetemp``)."""
GC_TIMEOUT_S = 300.0


def pytest_temp_root() -> Path:
    """Where pytest makes its numbered session folders, as pytest itself decides it (``tmp_path_factory``)."""
    temproot = Path(os.environ.get("PYTEST_DEBUG_TEMPROOT") or tempfile.gettempdir()).resolve()
    try:
        user = getpass.getuser()
    except (ImportError, KeyError, OSError):
        user = "unknown"
    return temproot / f"pytest-of-{user}"


def session_alive(session_dir: Path) -> bool:
    """Whether the session that made ``session_dir`` (``pytest-N``) still runs: its lock names a live pid."""
    try:
        pid = int((session_dir / ".lock").read_text().strip() or "0")
    except (OSError, ValueError):
        return False
    return pid > 0 and psutil.pid_exists(pid)


def homes_with_units(session_dir: Path) -> list[Path]:
    """The ale-iac homes in ``session_dir`` that hold a unit's folder."""
    homes: set[Path] = set()
    for depth in HOME_DEPTHS:
        for sub in UNIT_FOLDERS:
            for unit in session_dir.glob(f"{depth}/{sub}/*"):
                if unit.is_dir():
                    homes.add(unit.parent.parent)
    return sorted(homes)


def collect_home(home: Path) -> str:
    """``ale-iac gc`` in ``home``: its stacks, its units, what its runs left. Its report (or why it failed)."""
    env = {**os.environ, "ALE_IAC_HOME": str(home)}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "ale_iac", "gc"],
            env=env,
            capture_output=True,
            text=True,
            timeout=GC_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"ale-iac gc did not finish in {GC_TIMEOUT_S:.0f} s"
    text = (done.stdout + done.stderr).strip()
    return text if done.returncode == 0 else f"ale-iac gc exited {done.returncode}: {text}"


def sweep_session(session_dir: Path, collect: Callable[[Path], str] = collect_home) -> dict[Path, str]:
    """Collect the units of one session folder's homes, unless its session still runs."""
    if session_dir.is_symlink() or not session_dir.is_dir() or session_alive(session_dir):
        return {}
    return {home: collect(home) for home in homes_with_units(session_dir)}


def sweep_earlier_sessions(
    root: Path | None = None, *, collect: Callable[[Path], str] = collect_home
) -> dict[Path, str]:
    """:func:`sweep_session` for every session folder under ``root`` (default :func:`pytest_temp_root`); each
    swept home with gc's report."""
    root = root if root is not None else pytest_temp_root()
    swept: dict[Path, str] = {}
    for session_dir in sorted(root.glob("pytest-*")) if root.is_dir() else []:
        swept.update(sweep_session(session_dir, collect))
    return swept
