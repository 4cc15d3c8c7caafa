"""Local sandboxes: an image's rootfs run in Linux namespaces on this host (no VM, no daemon).

Standard library only (no Pulumi): the Pulumi dynamic provider in ``ale_iac.infra.host_units`` calls
it, and so do ``ale-iac gc``, the image cache, the tests and the benchmarks.

Shape of one sandbox (``start`` returns once all of this runs; it does not wait for the
computer-server, which is the runtime side's readiness check)::

    supervisor (python -m ale_iac.substrates.local.supervisor, its own session, detached)
    |   private mount namespace: disk.img (ext4, loop) + id-mapped image + overlay
    |   thread "endpoint": 127.0.0.1:<host port> -> (token checked) -> sandbox netns 127.0.0.1:8000
    +-- bwrap (as root of the sandbox's user namespace) --unshare-{pid,net,ipc,uts,cgroup} --seccomp
    |   +-- setpriv (bounding set cut) -> ale-init (PID 1) -> Xvfb, openbox, computer-server :8000
    +-- slirp4netns ... tap0   (only when the spec allows outbound network)

Isolation (each point is checked from inside by ``tests/substrates/test_isolation.py``):

* A user namespace per sandbox: uid/gid 0..65535 inside are an unprivileged host range that
  belongs to no host user (``uid_base_of``), also when ale-iac runs as root. Run by a normal user,
  the same runtime works rootless (``host.host_mode``; docs/rootless.md): root inside is that user,
  the writable layer a tmpfs, the image the user's own copy. Host-wide kernel
  settings (``/proc/sys``) are read-only inside, by the kernel's own rules and by a read-only bind.
* A seccomp filter (``ale_iac.substrates.seccomp``), a cut capability and bounding set,
  ``no_new_privs``.
* The writable layer and the logs are an ext4 file system of ``disk_gb`` GiB in ``disk.img``,
  mounted ``nosuid,nodev`` only inside the sandbox's mount namespaces: no host process sees the
  files the sandbox writes, and their size is bounded. State dirs are 0700.
* No outbound network unless the spec allows it: then the network namespace has only ``lo``, and
  nothing on the host opens connections on the sandbox's behalf.
* The endpoint requires the sandbox's token (``auth_token``), so another user of the host cannot
  drive it; it is served on the host's 127.0.0.1 only.
* cgroup limits on memory, tasks (``pids_limit``) and CPU time (a quota from ``vcpus``).
* Every process hangs off the supervisor: the sandbox and slirp4netns get SIGKILL when it dies
  (PR_SET_PDEATHSIG, bwrap --die-with-parent, slirp --exit-fd), and the sandbox is PID 1 of its
  own PID namespace, so killing it kills everything inside.

This module starts, stops and resets sandboxes; ``sandboxes`` holds their records on this host (spec, state,
folder, logs, token), ``host`` what this host offers them (root or rootless, the checks ``start`` enforces).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ale_iac import procs
from ale_iac.files import write_json_atomic
from ale_iac.substrates.local import cgroups, checkpoint
from ale_iac.substrates.local.host import MODE_ROOTLESS, check_host, host_mode
from ale_iac.substrates.local.sandboxes import (
    LOGS_DIR,
    SECCOMP_FILE,
    SPEC_FILE,
    SUPERVISOR_LOG,
    TOKEN_FILE,
    LocalSandboxSpec,
    LocalSandboxState,
    SandboxError,
    check_sandbox_id,
    is_alive,
    log_tails,
    state_dir_of,
    state_from_dir,
    write_private,
)

# --- start -------------------------------------------------------------------------------------


def start(spec: LocalSandboxSpec, *, home: Path | None = None, timeout: float = 30.0) -> LocalSandboxState:
    """Start a sandbox and return once its processes run and its endpoint listens (a unit from a template slot:
    once its endpoint listens, while its supervisor restores it; a connection waits until it is served).

    The supervisor is started through ``setsid -f`` so it is not our child: the caller (a
    short-lived Pulumi provider process) can exit without taking it along or leaving a zombie.
    On any failure everything started so far is stopped and the state dir removed.
    """
    check_host()
    check_sandbox_id(spec.sandbox_id)
    _check_rootfs(spec)
    _check_checkpoint(spec)
    folder = _make_state_dir(spec, home)
    return _start_in(spec, folder, home, timeout)


def _start_in(spec: LocalSandboxSpec, folder: Path, home: Path | None, timeout: float) -> LocalSandboxState:
    message = _launch_supervisor(spec, folder, home, timeout)
    if not message.get("ok"):
        error = message.get("error", "the supervisor exited before the sandbox was ready")
        tails = log_tails(state_from_dir(folder))
        stop(spec.sandbox_id, home=home)
        raise SandboxError(f"sandbox {spec.sandbox_id} failed to start: {error}\n{tails}".rstrip())
    return LocalSandboxState.from_json(message["state"])


def _check_rootfs(spec: LocalSandboxSpec) -> None:
    rootfs = Path(spec.rootfs)
    if not rootfs.is_dir():
        raise SandboxError(f"rootfs {rootfs} does not exist; build the image first (ale-iac images build)")
    if not (rootfs / spec.init.lstrip("/")).is_file():
        raise SandboxError(f"rootfs {rootfs} has no init {spec.init}; is it an ale-iac image?")
    check_rootfs_owner(rootfs)


def _check_checkpoint(spec: LocalSandboxSpec) -> None:
    """A checkpointed sandbox needs root mode, no outbound network (slirp4netns would have to follow each
    restore into its new network namespace) and CRIU (``checkpoint.criu_command`` says what is missing)."""
    if spec.template and not spec.checkpoint:
        raise SandboxError(f"sandbox {spec.sandbox_id}: a template is a checkpoint; it needs checkpoint: true")
    if not spec.checkpoint:
        return
    if host_mode() == MODE_ROOTLESS:
        raise SandboxError(f"sandbox {spec.sandbox_id}: checkpoints need root (CRIU restores namespaces)")
    if spec.allow_outbound:
        raise SandboxError(f"sandbox {spec.sandbox_id}: a checkpointed sandbox cannot have outbound network")
    try:
        checkpoint.criu_command()
    except checkpoint.CheckpointError as exc:
        raise SandboxError(f"sandbox {spec.sandbox_id}: {exc}") from None


def _make_state_dir(spec: LocalSandboxSpec, home: Path | None, *, kept: bool = False) -> Path:
    """The sandbox's state dir (0700, new: an existing one is refused) with its spec, token and seccomp filter.
    With ``kept``, the dir is the one a reset left holding only its checkpoint."""
    from ale_iac.substrates.seccomp import compile_bpf

    folder = state_dir_of(spec.sandbox_id, home)
    folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if kept:
        left = sorted(entry.name for entry in folder.iterdir())
        if left != [checkpoint.CHECKPOINT_DIR]:
            raise SandboxError(f"sandbox {spec.sandbox_id}: {folder} holds {left}, not only its checkpoint")
    else:
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            raise SandboxError(f"sandbox {spec.sandbox_id} already exists ({folder})") from None
    try:
        os.chmod(folder, 0o700)  # whatever the umask
        (folder / LOGS_DIR).mkdir(mode=0o700)
        write_json_atomic(folder / SPEC_FILE, spec.to_json())
        write_private(folder / TOKEN_FILE, secrets.token_urlsafe(32).encode())
        write_private(folder / SECCOMP_FILE, compile_bpf())
    except BaseException:
        _remove_tree(folder)
        raise
    return folder


def _launch_supervisor(spec: LocalSandboxSpec, folder: Path, home: Path | None, timeout: float) -> dict[str, Any]:
    """Start the supervisor detached and read what it reports on its ready pipe (the sandbox is stopped if that
    fails)."""
    read_fd, write_fd = os.pipe()
    env = {k: v for k, v in os.environ.items() if k != "CONTAINER_NAME"}
    try:
        log_fd = os.open(folder / LOGS_DIR / SUPERVISOR_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(log_fd, "ab") as logf:
            launcher = subprocess.Popen(
                ["setsid", "-f", *supervisor_command(folder, write_fd)],
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd,),
                cwd=folder,
                env=env,
            )
        os.close(write_fd)
        write_fd = -1
        launcher.wait()
        message = _read_ready(read_fd, timeout)
    except BaseException:
        if write_fd >= 0:
            os.close(write_fd)
        os.close(read_fd)
        stop(spec.sandbox_id, home=home)
        raise
    os.close(read_fd)
    return message


def check_rootfs_owner(rootfs: Path) -> None:
    """Rootless, the image must be the caller's own: its files' owner is what becomes root inside.

    Without privilege there is no id-mapped mount, so an image owned by host root would show every
    file as the overflow id (nobody) inside, and the sandbox's root could write none of them.
    """
    if host_mode() != MODE_ROOTLESS:
        return
    owner = rootfs.stat().st_uid
    if owner != os.geteuid():
        raise SandboxError(
            f"rootless sandboxes run an image of your own, and {rootfs} belongs to uid {owner}: use the copy "
            "`ale-iac images` unpacks into your cache from a published image (docs/rootless.md), "
            "or run as root"
        )


def supervisor_command(folder: Path, ready_fd: int) -> list[str]:
    """The supervisor's command line. ``ale_iac.infra`` imports nothing heavy at package level, so
    the long-lived supervisor stays small (the standard library and its own module)."""
    return [sys.executable, "-m", "ale_iac.substrates.local.supervisor", str(folder), "--ready-fd", str(ready_fd)]


def _read_ready(fd: int, timeout: float) -> dict[str, Any]:
    """One JSON line from the supervisor; EOF means it died, silence past ``timeout`` is an error."""
    deadline = time.monotonic() + timeout
    data = b""
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return {"ok": False, "error": f"the supervisor did not report within {timeout:.0f} s"}
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    if not data.strip():
        return {"ok": False, "error": "the supervisor exited before the sandbox was ready"}
    try:
        message: dict[str, Any] = json.loads(data)
    except ValueError:
        return {"ok": False, "error": f"unreadable message from the supervisor: {data[:200]!r}"}
    return message


# --- stop --------------------------------------------------------------------------------------


# Executables the supervisor starts with the state dir in their arguments or as their cwd.
_OWN_EXECUTABLES = frozenset({"bwrap", "slirp4netns"})
SUPERVISOR_MODULE = "ale_iac.substrates.local.supervisor"


def _live_pid_namespace(state: LocalSandboxState) -> str | None:
    """The sandbox's PID namespace, if it still is the sandbox's.

    Namespace inode numbers are reused as soon as a namespace dies, so the recorded one may now
    belong to another sandbox: matching processes by it alone once killed a live neighbour. While
    the recorded init (pid and start time) runs, its namespace is the original; once it is gone
    the kernel has killed everything in that namespace, so there is nothing left to find by it.
    """
    if state.init_pid is None or not procs.is_running(state.init_pid, state.init_start_time):
        return None
    return state.pid_namespace


def _owned_processes(folder: Path, pidns: str | None) -> list[tuple[int, float]]:
    """(pid, start time) of every process that belongs to the sandbox in ``folder``.

    Ours are: the supervisor (its module and the state dir in its argv); the unshare/bwrap and
    slirp4netns it started (the state dir in their argv, or as their working directory); and
    every process in the sandbox's PID namespace. A recycled pid cannot match any of these, and
    neither can a user's shell that happens to look at the state dir.
    """
    marker = re.compile(re.escape(str(folder)) + r"(?=/|,|$)")
    own = os.getpid()
    found = []
    for pid in procs.all_pids():
        if pid == own:
            continue
        argv = procs.argv(pid)
        if not argv:
            continue
        exe = os.path.basename(argv[0])
        mentions = any(marker.search(arg) for arg in argv)
        belongs = (
            (any(SUPERVISOR_MODULE in arg for arg in argv) and mentions)
            or (exe in _OWN_EXECUTABLES and (mentions or procs.cwd(pid) == str(folder)))
            or (pidns is not None and procs.namespace(pid) == pidns)
        )
        if belongs:
            start_time = procs.start_time(pid)
            if start_time is not None:
                found.append((pid, start_time))
    return found


def _kill_session(state: LocalSandboxState, owned: list[tuple[int, float]]) -> None:
    """SIGKILL the supervisor's process group (it leads its own session), if it is provably ours.

    That is so while the supervisor itself runs, or while one of our processes is still in the
    group: a pid in use as a process group id is never handed out again, so the group cannot be
    someone else's. This also reaches helpers that carry no marker of the sandbox.
    """
    group = state.supervisor_pid
    if group <= 0:
        return
    if is_alive(state) or any(procs.group(pid) == group for pid, _ in owned):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)


def _kill(pid: int, start_time: float | None, sig: int) -> None:
    if start_time is not None and procs.start_time(pid) != start_time:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _mounts_under(folder: Path) -> list[str]:
    """Mount points at or below ``folder`` in our mount namespace, deepest first."""
    prefix = str(folder)
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    points = [line.split()[4].replace("\\040", " ") for line in lines]
    return sorted((p for p in points if p == prefix or p.startswith(prefix + "/")), key=len, reverse=True)


def stop(
    sandbox_id: str,
    *,
    home: Path | None = None,
    timeout: float = 10.0,
    grace: bool = True,
    keep_checkpoint: bool = False,
) -> bool:
    """Stop a sandbox and delete everything it left: processes, port forward, cgroup, files.

    Idempotent: returns False when there was nothing to stop. Works when the supervisor is gone
    (SIGKILLed, or the host rebooted), because every process of the sandbox is found from the
    state dir (see ``_owned_processes``) rather than from the supervisor. With ``grace`` the supervisor
    stops the sandbox in order and keeps the tails of its logs in the state dir on its way out; without
    (a reset, which deletes them anyway), it is killed at once and its sandbox with it, as after a crash.
    With ``keep_checkpoint`` (a reset of a checkpointed sandbox) the state dir stays, holding only that.
    """
    folder = state_dir_of(sandbox_id, home)
    if not folder.exists():
        return False
    state = state_from_dir(folder)
    if is_alive(state):
        # SIGTERM: the supervisor stops the sandbox in order (SIGTERM to its init, then SIGKILL). SIGKILL: the
        # sandbox dies with it (PR_SET_PDEATHSIG); whatever lingers is killed below.
        _kill(state.supervisor_pid, state.supervisor_start_time, signal.SIGTERM if grace else signal.SIGKILL)
        if not procs.wait_gone(state.supervisor_pid, state.supervisor_start_time, timeout):
            _kill(state.supervisor_pid, state.supervisor_start_time, signal.SIGKILL)
            procs.wait_gone(state.supervisor_pid, state.supervisor_start_time, 5.0)
    # Whatever is left (a supervisor that was SIGKILLed cannot clean up), killed outright.
    for _ in range(3):
        left = _owned_processes(folder, _live_pid_namespace(state))
        if not left:
            break
        _kill_session(state, left)
        for pid, start_time in left:
            _kill(pid, start_time, signal.SIGKILL)
        for pid, start_time in left:
            procs.wait_gone(pid, start_time, 5.0)
    else:
        left = _owned_processes(folder, _live_pid_namespace(state))
        if left:
            raise SandboxError(f"sandbox {sandbox_id}: processes {[p for p, _ in left]} do not die")
    # No cgroups in the state: the supervisor may have died between making them and recording
    # them, so look for them by name.
    paths = [Path(p) for p in state.cgroups] or cgroups.find(sandbox_id, str(folder))
    cgroups.kill_members(paths)  # what nothing above found (a restore stopped midway)
    try:
        cgroups.remove(paths, sandbox_id)
    except cgroups.CgroupError as exc:
        raise SandboxError(str(exc)) from None
    # The overlay was mounted in a private mount namespace that died with the sandbox; a mount
    # visible here would mean someone mounted into the state dir by hand. Never delete through it.
    for point in _mounts_under(folder):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)
    left_mounts = _mounts_under(folder)
    if left_mounts:
        raise SandboxError(f"sandbox {sandbox_id}: cannot unmount {', '.join(left_mounts)}")
    _remove_state_dir(folder, keep_checkpoint)
    return True


def _remove_state_dir(folder: Path, keep_checkpoint: bool) -> None:
    if not keep_checkpoint:
        _remove_tree(folder)
        return
    for entry in folder.iterdir():
        if entry.name == checkpoint.CHECKPOINT_DIR:
            continue
        if entry.is_dir() and not entry.is_symlink():
            _remove_tree(entry)
        else:
            entry.unlink()


def reset(sandbox_id: str, *, home: Path | None = None, timeout: float = 30.0) -> LocalSandboxState:
    """Replace a sandbox by a fresh one of the same spec under the same id (a pool unit between leases).

    Nothing of the old one survives: ``stop`` deletes its processes, disk and state dir, and ``start``
    makes all of them anew, with a new endpoint port and a new token (read them from the returned
    state). The id, and so the state dir and the Pulumi resource that owns it, stay the same. The old
    sandbox is killed, not stopped in order: nothing of it is kept, so an orderly stop (a quarter of a
    second, the supervisor's and the init's SIGTERM rounds) would buy nothing. A checkpointed sandbox
    keeps its checkpoint, and the new one is a restore of it on a new layer (docs/checkpoint.md); a checkpoint
    that does not restore (CRIU or the kernel changed under it, its files damaged) is dropped, and the unit
    boots afresh and makes a new one, which its supervisor log says.
    """
    folder = state_dir_of(sandbox_id, home)
    try:
        spec = LocalSandboxSpec.from_json(json.loads((folder / SPEC_FILE).read_text()))
    except FileNotFoundError:
        raise SandboxError(f"sandbox {sandbox_id} does not exist ({folder}): nothing to reset") from None
    kept = spec.checkpoint and (folder / checkpoint.CHECKPOINT_DIR / checkpoint.META_FILE).is_file()
    stop(sandbox_id, home=home, grace=False, keep_checkpoint=kept)
    if not kept:
        return start(spec, home=home, timeout=timeout)
    try:
        return _start_in(spec, _make_state_dir(spec, home, kept=True), home, timeout)
    except SandboxError as exc:
        stop(sandbox_id, home=home, grace=False)  # whatever the failed start left, its checkpoint included
        fresh = start(spec, home=home, timeout=timeout)
        reason = str(exc).splitlines()[0]
        with open(Path(fresh.state_dir) / LOGS_DIR / SUPERVISOR_LOG, "a") as supervisor_log:
            supervisor_log.write(f"[reset] the checkpoint did not restore, so the unit booted afresh: {reason}\n")
        return fresh


def _remove_tree(folder: Path) -> None:
    """``rmtree`` that tolerates a concurrent ``stop`` of the same sandbox (gc racing a destroy)."""

    def ignore_missing(_func: object, _path: str, exc_info: tuple[type[BaseException], BaseException, object]) -> None:
        if not isinstance(exc_info[1], FileNotFoundError):
            raise exc_info[1]

    shutil.rmtree(folder, onerror=ignore_missing)
