"""The local sandboxes of this host: each one's spec and state, the folder that holds them, its logs and its token.

State lives in ``${ALE_IAC_HOME:-~/.ale-iac}/sandboxes/<id>/`` (``spec.json``, ``state.json``,
``auth-token``, ``disk.img``, ``logs/``), so a garbage collector can find sandboxes a crashed run left.
Standard library only: the supervisor imports it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ale_iac import procs
from ale_iac.errors import AleIacError
from ale_iac.paths import ale_home
from ale_iac.substrates.local import cgroups
from ale_iac.substrates.local.cgroups import LimitRecord

SANDBOX_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,47}$")
DEFAULT_INIT = "/usr/local/sbin/ale-init"
DEFAULT_SERVER_PORT = 8000
DEFAULT_GATEWAY_PORT = 4010
DEFAULT_DISK_GB = 16
DEFAULT_PIDS_LIMIT = 4096
TAP = "tap0"
MTU = 65520

UID_RANGE_START = 2**30
"""Sandbox uid/gid ranges start here: far above any ordinary or subordinate (``/etc/subuid``) id."""
UID_COUNT = 65536
"""Ids 0..65535 inside a sandbox map to ``uid_base .. uid_base + 65535`` on the host."""
UID_SLOTS = 4096

SPEC_FILE = "spec.json"
STATE_FILE = "state.json"
TOKEN_FILE = "auth-token"
SECCOMP_FILE = "seccomp.bpf"
DISK_FILE = "disk.img"
LOGS_DIR = "logs"
SUPERVISOR_LOG = "supervisor.log"
SANDBOX_LOG_NAMES = ("init.log", "xvfb.log", "openbox.log", "server.log")
"""Logs the sandbox writes (in its own file system); their tails are kept in ``logs/`` when it stops."""
MOUNT_ROOT = "/run/ale-iac"
"""Where the supervisor assembles the sandbox's root, in its private mount namespace only."""
LOG_READ_BYTES = 64 * 1024


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
    """CPU time as a number of CPUs (a cgroup CPU quota)."""
    memory_gb: float | None = None
    disk_gb: int = DEFAULT_DISK_GB
    """Size of the sandbox's writable layer and logs (a sparse file: only what is written uses disk)."""
    pids_limit: int = DEFAULT_PIDS_LIMIT
    """Most tasks (processes and threads) alive in the sandbox at once."""
    labels: dict[str, str] = field(default_factory=dict)
    server_port: int = DEFAULT_SERVER_PORT
    """Port of the computer-server inside the sandbox's own network namespace."""
    gateway_port: int = DEFAULT_GATEWAY_PORT
    """Port on the sandbox's loopback where the endpoint's forwarder serves the model channel."""
    init: str = DEFAULT_INIT
    """The image's init (path inside the rootfs)."""
    checkpoint: bool = False
    """Dump the sandbox with CRIU once it is ready, before anyone uses it, and make every reset a restore of
    that dump (``checkpoint.py``; root mode, no outbound network)."""
    template: bool = False
    """With ``checkpoint``: the checkpoint is a template slot's, shared by the ephemeral units of one template one
    after another (``templates.py``), not the sandbox's own; the first unit on a slot boots and makes it."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LocalSandboxSpec:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class LocalSandboxState:
    """A sandbox as recorded in its state dir; JSON-serializable."""

    sandbox_id: str
    supervisor_pid: int
    supervisor_start_time: float
    """Start time of the supervisor (``ale_iac.procs.start_time``), so that a recycled pid is never
    taken for the supervisor."""
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
    init_start_time: float | None = None
    """Start time of that init: while it runs, ``pid_namespace`` is the sandbox's own namespace."""
    pid_namespace: str | None = None
    """``pid:[inode]`` of the sandbox's PID namespace: identifies every process inside it, but only
    while its init runs (see :func:`_live_pid_namespace`)."""
    cgroups: list[str] = field(default_factory=list)
    """The sandbox's cgroups, one per controller (removed by ``stop``)."""
    uid_base: int = 0
    """Host uid (and gid) of root inside the sandbox."""
    mode: str = "root"
    """How it was built: ``root`` or ``rootless`` (:func:`host_mode` of the process that started it)."""
    oom_kills: int = 0
    """Processes its memory limit killed, as counted when the supervisor last saved the state
    (:func:`oom_kills` reads the live count)."""
    exit_code: int | None = None
    gateway_url: str = ""
    """Inside the sandbox, the model channel (empty before it is set up)."""
    gateway_socket: str = ""
    """Only in the state of sandboxes made before the model channel went through the endpoint."""
    restored: bool = False
    """Its processes are a restore of the sandbox's checkpoint (not a boot of the image)."""

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
    return ale_home()


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


