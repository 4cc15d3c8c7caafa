"""Local sandboxes: an image's rootfs run in Linux namespaces on this host (no VM, no daemon).

Pure Python and standard library only (no Pulumi): the Pulumi dynamic provider in
``ale_iac.infra.local`` calls it, and so do ``ale-iac gc``, the tests and the benchmarks.

Shape of one sandbox (``start`` returns once all of this runs; it does not wait for the
computer-server, which is the runtime side's readiness check)::

    supervisor (python -m ale_iac.infra.local_supervisor, its own session, detached)
    ├── unshare --mount --propagation private -- sh -c 'mount -t overlay ...; exec bwrap ...'
    │   └── bwrap --bind <merged> / --unshare-{pid,net,ipc,uts,cgroup} --as-pid-1 ...
    │       └── ale-init (PID 1 of the sandbox) -> Xvfb, openbox, computer-server :8000
    └── slirp4netns --disable-host-loopback --api-socket ... <sandbox pid> tap0
            add_hostfwd 127.0.0.1:<host port> -> 10.0.2.100:8000

* The image rootfs is the read-only lower layer of an overlayfs whose upper layer lives in the
  sandbox's state dir. The overlay is mounted inside a private mount namespace that only the
  sandbox's processes hold, so the mount cannot outlive them (bubblewrap 0.8 has no --overlay).
* No outbound network by default: tap0 gets 10.0.2.100/24 and no default route, slirp's DNS is
  disabled, and the sandbox has no CAP_NET_ADMIN/CAP_NET_RAW to add a route or forge frames.
  ``--disable-host-loopback`` keeps even an outbound-enabled sandbox off the host's 127.0.0.1.
* The server is reachable from the host's 127.0.0.1 only, through slirp's port forward.
* Every process hangs off the supervisor: the sandbox and slirp4netns get SIGKILL when it dies
  (PR_SET_PDEATHSIG, bwrap --die-with-parent, slirp --exit-fd), and the sandbox is PID 1 of its
  own PID namespace, so killing it kills everything inside.

State lives in ``${ALE_IAC_HOME:-~/.ale-iac}/sandboxes/<id>/`` (``spec.json``, ``state.json``,
``logs/``, the writable layer), so a garbage collector can find sandboxes a crashed run left.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ale_iac.errors import AleIacError

SANDBOX_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,47}$")
DEFAULT_INIT = "/usr/local/sbin/ale-init"
DEFAULT_SERVER_PORT = 8000
GUEST_ADDR = "10.0.2.100"
GUEST_CIDR = 24
SLIRP_DNS = "10.0.2.3"
TAP = "tap0"
MTU = 65520

SPEC_FILE = "spec.json"
STATE_FILE = "state.json"
LOGS_DIR = "logs"
SUPERVISOR_LOG = "supervisor.log"


class SandboxError(AleIacError):
    """A local sandbox could not be started or stopped."""


# --- data --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalSandboxSpec:
    """What to run: an image rootfs, a screen, network policy and resource hints."""

    sandbox_id: str
    rootfs: str
    screen_width: int = 1280
    screen_height: int = 800
    allow_outbound: bool = False
    vcpus: int | None = None
    memory_gb: float | None = None
    labels: dict[str, str] = field(default_factory=dict)
    server_port: int = DEFAULT_SERVER_PORT
    """Port of the computer-server inside the sandbox's own network namespace."""
    init: str = DEFAULT_INIT
    """The image's init (path inside the rootfs)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LocalSandboxSpec:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class LimitRecord:
    """One resource hint and what became of it on this host."""

    name: str
    requested: str
    applied: bool
    detail: str


@dataclass(frozen=True)
class LocalSandboxState:
    """A sandbox as recorded in its state dir; JSON-serializable."""

    sandbox_id: str
    supervisor_pid: int
    supervisor_start_time: int
    """Start time of the supervisor in clock ticks after boot (``/proc/<pid>/stat`` field 22), so
    that a recycled pid is never taken for the supervisor."""
    host_port: int
    endpoint: str
    state_dir: str
    rootfs: str
    labels: dict[str, str] = field(default_factory=dict)
    limits: list[LimitRecord] = field(default_factory=list)
    allow_outbound: bool = False
    phase: str = "starting"
    """starting | running | exited."""
    created_at: str = ""
    init_pid: int | None = None
    """Host pid of the sandbox's init (PID 1 inside)."""
    pid_namespace: str | None = None
    """``pid:[inode]`` of the sandbox's PID namespace: identifies every process inside it."""
    cgroup: str | None = None
    """Memory cgroup created for the sandbox (removed by ``stop``)."""
    exit_code: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LocalSandboxState:
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["limits"] = [LimitRecord(**item) for item in fields.get("limits", [])]
        return cls(**fields)


