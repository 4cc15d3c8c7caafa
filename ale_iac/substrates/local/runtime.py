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
  the same runtime works rootless (:func:`host_mode`; docs/rootless.md): root inside is that user,
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

State lives in ``${ALE_IAC_HOME:-~/.ale-iac}/sandboxes/<id>/`` (``spec.json``, ``state.json``,
``auth-token``, ``disk.img``, ``logs/``), so a garbage collector can find sandboxes a crashed run left.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ale_iac import procs
from ale_iac.errors import AleIacError
from ale_iac.files import write_json_atomic
from ale_iac.hostcheck import Check
from ale_iac.paths import ale_home
from ale_iac.substrates.local import cgroups, linux
from ale_iac.substrates.local.cgroups import LimitRecord

SANDBOX_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,47}$")
DEFAULT_INIT = "/usr/local/sbin/ale-init"
DEFAULT_SERVER_PORT = 8000
DEFAULT_GATEWAY_PORT = 4010
GATEWAY_SOCKET = "gateway.sock"
"""In the state dir: the host end of the sandbox's gateway channel (a run's model gateway serves it)."""
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
    """Port on the sandbox's loopback relayed to ``GATEWAY_SOCKET`` in the state dir on the host."""
    init: str = DEFAULT_INIT
    """The image's init (path inside the rootfs)."""

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
    """Inside the sandbox, what leads to ``gateway_socket`` on the host (empty before it is set up)."""
    gateway_socket: str = ""

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


# --- host checks ---------------------------------------------------------------------------------

MODE_ROOT = "root"
"""ale-iac runs as uid 0: a loop-mounted ext4 layer over an id-mapped image, a uid range no user owns."""
MODE_ROOTLESS = "rootless"
"""ale-iac runs as a normal user: its own uid is root inside, a tmpfs layer over its own copy of the image."""

_COMMON_TOOLS = (
    ("bwrap", "bubblewrap"),
    ("slirp4netns", "slirp4netns"),
    ("setsid", "util-linux"),
)
_ROOT_TOOLS = (
    ("mount", "mount"),
    ("mkfs.ext4", "e2fsprogs"),
)
MIN_KERNEL = (5, 19)
"""Root mode: id-mapped mounts as overlayfs layers."""
MIN_KERNEL_ROOTLESS = (5, 11)
"""Rootless mode: overlayfs mounted in a user namespace (older kernels would need fuse-overlayfs,
which ale-iac does not drive)."""


SUBID_COUNT = UID_COUNT - 1
"""Rootless with subordinate ids: ids 1..65535 inside are the user's /etc/subuid and /etc/subgid range."""


def subordinate_ids() -> tuple[tuple[int, int], tuple[int, int]] | None:
    """The caller's subordinate uid and gid ranges ``(start, count)`` (count capped at 65535), if it has
    ranges of at least that size and ``newuidmap``/``newgidmap`` are installed; else None (rootless
    sandboxes then have uid and gid 0 only inside)."""
    if shutil.which("newuidmap") is None or shutil.which("newgidmap") is None:
        return None
    uid = os.geteuid()
    try:
        import pwd

        names = {str(uid), pwd.getpwuid(uid).pw_name}
    except (KeyError, ImportError):
        names = {str(uid)}
    found: list[tuple[int, int]] = []
    for path in ("/etc/subuid", "/etc/subgid"):
        try:
            lines = Path(path).read_text().splitlines()
        except OSError:
            return None
        ranges = [
            (int(start), min(int(count), SUBID_COUNT))
            for name, start, count in (line.split(":") for line in lines if line.count(":") == 2)
            if name in names and count.isdigit() and start.isdigit() and int(count) >= SUBID_COUNT
        ]
        if not ranges:
            return None
        found.append(ranges[0])
    return found[0], found[1]


def host_mode() -> str:
    """``root`` when ale-iac runs as uid 0, else ``rootless``: one runtime, two ways to build a sandbox."""
    return MODE_ROOT if os.geteuid() == 0 else MODE_ROOTLESS


def kernel_version() -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", os.uname().release)[:2])


def _sysctl(name: str) -> str | None:
    try:
        return Path("/proc/sys", name.replace(".", "/")).read_text().strip()
    except OSError:
        return None


