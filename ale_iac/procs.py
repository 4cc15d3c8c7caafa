"""Questions about host processes, in one place, through psutil.

A pid alone never identifies a process: pids are recycled. ale-iac records a process as its pid
and its start time (:func:`start_time`), and treats a zombie (killed, not yet reaped) as gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
from collections.abc import Iterable, Sequence

import psutil

_PR_SET_PDEATHSIG = 1
# Loaded at import, in the parent: dlopen in a forked child of a threaded process can deadlock.
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def start_time(pid: int) -> float | None:
    """When ``pid`` started (seconds since the epoch), or None if it is gone or a zombie."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return float(process.create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def is_running(pid: int, started: float | None) -> bool:
    """True while the very process recorded as (``pid``, ``started``) runs."""
    return pid > 0 and started is not None and start_time(pid) == started


def alive(pid: int) -> bool:
    """Whether ``pid`` runs at all (a zombie counts as dead)."""
    return pid > 0 and start_time(pid) is not None


def all_pids() -> list[int]:
    return list(psutil.pids())


def parent(pid: int) -> int | None:
    try:
        return int(psutil.Process(pid).ppid())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def argv(pid: int) -> list[str]:
    try:
        return list(psutil.Process(pid).cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []


def cwd(pid: int) -> str | None:
    try:
        return str(psutil.Process(pid).cwd())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def namespace(pid: int, kind: str = "pid") -> str | None:
    """``kind:[inode]`` of a process's namespace (psutil has no word for namespaces)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    try:
        return [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def rss_bytes(pids: Iterable[int]) -> int:
    """Sum of the resident memory of ``pids`` (processes that are gone count 0)."""
    total = 0
    for pid in pids:
        try:
            total += int(psutil.Process(pid).memory_info().rss)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def wait_gone(pid: int, started: float | None, timeout: float) -> bool:
    """Wait until (``pid``, ``started``) has exited; True if it did within ``timeout``.

    Uses a pidfd, so the wait is a blocking poll on the kernel's exit notification, not a sleep
    loop; a process that is not our child cannot be waited for any other way.
    """
    if started is None:
        started = start_time(pid)
        if started is None:
            return True
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        if start_time(pid) != started:
            return True  # gone (or a zombie) or recycled
        ready, _, _ = select.select([fd], [], [], max(0.0, timeout))
        return bool(ready) or start_time(pid) != started
    finally:
        os.close(fd)


def die_with_parent(parent_pid: int | None = None) -> None:
    """In a child before exec (a ``preexec_fn``): get SIGKILL when the parent dies, however it dies.

    With ``parent_pid``, a parent that died between fork and here (its death signal already missed)
    makes the child exit instead.
    """
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def die_with_parent_argv(argv: Sequence[str], parent_pid: int) -> list[str]:
    """``argv`` wrapped so that the process gets SIGKILL when ``parent_pid`` dies, however it dies.

    The death signal is set by ``setpriv`` after the exec, not by a ``preexec_fn``: Python code run
    between fork and exec in a threaded process can deadlock, and a fork runs the C libraries' own
    fork handlers (gRPC's restart its poller threads in the child, which then abort when the child's
    descriptors close). Without a ``preexec_fn`` the child is made with vfork and runs nothing but
    the exec. If the parent died before the signal was set, the guard sees another parent and exits.
    """
    guard = f'[ "$PPID" = "{parent_pid}" ] || exit 1; exec "$0" "$@"'
    return ["setpriv", "--pdeathsig", "KILL", "--", "/bin/sh", "-c", guard, *argv]


def stop_by_closing_stdin(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Stop a helper process that exits when its standard input closes (the engine's provider process, a
    run's warm bridges): close it, wait, kill it if it takes longer than ``timeout``, close its stdout."""
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.close()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