# --- locations ---------------------------------------------------------------------------------


def home_dir() -> Path:
    """``${ALE_IAC_HOME:-~/.ale-iac}``."""
    return Path(os.environ.get("ALE_IAC_HOME") or Path.home() / ".ale-iac").expanduser()


def sandboxes_dir(home: Path | None = None) -> Path:
    """Where state dirs live: ``<home>/sandboxes`` (``home`` defaults to ``home_dir()``)."""
    return (home if home is not None else home_dir()).resolve() / "sandboxes"


def state_dir_of(sandbox_id: str, home: Path | None = None) -> Path:
    check_sandbox_id(sandbox_id)
    return sandboxes_dir(home) / sandbox_id


def check_sandbox_id(sandbox_id: str) -> None:
    if not SANDBOX_ID_RE.match(sandbox_id):
        raise SandboxError(
            f"invalid sandbox id {sandbox_id!r}: lowercase letters, digits and '-', at most 48, "
            "starting with a letter or digit"
        )


# --- host checks -------------------------------------------------------------------------------

_TOOLS = (
    ("bwrap", "bubblewrap"),
    ("slirp4netns", "slirp4netns"),
    ("unshare", "util-linux"),
    ("setsid", "util-linux"),
    ("nsenter", "util-linux"),
    ("ip", "iproute2"),
)


@functools.cache
def check_host() -> None:
    """Raise a SandboxError saying what is missing for local sandboxes on this host."""
    if not sys.platform.startswith("linux"):
        raise SandboxError("local sandboxes need Linux (namespaces, overlayfs, bubblewrap)")
    if os.geteuid() != 0:
        raise SandboxError(
            "local sandboxes need root: the writable layer is an overlay mount and slirp4netns joins "
            "the sandbox's network namespace; run as root"
        )
    missing = [(tool, package) for tool, package in _TOOLS if shutil.which(tool) is None]
    if missing:
        names = ", ".join(tool for tool, _ in missing)
        packages = " ".join(sorted({package for _, package in missing}))
        raise SandboxError(
            f"{names} not installed; run: apt-get install -y {packages} (see scripts/apt-packages.txt)"
        )
    try:
        filesystems = Path("/proc/filesystems").read_text()
    except OSError:
        filesystems = ""
    if not re.search(r"\boverlay$", filesystems, re.MULTILINE):
        raise SandboxError(
            "the kernel has no overlayfs ('overlay' is not in /proc/filesystems); run: modprobe overlay"
        )


# --- /proc helpers -----------------------------------------------------------------------------


def proc_start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat`` (start time in clock ticks), or None if gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    rest = stat[stat.rindex(")") + 2 :].split()
    if rest[0] in ("Z", "X"):
        return None
    return int(rest[19])


def _proc_ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def _proc_pgid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[2])


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def pid_namespace(pid: int) -> str | None:
    return _readlink(f"/proc/{pid}/ns/pid")


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (by parent pid), from one scan of /proc."""
    children: dict[int, list[int]] = {}
    for candidate in _all_pids():
        parent = _proc_ppid(candidate)
        if parent is not None:
            children.setdefault(parent, []).append(candidate)
    found: list[int] = []
    todo = [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def rss_bytes(pids: Iterable[int]) -> int:
    """Sum of VmRSS over ``pids`` (processes that are gone count 0)."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    break
        except OSError:
            continue
    return total