def host_checks() -> list[Check]:
    """Everything a local sandbox needs of this host, in the mode this process would run it
    (:func:`host_mode`), then what this host's cgroups let it limit: what ``ale-iac doctor`` prints
    and ``start`` enforces (the limits are informational: a sandbox records each as applied or not)."""
    mode = host_mode()
    checks = [
        Check("linux", sys.platform.startswith("linux"), sys.platform, "local sandboxes need Linux"),
        Check(
            "mode",
            True,
            f"{mode} (uid {os.geteuid()})"
            + (
                ": the sandbox's user namespace maps its root to your own uid; its writable layer is a tmpfs"
                if mode == MODE_ROOTLESS
                else ": the sandbox's root is a host uid range no user owns; its writable layer is ext4 on a loop"
            ),
        ),
    ]
    tools = _COMMON_TOOLS + (_ROOT_TOOLS if mode == MODE_ROOT else ())
    for tool, package in tools:
        path = shutil.which(tool)
        checks.append(Check(tool, path is not None, path or "not installed", f"apt-get install -y {package}"))
    try:
        filesystems = Path("/proc/filesystems").read_text()
    except OSError:
        filesystems = ""
    for fs in ("overlay", "ext4") if mode == MODE_ROOT else ("overlay",):
        present = re.search(rf"\b{fs}$", filesystems, re.MULTILINE) is not None
        checks.append(
            Check(f"{fs} file system", present, "in /proc/filesystems" if present else "missing", f"modprobe {fs}")
        )
    release = os.uname().release
    if mode == MODE_ROOT:
        loop = Path("/dev/loop-control").exists()
        checks.append(Check("loop devices", loop, "/dev/loop-control" if loop else "missing", "modprobe loop"))
        checks.append(
            Check(
                "kernel",
                kernel_version() >= MIN_KERNEL,
                release,
                f"Linux {MIN_KERNEL[0]}.{MIN_KERNEL[1]} or newer (id-mapped mounts under overlayfs)",
            )
        )
    else:
        checks.extend(_rootless_checks(release))
    checks.extend(cgroups.host_limits(rootless=mode == MODE_ROOTLESS))
    return checks