def uid_base_of(sandbox_id: str) -> int:
    """The host uid of root in this sandbox: one of ``UID_SLOTS`` ranges, chosen by the id.

    Distinct sandboxes mostly get distinct ranges, so their processes and files are different
    users on the host too; two that share a slot are still apart by every namespace.
    """
    slot = int.from_bytes(hashlib.sha256(sandbox_id.encode()).digest()[:4], "big") % UID_SLOTS
    return UID_RANGE_START + slot * UID_COUNT


# --- state files -------------------------------------------------------------------------------


def load_state(sandbox_id: str, *, home: Path | None = None) -> LocalSandboxState | None:
    """The recorded state of a sandbox, or None when it has no state dir."""
    folder = state_dir_of(sandbox_id, home)
    if not folder.is_dir():
        return None
    return state_from_dir(folder)


def state_from_dir(folder: Path) -> LocalSandboxState:
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
        sandbox_id=folder.name,
        supervisor_pid=0,
        supervisor_start_time=0,
        host_port=0,
        endpoint="",
        state_dir=str(folder),
        rootfs=rootfs,
        labels=labels,
        phase="unknown",
    )


def list_sandboxes(*, home: Path | None = None) -> list[LocalSandboxState]:
    """Every sandbox with a state dir, running or not (a dead one still needs ``stop``)."""
    root = sandboxes_dir(home)
    if not root.is_dir():
        return []
    return [
        state_from_dir(folder)
        for folder in sorted(root.iterdir())
        if folder.is_dir() and SANDBOX_ID_RE.match(folder.name)
    ]


def is_alive(state: LocalSandboxState) -> bool:
    """True while the sandbox's supervisor (the very process that was started) runs."""
    if state.supervisor_pid <= 0:
        return False
    return procs.is_running(state.supervisor_pid, state.supervisor_start_time)


def sandbox_pids(state: LocalSandboxState) -> list[int]:
    """The supervisor and every process under it (slirp4netns, bwrap, everything in the sandbox)."""
    if not is_alive(state):
        return []
    return procs.descendants(state.supervisor_pid)


def oom_kills(state: LocalSandboxState) -> int:
    """How many processes the sandbox's memory limit has killed so far (0 without a memory cgroup)."""
    live = cgroups.memory_oom_kills([Path(p) for p in state.cgroups])
    return max(live, state.oom_kills)


# --- logs and the token ----------------------------------------------------------------------


def read_tail(directory: int | str | Path, name: str, max_bytes: int = LOG_READ_BYTES) -> bytes | None:
    """The last ``max_bytes`` of a file the sandbox wrote, or None if it is not a regular file.

    Never follows a symlink (the sandbox may plant one) and never blocks on a FIFO: the file is
    opened ``O_NOFOLLOW | O_NONBLOCK`` relative to ``directory`` (a path or an open directory fd)
    and checked with ``fstat`` before anything is read.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        if isinstance(directory, int):
            fd = os.open(name, flags, dir_fd=directory)
        else:
            dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                fd = os.open(name, flags, dir_fd=dir_fd)
            finally:
                os.close(dir_fd)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        offset = max(0, info.st_size - max_bytes)
        return os.pread(fd, max_bytes, offset)
    except OSError:
        return None
    finally:
        os.close(fd)


def copy_tail(directory: int, name: str, target: Path, max_bytes: int) -> None:
    """Keep the tail of a sandbox-written log in a host file (``read_tail`` rules; no-op if absent)."""
    data = read_tail(directory, name, max_bytes)
    if data is None:
        return
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def live_logs_dir(state: LocalSandboxState) -> str:
    """Where a running sandbox's logs are, seen through its supervisor's mount namespace."""
    return f"/proc/{state.supervisor_pid}/root{MOUNT_ROOT}/layer/logs"


def log_text(state: LocalSandboxState, name: str, max_bytes: int = LOG_READ_BYTES) -> str:
    """The tail of one of the sandbox's logs: live while it runs, the kept tail after it stopped."""
    data = read_tail(live_logs_dir(state), name, max_bytes) if is_alive(state) else None
    if data is None:
        data = read_tail(Path(state.state_dir) / LOGS_DIR, name, max_bytes)
    return (data or b"").decode(errors="replace")


def log_tails(state: LocalSandboxState, lines: int = 15) -> str:
    """The last lines of every log of a sandbox, for an error message."""
    parts = []
    for name in (SUPERVISOR_LOG, *SANDBOX_LOG_NAMES, "slirp4netns.log"):
        text = log_text(state, name)
        if text.strip():
            parts.append(f"--- {name} ---\n" + "\n".join(text.splitlines()[-lines:]))
    return "\n".join(parts)


def auth_token(state: LocalSandboxState) -> str:
    """The bearer token the sandbox's endpoint requires (readable by its owner only)."""
    return (Path(state.state_dir) / TOKEN_FILE).read_text().strip()


def write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