def wait_pid_gone(pid: int, start_time: int | None, timeout: float) -> bool:
    """Wait until ``pid`` (with that start time) has exited; True if it did within ``timeout``.

    Uses a pidfd, so the wait is a blocking poll on the kernel's exit notification, not a sleep
    loop; a process that is not our child cannot be waited for any other way.
    """
    if start_time is None:
        start_time = proc_start_time(pid)
        if start_time is None:
            return True
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        if proc_start_time(pid) != start_time:
            return True  # gone (or a zombie) or recycled
        ready, _, _ = select.select([fd], [], [], max(0.0, timeout))
        return bool(ready) or proc_start_time(pid) != start_time
    finally:
        os.close(fd)


# --- state files -------------------------------------------------------------------------------


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def load_state(sandbox_id: str, *, home: Path | None = None) -> LocalSandboxState | None:
    """The recorded state of a sandbox, or None when it has no state dir."""
    folder = state_dir_of(sandbox_id, home)
    if not folder.is_dir():
        return None
    return _state_from_dir(folder)


def _state_from_dir(folder: Path) -> LocalSandboxState:
    try:
        return LocalSandboxState.from_json(json.loads((folder / STATE_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        pass
    # No readable state.json: the start was interrupted before the supervisor wrote one. Report
    # the dir anyway (as dead), so that a garbage collector can still stop() it.
    labels: dict[str, str] = {}
    rootfs = ""
    try:
        spec = LocalSandboxSpec.from_json(json.loads((folder / SPEC_FILE).read_text()))
        labels, rootfs = dict(spec.labels), spec.rootfs
    except (OSError, ValueError, TypeError):
        pass
    return LocalSandboxState(
        sandbox_id=folder.name, supervisor_pid=0, supervisor_start_time=0, host_port=0, endpoint="",
        state_dir=str(folder), rootfs=rootfs, labels=labels, phase="unknown",
    )


def list_sandboxes(*, home: Path | None = None) -> list[LocalSandboxState]:
    """Every sandbox with a state dir, running or not (a dead one still needs ``stop``)."""
    root = sandboxes_dir(home)
    if not root.is_dir():
        return []
    return [
        _state_from_dir(folder)
        for folder in sorted(root.iterdir())
        if folder.is_dir() and SANDBOX_ID_RE.match(folder.name)
    ]


def is_alive(state: LocalSandboxState) -> bool:
    """True while the sandbox's supervisor (the very process that was started) runs."""
    if state.supervisor_pid <= 0:
        return False
    return proc_start_time(state.supervisor_pid) == state.supervisor_start_time


def sandbox_pids(state: LocalSandboxState) -> list[int]:
    """The supervisor and every process under it (slirp4netns, bwrap, everything in the sandbox)."""
    if not is_alive(state):
        return []
    return descendants(state.supervisor_pid)


# --- start -------------------------------------------------------------------------------------


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _log_tails(folder: Path) -> str:
    parts = []
    for name in (SUPERVISOR_LOG, "init.log", "slirp4netns.log", "xvfb.log", "server.log"):
        text = _tail(folder / LOGS_DIR / name)
        if text:
            parts.append(f"--- {name} ---\n{text}")
    return "\n".join(parts)


def start(spec: LocalSandboxSpec, *, home: Path | None = None, timeout: float = 30.0) -> LocalSandboxState:
    """Start a sandbox and return once its processes run and the port forward exists.

    The supervisor is started through ``setsid -f`` so it is not our child: the caller (a
    short-lived Pulumi provider process) can exit without taking it along or leaving a zombie.
    On any failure everything started so far is stopped and the state dir removed.
    """
    check_host()
    check_sandbox_id(spec.sandbox_id)
    rootfs = Path(spec.rootfs)
    if not rootfs.is_dir():
        raise SandboxError(f"rootfs {rootfs} does not exist; build the image first (ale-iac images build)")
    if not (rootfs / spec.init.lstrip("/")).is_file():
        raise SandboxError(f"rootfs {rootfs} has no init {spec.init}; is it an ale-iac image?")
    folder = state_dir_of(spec.sandbox_id, home)
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        folder.mkdir()
    except FileExistsError:
        raise SandboxError(f"sandbox {spec.sandbox_id} already exists ({folder})") from None
    (folder / LOGS_DIR).mkdir()
    write_json_atomic(folder / SPEC_FILE, spec.to_json())

    read_fd, write_fd = os.pipe()
    env = {k: v for k, v in os.environ.items() if k != "CONTAINER_NAME"}
    try:
        with open(folder / LOGS_DIR / SUPERVISOR_LOG, "ab") as logf:
            launcher = subprocess.Popen(
                ["setsid", "-f", *supervisor_command(folder, write_fd)],
                stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                pass_fds=(write_fd,), cwd=folder, env=env,
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
    if not message.get("ok"):
        error = message.get("error", "the supervisor exited before the sandbox was ready")
        tails = _log_tails(folder)
        stop(spec.sandbox_id, home=home)
        raise SandboxError(f"sandbox {spec.sandbox_id} failed to start: {error}\n{tails}".rstrip())
    return LocalSandboxState.from_json(message["state"])


def supervisor_command(folder: Path, ready_fd: int) -> list[str]:
    """The supervisor's command line. ``ale_iac.infra`` imports nothing heavy at package level, so
    the long-lived supervisor stays small (the standard library and its own module)."""
    return [sys.executable, "-m", "ale_iac.infra.local_supervisor", str(folder), "--ready-fd", str(ready_fd)]


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


def _argv(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


# Executables the supervisor starts with the state dir in their arguments or as their cwd.
_OWN_EXECUTABLES = frozenset({"unshare", "sh", "bwrap", "slirp4netns"})
SUPERVISOR_MODULE = "ale_iac.infra.local_supervisor"


def _owned_processes(folder: Path, pidns: str | None) -> list[tuple[int, int]]:
    """(pid, start time) of every process that belongs to the sandbox in ``folder``.

    Ours are: the supervisor (its module and the state dir in its argv); the unshare/bwrap and
    slirp4netns it started (the state dir in their argv, or as their working directory); and
    every process in the sandbox's PID namespace. A recycled pid cannot match any of these, and
    neither can a user's shell that happens to look at the state dir.
    """
    marker = re.compile(re.escape(str(folder)) + r"(?=/|,|$)")
    own = os.getpid()
    found = []
    for pid in _all_pids():
        if pid == own:
            continue
        argv = _argv(pid)
        if not argv:
            continue
        exe = os.path.basename(argv[0])
        mentions = any(marker.search(arg) for arg in argv)
        belongs = (
            (any(SUPERVISOR_MODULE in arg for arg in argv) and mentions)
            or (exe in _OWN_EXECUTABLES and (mentions or _readlink(f"/proc/{pid}/cwd") == str(folder)))
            or (pidns is not None and pid_namespace(pid) == pidns)
        )
        if belongs:
            start_time = proc_start_time(pid)
            if start_time is not None:
                found.append((pid, start_time))
    return found


def _kill_session(state: LocalSandboxState, owned: list[tuple[int, int]]) -> None:
    """SIGKILL the supervisor's process group (it leads its own session), if it is provably ours.

    That is so while the supervisor itself runs, or while one of our processes is still in the
    group: a pid in use as a process group id is never handed out again, so the group cannot be
    someone else's. This also reaches helpers that carry no marker of the sandbox.
    """
    group = state.supervisor_pid
    if group <= 0:
        return
    if is_alive(state) or any(_proc_pgid(pid) == group for pid, _ in owned):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)


def _kill(pid: int, start_time: int | None, sig: int) -> None:
    if start_time is not None and proc_start_time(pid) != start_time:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


CGROUP_EMPTY_TIMEOUT_S = 10.0


def _remove_cgroup(path: str | None, sandbox_id: str, search: bool) -> None:
    """Remove the sandbox's memory cgroup once its last process is gone.

    After a supervisor crash its children are reaped by the host's init, and cgroup v1 keeps a
    zombie in the cgroup until then (rmdir fails with EBUSY); v1 offers no event to wait on, so
    this re-checks ``cgroup.procs`` until the deadline.
    """
    candidates = [Path(path)] if path else []
    if not candidates and search:
        memory_root = Path("/sys/fs/cgroup/memory")
        if memory_root.is_dir():
            candidates = list(memory_root.rglob(f"ale-iac-{sandbox_id}"))
    deadline = time.monotonic() + CGROUP_EMPTY_TIMEOUT_S
    for cgroup in candidates:
        while cgroup.is_dir():
            try:
                cgroup.rmdir()
            except OSError as exc:
                if time.monotonic() > deadline:
                    members = (cgroup / "cgroup.procs").read_text().split()
                    raise SandboxError(
                        f"sandbox {sandbox_id}: cannot remove {cgroup} ({exc}); processes still in it: {members}"
                    ) from None
                time.sleep(0.05)


def _asked_for_memory(folder: Path) -> bool:
    try:
        return LocalSandboxSpec.from_json(json.loads((folder / SPEC_FILE).read_text())).memory_gb is not None
    except (OSError, ValueError, TypeError):
        return True


def _mounts_under(folder: Path) -> list[str]:
    """Mount points at or below ``folder`` in our mount namespace, deepest first."""
    prefix = str(folder)
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    points = [line.split()[4].replace("\\040", " ") for line in lines]
    return sorted((p for p in points if p == prefix or p.startswith(prefix + "/")), key=len, reverse=True)


def stop(sandbox_id: str, *, home: Path | None = None, timeout: float = 10.0) -> bool:
    """Stop a sandbox and delete everything it left: processes, port forward, cgroup, files.

    Idempotent: returns False when there was nothing to stop. Works when the supervisor is gone
    (SIGKILLed, or the host rebooted), because every process of the sandbox is found from the
    state dir (see ``_owned_processes``) rather than from the supervisor.
    """
    folder = state_dir_of(sandbox_id, home)
    if not folder.exists():
        return False
    state = _state_from_dir(folder)
    if is_alive(state):
        # The supervisor stops the sandbox gracefully (SIGTERM to its init, then SIGKILL).
        _kill(state.supervisor_pid, state.supervisor_start_time, signal.SIGTERM)
        if not wait_pid_gone(state.supervisor_pid, state.supervisor_start_time, timeout):
            _kill(state.supervisor_pid, state.supervisor_start_time, signal.SIGKILL)
            wait_pid_gone(state.supervisor_pid, state.supervisor_start_time, 5.0)
    # Whatever is left (a supervisor that was SIGKILLed cannot clean up), killed outright.
    for _ in range(3):
        left = _owned_processes(folder, state.pid_namespace)
        if not left:
            break
        _kill_session(state, left)
        for pid, start_time in left:
            _kill(pid, start_time, signal.SIGKILL)
        for pid, start_time in left:
            wait_pid_gone(pid, start_time, 5.0)
    else:
        left = _owned_processes(folder, state.pid_namespace)
        if left:
            raise SandboxError(f"sandbox {sandbox_id}: processes {[p for p, _ in left]} do not die")
    # No cgroup in the state but a memory hint in the spec: the supervisor may have died between
    # making the cgroup and recording it, so look for it by name.
    _remove_cgroup(state.cgroup, sandbox_id, search=state.cgroup is None and _asked_for_memory(folder))
    # The overlay was mounted in a private mount namespace that died with the sandbox; a mount
    # visible here would mean someone mounted into the state dir by hand. Never delete through it.
    for point in _mounts_under(folder):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)
    left_mounts = _mounts_under(folder)
    if left_mounts:
        raise SandboxError(f"sandbox {sandbox_id}: cannot unmount {', '.join(left_mounts)}")
    _remove_tree(folder)
    return True


def _remove_tree(folder: Path) -> None:
    """``rmtree`` that tolerates a concurrent ``stop`` of the same sandbox (gc racing a destroy)."""

    def ignore_missing(_func: object, _path: str, exc_info: tuple[type[BaseException], BaseException, object]) -> None:
        if not isinstance(exc_info[1], FileNotFoundError):
            raise exc_info[1]

    shutil.rmtree(folder, onerror=ignore_missing)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