def _rootless_checks(release: str) -> list[Check]:
    checks = [
        Check(
            "kernel",
            kernel_version() >= MIN_KERNEL_ROOTLESS,
            release,
            f"Linux {MIN_KERNEL_ROOTLESS[0]}.{MIN_KERNEL_ROOTLESS[1]} or newer (overlayfs in a user namespace; "
            "older kernels would need fuse-overlayfs, which ale-iac does not drive), or run as root",
        )
    ]
    max_userns = _sysctl("user.max_user_namespaces")
    checks.append(
        Check(
            "user namespaces",
            max_userns is not None and max_userns != "0",
            f"user.max_user_namespaces={max_userns}",
            "sysctl -w user.max_user_namespaces=15000",
        )
    )
    clone = _sysctl("kernel.unprivileged_userns_clone")  # Debian's patch (Debian 10 and older kernels)
    if clone is not None:
        checks.append(
            Check(
                "unprivileged user namespaces",
                clone == "1",
                f"kernel.unprivileged_userns_clone={clone}",
                "sysctl -w kernel.unprivileged_userns_clone=1",
            )
        )
    apparmor = _sysctl("kernel.apparmor_restrict_unprivileged_userns")  # Ubuntu 23.10 and newer
    if apparmor is not None:
        checks.append(
            Check(
                "AppArmor user namespace restriction",
                apparmor == "0",
                f"kernel.apparmor_restrict_unprivileged_userns={apparmor}",
                "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0, or an AppArmor profile that allows "
                "userns for the venv's python",
            )
        )
    scratch = tempfile.mkdtemp(prefix="ale-iac-probe-")
    try:
        failure = linux.probe_rootless_overlay(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    subids = subordinate_ids()
    checks.append(
        Check(
            "subordinate ids",
            subids is not None,
            f"uids {subids[0][0]}.., gids {subids[1][0]}.. (newuidmap): ids 0..{SUBID_COUNT} inside"
            if subids
            else "none: only uid and gid 0 exist inside (programs that chown to another id fail, e.g. xterm's pty)",
            "apt-get install -y uidmap, and a range of 65536 ids for your user in /etc/subuid and /etc/subgid "
            "(usermod --add-subuids/--add-subgids)",
            required=False,
        )
    )
    checks.append(
        Check(
            "overlay in a user namespace",
            failure is None,
            "a user namespace of your own, a tmpfs and overlayfs in it: works" if failure is None else failure,
            "allow unprivileged user namespaces (see the checks above), or run as root",
        )
    )
    return checks


@functools.cache
def check_host() -> None:
    """Raise a SandboxError naming every missing requirement of local sandboxes on this host."""
    failed = [check for check in host_checks() if check.required and not check.ok]
    if failed:
        needs = "; ".join(f"{check.name}: {check.detail} ({check.fix})" for check in failed)
        raise SandboxError(f"local sandboxes cannot run on this host: {needs}")


# --- state files -------------------------------------------------------------------------------


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
        _state_from_dir(folder)
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


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


# --- start -------------------------------------------------------------------------------------


def start(spec: LocalSandboxSpec, *, home: Path | None = None, timeout: float = 30.0) -> LocalSandboxState:
    """Start a sandbox and return once its processes run and its endpoint listens.

    The supervisor is started through ``setsid -f`` so it is not our child: the caller (a
    short-lived Pulumi provider process) can exit without taking it along or leaving a zombie.
    On any failure everything started so far is stopped and the state dir removed.
    """
    from ale_iac.substrates.seccomp import compile_bpf

    check_host()
    check_sandbox_id(spec.sandbox_id)
    rootfs = Path(spec.rootfs)
    if not rootfs.is_dir():
        raise SandboxError(f"rootfs {rootfs} does not exist; build the image first (ale-iac images build)")
    if not (rootfs / spec.init.lstrip("/")).is_file():
        raise SandboxError(f"rootfs {rootfs} has no init {spec.init}; is it an ale-iac image?")
    check_rootfs_owner(rootfs)
    folder = state_dir_of(spec.sandbox_id, home)
    folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        raise SandboxError(f"sandbox {spec.sandbox_id} already exists ({folder})") from None
    try:
        os.chmod(folder, 0o700)  # whatever the umask
        (folder / LOGS_DIR).mkdir(mode=0o700)
        write_json_atomic(folder / SPEC_FILE, spec.to_json())
        _write_private(folder / TOKEN_FILE, secrets.token_urlsafe(32).encode())
        _write_private(folder / SECCOMP_FILE, compile_bpf())
    except BaseException:
        _remove_tree(folder)
        raise

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
    if not message.get("ok"):
        error = message.get("error", "the supervisor exited before the sandbox was ready")
        tails = log_tails(_state_from_dir(folder))
        stop(spec.sandbox_id, home=home)
        raise SandboxError(f"sandbox {spec.sandbox_id} failed to start: {error}\n{tails}".rstrip())
    return LocalSandboxState.from_json(message["state"])


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
    _remove_tree(folder)
    return True


def reset(sandbox_id: str, *, home: Path | None = None, timeout: float = 30.0) -> LocalSandboxState:
    """Replace a sandbox by a fresh one of the same spec under the same id (a pool unit between leases).

    Nothing of the old one survives: ``stop`` deletes its processes, disk and state dir, and ``start``
    makes all of them anew, with a new endpoint port and a new token (read them from the returned
    state). The id, and so the state dir and the Pulumi resource that owns it, stay the same.
    """
    folder = state_dir_of(sandbox_id, home)
    try:
        spec = LocalSandboxSpec.from_json(json.loads((folder / SPEC_FILE).read_text()))
    except FileNotFoundError:
        raise SandboxError(f"sandbox {sandbox_id} does not exist ({folder}): nothing to reset") from None
    stop(sandbox_id, home=home)
    return start(spec, home=home, timeout=timeout)


def _remove_tree(folder: Path) -> None:
    """``rmtree`` that tolerates a concurrent ``stop`` of the same sandbox (gc racing a destroy)."""

    def ignore_missing(_func: object, _path: str, exc_info: tuple[type[BaseException], BaseException, object]) -> None:
        if not isinstance(exc_info[1], FileNotFoundError):
            raise exc_info[1]

    shutil.rmtree(folder, onerror=ignore_missing)
