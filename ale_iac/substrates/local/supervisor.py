"""The supervisor of one local sandbox: ``python -m ale_iac.substrates.local.supervisor STATE_DIR``.

Started (detached, in its own session) by ``runtime.start``. It lives as long as the sandbox, so it
imports only the standard library, psutil and small modules of ours (keep it that way: every
import here is memory per sandbox). It owns the sandbox's processes for their whole life:

1. makes the sandbox's cgroups (memory, pids, CPU quota) and records what it applied;
2. makes the sandbox's user namespace: uid/gid 0..65535 inside are an unprivileged host range
   (``uid_base``), so root inside is nobody outside, also when ale-iac runs as root. Rootless (run
   by a normal user, docs/rootless.md): uid 0 inside is that user (ids 1..65535 its /etc/subuid
   range, through newuidmap, when it has one), and the supervisor moves into the namespace for good;
3. moves itself into a private mount namespace and builds the sandbox's root there, where no host
   process sees it: a size-limited ext4 file system on a loop device (``disk.img``: the writable
   layer and the logs, ``nosuid,nodev``), the image rootfs bound read-only through an id mapping
   into the user namespace, and an overlay of the two. Rootless: a size-limited tmpfs, and the
   user's own copy of the image bound read-only;
4. starts bubblewrap inside the user namespace (as its root) with new pid, net, ipc, uts and
   cgroup namespaces, the seccomp filter of ``substrates.seccomp``, a cut capability set and
   bounding set, paused (``--block-fd``) once the namespaces exist;
5. gives the network namespace outbound access through slirp4netns only when the spec allows it;
   otherwise it has nothing but ``lo``;
6. serves the endpoint: 127.0.0.1:<host_port> on the host, an authenticating forwarder
   (``substrates.authproxy``) whose upstream connections are made inside the sandbox's network
   namespace, to the computer-server on its loopback; the same forwarder serves the model channel
   on the sandbox's 127.0.0.1:<gateway_port>, carried back over connections a run opens to the
   endpoint (``substrates.channel``; the same mechanism as in a container or a guest);
7. lets bwrap go on to exec the image's init, writes ``state.json`` and reports to ``start()``. A checkpointed
   sandbox (``spec.checkpoint``, docs/checkpoint.md) is dumped with CRIU once its computer-server listens and
   restored at once, and given its endpoint then; a reset's new supervisor finds the checkpoint in the state dir
   and restores it onto the new layer instead of starting bwrap. An ephemeral checkpointed unit (``spec.template``)
   leases a template slot (``templates.py``) for its life and restores the slot's checkpoint the same way, or
   makes it if the slot has none;
8. waits. SIGTERM stops the sandbox (SIGTERM to its init, SIGKILL after a grace period); when
   the sandbox or slirp4netns dies, the other one is stopped too. On the way out the tails of
   the sandbox's logs are copied into ``logs/`` of the state dir (read without following links
   or blocking on FIFOs), so a sandbox that died can still be diagnosed after its file system
   is gone.

Everything it starts gets SIGKILL when it dies (PR_SET_PDEATHSIG; slirp4netns also watches an
exit fd), so a SIGKILLed supervisor takes its sandbox along; its mount namespace, and with it the
loop device, goes when the last process in it exits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import resource
import select
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from ale_iac import procs
from ale_iac.clock import utc_now
from ale_iac.files import write_json_atomic
from ale_iac.substrates.authproxy import EGRESS_PORT, AuthProxy, tcp_connector
from ale_iac.substrates.local import cgroups, checkpoint, linux, templates
from ale_iac.substrates.local.host import MODE_ROOTLESS, host_mode, subordinate_ids
from ale_iac.substrates.local.sandboxes import (
    DISK_FILE,
    LOGS_DIR,
    MOUNT_ROOT,
    MTU,
    SANDBOX_LOG_NAMES,
    SECCOMP_FILE,
    SPEC_FILE,
    STATE_FILE,
    TAP,
    TOKEN_FILE,
    UID_COUNT,
    LocalSandboxSpec,
    LocalSandboxState,
    copy_tail,
    uid_base_of,
)
from ale_iac.substrates.relay import loopback_listener

SLIRP_SOCKET = "slirp.sock"  # relative to the state dir (our cwd): keeps the path short
SETUP_TIMEOUT_S = 20.0
STOP_GRACE_S = 3.0
LOG_TAIL_BYTES = 256 * 1024
# What root inside the sandbox keeps (in its own user namespace): Docker's default set without
# CAP_NET_RAW, CAP_MKNOD, CAP_AUDIT_WRITE, CAP_SETFCAP, CAP_FSETID and CAP_SETPCAP. No
# CAP_NET_ADMIN: the sandbox cannot give itself a route it was not given. The bounding set is cut
# to the same list, so no file capability or setuid program brings any other back.
SANDBOX_CAPS = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
)
SETPRIV = "/usr/bin/setpriv"
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LAYER = f"{MOUNT_ROOT}/layer"
LOWER = f"{MOUNT_ROOT}/lower"
ROOT = f"{MOUNT_ROOT}/root"
RESTORE_ROOT = f"{MOUNT_ROOT}/restore-root"
"""Where CRIU's process sees the sandbox's root: a plain bind of ``ROOT`` in a mount namespace of its own (a
recursive one, or ``ROOT`` itself, holds mounts locked in the user namespace, which CRIU cannot mount over)."""
CHECKPOINT_TIMEOUT_S = 60.0
LAYER_TAR_OPTIONS = ("--numeric-owner", "--xattrs", "--xattrs-include=*", "--sparse")
SANDBOX_LOG_DIR = "/var/log/ale"


class SetupError(Exception):
    pass


class StopRequestedError(Exception):
    pass


def log(message: str) -> None:
    print(f"[supervisor {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _run(argv: list[str]) -> None:
    result = subprocess.run(argv, capture_output=True, check=False)
    if result.returncode != 0:
        output = (result.stderr or result.stdout).decode(errors="replace").strip()
        raise SetupError(f"{' '.join(argv)} failed ({result.returncode}): {output}")


class AdoptedChild:
    """The init CRIU restored as our child (``--restore-sibling``): the parts of ``Popen`` the supervisor uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._pidfd = os.pidfd_open(pid)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            ready, _, _ = select.select([self._pidfd], [], [], timeout)
            if not ready:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


def _open_init_log() -> int:
    """The init's output file on the layer, for writing, as the dump recorded it: a regular file, never followed
    through a link (the layer came from an archive of the sandbox's own files), yet without O_NOFOLLOW in its
    flags, which CRIU's reopening through /proc/self/fd would refuse: found with O_PATH | O_NOFOLLOW, then
    reopened through that descriptor."""
    found = os.open(f"{LAYER}/logs/init.log", os.O_PATH | os.O_NOFOLLOW)
    try:
        info = os.fstat(found)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            raise SetupError("the checkpoint's init.log is not a plain file; the checkpoint is not usable")
        return os.open(f"/proc/self/fd/{found}", os.O_WRONLY | os.O_APPEND)
    finally:
        os.close(found)


def _images_readable(images: Path, readable: bool) -> None:
    """CRIU reads some images as the sandbox's root, once it has taken that identity: readable by all during a
    restore only (the state dir, 0700, keeps them from every other user meanwhile), private at rest."""
    images.chmod(0o711 if readable else 0o700)
    for image in images.iterdir():
        if image.is_file() and not image.is_symlink():
            image.chmod(0o644 if readable else 0o600)


def _criu_error(log_file: Path) -> str:
    """CRIU's error lines from its log (what its exit status alone does not say)."""
    try:
        lines = log_file.read_text(errors="replace").splitlines()
    except OSError:
        return f"no log at {log_file}"
    errors = [line.strip() for line in lines if "Error" in line and "RLIMIT_NOFILE" not in line]
    return "; ".join(errors[-5:] or [line.strip() for line in lines[-3:]]) + f" (all of it: {log_file})"


class Supervisor:
    def __init__(self, folder: Path, ready_fd: int | None) -> None:
        self.folder = folder
        self.ready_fd = ready_fd
        self.spec = LocalSandboxSpec.from_json(json.loads((folder / SPEC_FILE).read_text()))
        self.token = (folder / TOKEN_FILE).read_text().strip()
        self.logs = folder / LOGS_DIR
        self.pid = os.getpid()
        start_time = procs.start_time(self.pid)
        assert start_time is not None
        self.start_time = start_time
        self.created_at = utc_now("seconds")
        self.cgroups = cgroups.SandboxCgroups(self.spec.sandbox_id, str(folder))
        self.mode = host_mode()
        self.rootless = self.mode == MODE_ROOTLESS
        # Host uid of root inside; and the uid the supervisor gives the sandbox's root files, as it
        # sees it: rootless, the supervisor itself lives in the sandbox's user namespace (as its root).
        self.uid_base = os.getuid() if self.rootless else uid_base_of(self.spec.sandbox_id)
        self.owner = 0 if self.rootless else self.uid_base
        self.nproc: int | None = None
        """RLIMIT_NPROC for the sandbox, where no pids cgroup bounds its tasks."""
        self.oom_kills = 0
        self.userns_fd = -1
        self.sandbox: subprocess.Popen[bytes] | AdoptedChild | None = None
        self.restored = False
        self.slot: templates.Slot | None = None
        """The template slot an ephemeral checkpointed unit holds for its whole life (``templates.py``)."""
        self.saved: Path | None = None
        """Where the unit's checkpoint is, or is to be made (None: not checkpointed)."""
        self.listener: socket.socket | None = None
        self.slirp: subprocess.Popen[bytes] | None = None
        self.slirp_exit_w: int | None = None
        self.init_pid: int | None = None
        self.init_start_time: float | None = None
        self.pidns: str | None = None
        self.host_port = 0
        self.phase = "starting"
        self.exit_code: int | None = None
        self.layer_mounted = False
        self.gateway_url = ""
        self.stop_requested = False
        """SIGTERM (or SIGINT) came: the supervisor stops at its next safe point (``on_sigterm``)."""
        self.interruptible = False
        """Whether the main thread is where a stop may be raised at once (it holds no lock there)."""

    # --- state ---------------------------------------------------------------------------------

    def state(self) -> LocalSandboxState:
        return LocalSandboxState(
            sandbox_id=self.spec.sandbox_id,
            supervisor_pid=self.pid,
            supervisor_start_time=self.start_time,
            host_port=self.host_port,
            endpoint=f"http://127.0.0.1:{self.host_port}" if self.host_port else "",
            state_dir=str(self.folder),
            rootfs=self.spec.rootfs,
            labels=dict(self.spec.labels),
            limits=list(self.cgroups.records),
            allow_outbound=self.spec.allow_outbound,
            phase=self.phase,
            created_at=self.created_at,
            init_pid=self.init_pid,
            init_start_time=self.init_start_time,
            pid_namespace=self.pidns,
            cgroups=[str(p) for p in self.cgroups.paths],
            uid_base=self.uid_base,
            mode=self.mode,
            oom_kills=self.oom_kills,
            gateway_url=self.gateway_url,
            exit_code=self.exit_code,
            restored=self.restored,
        )

    def save(self) -> None:
        write_json_atomic(self.folder / STATE_FILE, self.state().to_json())

    def report(self, message: dict[str, Any]) -> None:
        if self.ready_fd is None:
            return
        try:
            os.write(self.ready_fd, (json.dumps(message) + "\n").encode())
        except OSError:
            pass  # start() gave up waiting; the state file still says what happened
        finally:
            os.close(self.ready_fd)
            self.ready_fd = None

    # --- limits --------------------------------------------------------------------------------

    def apply_limits(self) -> None:
        spec = self.spec
        limits = cgroups.Limits(
            memory_gb=spec.memory_gb,
            pids_max=spec.pids_limit,
            cpus=spec.vcpus,
        )
        self.cgroups.apply(limits, host_cpus=len(os.sched_getaffinity(0)))
        fallback = cgroups.nproc_fallback(self.cgroups.record("pids_limit"), spec.pids_limit)
        if fallback is not None:
            self.cgroups.records = [r for r in self.cgroups.records if r.name != "pids_limit"] + [fallback]
            self.nproc = spec.pids_limit
        disk = (
            f"{spec.disk_gb} GiB tmpfs in the sandbox's user namespace for the writable layer and logs (rootless: "
            "no loop device; it is memory, and counts against the memory limit where one applies)"
            if self.rootless
            else f"{spec.disk_gb} GiB ext4 file system for the writable layer and logs"
        )
        self.cgroups.records.append(cgroups.LimitRecord("disk_gb", str(spec.disk_gb), True, disk))
        for record in self.cgroups.records:
            outcome = "applied" if record.applied else "NOT applied"
            log(f"limit {record.name}={record.requested}: {outcome}: {record.detail}")

    # --- the root file system ------------------------------------------------------------------

    def build_root(self, layer_copy: Path | None = None, *, anew: bool = False) -> None:
        """In a mount namespace of our own: the writable layer (root: a loop-mounted ext4; rootless: a
        tmpfs), the image (root: id-mapped; rootless: the caller's own copy, bound read-only), the overlay.
        With ``layer_copy`` (a checkpoint's), the layer and logs start as they were at the dump; with ``anew``,
        what an earlier call built (a restore's that failed) is detached and its disk deleted first."""
        if anew:
            linux.umount(MOUNT_ROOT, linux.MNT_DETACH)
            (self.folder / DISK_FILE).unlink()
            self.layer_mounted = False
        rootfs = Path(self.spec.rootfs).resolve()
        if self.rootless:
            # Owned by our user namespace; /run/ale-iac cannot be made on the host without root, so a
            # tmpfs over /run, seen by this mount namespace only, holds it.
            linux.private_mount_namespace()
            linux.mount("tmpfs", "/run", "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, "size=64k,mode=0755")
            os.mkdir(MOUNT_ROOT, 0o755)
        else:
            Path(MOUNT_ROOT).mkdir(mode=0o755, parents=True, exist_ok=True)
            linux.private_mount_namespace()
        linux.mount("tmpfs", MOUNT_ROOT, "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, "size=64k,mode=0755")
        for path in (LAYER, LOWER, ROOT):
            os.mkdir(path)
        if self.rootless:
            size = f"size={self.spec.disk_gb}g,mode=0755"
            linux.mount("tmpfs", LAYER, "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, size)
        else:
            self._mount_disk()
        self.layer_mounted = True
        lower_root = os.stat(rootfs)
        for name, mode, uid in (
            ("upper", lower_root.st_mode & 0o7777, self.owner),
            ("work", 0o700, 0),
            ("logs", 0o755, self.owner),
        ):
            path = f"{LAYER}/{name}"
            os.mkdir(path, mode)
            os.chmod(path, mode)
            os.chown(path, uid, uid)
        if layer_copy is not None:
            # Owners, modes, links, the overlay's whiteouts and xattrs; onto the new disk, seen in this mount
            # namespace only (the archive itself is one regular file of root's on the host).
            _run(["tar", "-C", LAYER, "-xpf", str(layer_copy), *LAYER_TAR_OPTIONS])
        if self.rootless:
            linux.mount(str(rootfs), LOWER, None, linux.MS_BIND | linux.MS_REC)
            readonly = linux.MS_BIND | linux.MS_REMOUNT | linux.MS_RDONLY | linux.MS_NOSUID | linux.MS_NODEV
            linux.mount("none", LOWER, None, readonly)
        else:
            linux.idmapped_bind(str(rootfs), LOWER, self.userns_fd)
        options = f"lowerdir={LOWER},upperdir={LAYER}/upper,workdir={LAYER}/work"
        linux.mount("overlay", ROOT, "overlay", linux.MS_NOSUID | linux.MS_NODEV, options)
        if self.spec.allow_outbound:
            self._write_in_root("etc/resolv.conf", "nameserver 10.0.2.3\n")
        logs_target = f"{ROOT}{SANDBOX_LOG_DIR}"
        if not os.path.isdir(logs_target):
            raise SetupError(f"the image has no {SANDBOX_LOG_DIR}; is it an ale-iac image?")
        linux.mount(f"{LAYER}/logs", logs_target, None, linux.MS_BIND)
        flags = linux.MS_BIND | linux.MS_REMOUNT | linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
        linux.mount("none", logs_target, None, flags)

    def _mount_disk(self) -> None:
        """Root mode: the writable layer and logs, an ext4 file system of ``disk_gb`` on a loop device."""
        disk = self.folder / DISK_FILE
        fd = os.open(disk, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.truncate(self.spec.disk_gb * 2**30)
        owner = f"{self.uid_base}:{self.uid_base}"
        _run(
            [
                "mkfs.ext4",
                "-q",
                "-F",
                "-m",
                "0",
                "-O",
                "^has_journal",
                "-E",
                f"lazy_itable_init=1,root_owner={owner}",
                str(disk),
            ]
        )
        _run(["mount", "-o", "loop,nosuid,nodev", str(disk), LAYER])

    def _write_in_root(self, relpath: str, text: str) -> None:
        """Write a file into the sandbox's root, owned by its root user."""
        path = f"{ROOT}/{relpath}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a symlink in the image is replaced, never followed
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chown(path, self.owner, self.owner, follow_symlinks=False)

    # --- start ---------------------------------------------------------------------------------

    def bwrap_argv(self, info_w: int, block_r: int, seccomp_fd: int) -> list[str]:
        spec = self.spec
        # fmt: off
        argv = [
            "bwrap",
            "--bind", ROOT, "/",
            "--dev", "/dev",
            "--tmpfs", "/dev/shm",
            "--proc", "/proc",
            "--ro-bind", "/proc/sys", "/proc/sys",
            "--tmpfs", "/tmp",
            "--tmpfs", "/run",
            "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--hostname", spec.sandbox_id,
            "--die-with-parent", "--new-session", "--as-pid-1",
            "--info-fd", str(info_w), "--block-fd", str(block_r),
            "--seccomp", str(seccomp_fd),
            "--clearenv",
            "--setenv", "PATH", SANDBOX_PATH,
            "--setenv", "HOME", "/root",
            "--setenv", "LANG", "C.UTF-8",
            "--chdir", "/root",
            "--cap-drop", "ALL",
        ]
        # CAP_SETPCAP only for setpriv, which cuts the bounding set and is gone by the init's exec.
        for cap in (*SANDBOX_CAPS, "CAP_SETPCAP"):
            argv += ["--cap-add", cap]
        keep = ",".join("+" + cap.removeprefix("CAP_").lower() for cap in SANDBOX_CAPS)
        argv += [
            "--", SETPRIV, f"--bounding-set=-all,{keep}", "--inh-caps=-all", "--ambient-caps=-all", "--",
            spec.init,
            "--port", str(spec.server_port),
            "--width", str(spec.screen_width),
            "--height", str(spec.screen_height),
            "--log-dir", SANDBOX_LOG_DIR,
        ]
        # fmt: on
        return argv

    def _preexec_sandbox(self) -> None:
        """preexec_fn of bwrap: cgroups first (every later process inherits them), then become the
        user namespace's root, so that bwrap makes every other namespace inside it."""
        procs.die_with_parent()
        self.cgroups.join()
        if self.nproc is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (self.nproc, self.nproc))
        if not self.rootless:  # rootless, the supervisor already is the user namespace's root
            linux.become_root_of(self.userns_fd)

    def start_sandbox(self) -> tuple[int, int]:
        """Start bwrap; returns (info read fd, block write fd)."""
        if not os.path.isfile(f"{ROOT}{SETPRIV}"):
            raise SetupError(f"the image has no {SETPRIV} (util-linux); is it an ale-iac image?")
        info_r, info_w = os.pipe()
        block_r, block_w = os.pipe()
        seccomp_fd = os.open(self.folder / SECCOMP_FILE, os.O_RDONLY)
        argv = self.bwrap_argv(info_w, block_r, seccomp_fd)
        log("starting: " + " ".join(argv))
        # The init's own output goes to the size-limited logs, never to a host file it could fill. O_EXCL on
        # the new layer refuses a link as O_NOFOLLOW would; O_NOFOLLOW would stay in the descriptor's flags, and
        # a restore of a checkpoint could not reopen it (CRIU reopens it through /proc/self/fd).
        init_log = os.open(f"{LAYER}/logs/init.log", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        try:
            self.sandbox = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=init_log,
                stderr=subprocess.STDOUT,
                # Not the user namespace's fd: the preexec joins it before the child closes what it does
                # not pass, so it never reaches bwrap, and so never the sandbox's init.
                pass_fds=(info_w, block_r, seccomp_fd),
                preexec_fn=self._preexec_sandbox,  # noqa: PLW1509
                cwd=self.folder,
            )
        finally:
            for fd in (info_w, block_r, seccomp_fd, init_log):
                os.close(fd)
        return info_r, block_w

    def read_info(self, info_r: int) -> None:
        """bwrap's --info-fd JSON: the host pid of the sandbox's PID 1 (our init after exec)."""
        deadline = time.monotonic() + SETUP_TIMEOUT_S
        data = b""
        while True:
            try:
                info = json.loads(data)
                break
            except ValueError:
                pass
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SetupError(f"bwrap did not report its sandbox pid within {SETUP_TIMEOUT_S:.0f} s")
            ready, _, _ = select.select([info_r], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(info_r, 4096)
            if not chunk:
                raise SetupError("the sandbox exited during setup (bwrap failed; see init.log)")
            data += chunk
        os.close(info_r)
        self.init_pid = int(info["child-pid"])
        self.init_start_time = procs.start_time(self.init_pid)
        self.pidns = procs.namespace(self.init_pid)

    def start_slirp(self) -> None:
        """Outbound network for a sandbox whose spec allows it: slirp4netns with its own DNS."""
        assert self.init_pid is not None
        exit_r, exit_w = os.pipe()
        ready_r, ready_w = os.pipe()
        argv = [
            "slirp4netns",
            "--configure",
            f"--mtu={MTU}",
            "--disable-host-loopback",
            f"--api-socket={SLIRP_SOCKET}",
            f"--exit-fd={exit_r}",
            f"--ready-fd={ready_w}",
            str(self.init_pid),
            TAP,
        ]
        log("starting: " + " ".join(argv))
        with open(self.logs / "slirp4netns.log", "ab") as logf:
            self.slirp = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                pass_fds=(exit_r, ready_w),
                preexec_fn=procs.die_with_parent,  # noqa: PLW1509
                cwd=self.folder,
            )
        os.close(exit_r)
        os.close(ready_w)
        self.slirp_exit_w = exit_w  # held open for our whole life: slirp4netns exits on its EOF
        ready, _, _ = select.select([ready_r], [], [], SETUP_TIMEOUT_S)
        data = os.read(ready_r, 16) if ready else b""
        os.close(ready_r)
        if not data:
            raise SetupError("slirp4netns did not become ready (see slirp4netns.log)")

    def _in_sandbox_namespace(
        self, kind: str, nstype: int, name: str, prepare: Callable[[], Coroutine[Any, Any, None] | None]
    ) -> None:
        """Run ``prepare()`` in a thread of ours that has joined the sandbox's ``kind`` namespace (``net``: sockets
        it makes are inside; ``uts``: the hostname it sets is the sandbox's), then the coroutine it returns, if
        any, for the sandbox's life. Returns once ``prepare`` has run; raises SetupError if it failed. If the
        coroutine fails, the sandbox is stopped: both servers are part of what the sandbox is."""
        assert self.init_pid is not None
        namespace = os.open(f"/proc/{self.init_pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)
        joined = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            try:
                linux.setns(namespace, nstype)  # this thread only
                coroutine = prepare()
            except BaseException as exc:
                failure.append(exc)
                return
            finally:
                os.close(namespace)
                joined.set()
            if coroutine is None:
                return
            try:
                asyncio.run(coroutine)
            except BaseException:
                log(f"the {name} failed:\n" + traceback.format_exc())
                os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=serve, name=name, daemon=True).start()
        joined.wait()
        if failure:
            raise SetupError(f"{name}: cannot run in the sandbox's {kind} namespace: {failure[0]}")

    def start_endpoint(self) -> None:
        """127.0.0.1:<port> on the host, forwarded (with authentication) into the sandbox's loopback; and
        the model channel on the sandbox's 127.0.0.1:<gateway port>, served by the same forwarder."""
        if self.listener is None:
            self.bind_endpoint()
        listener = self.listener
        assert listener is not None
        proxy = AuthProxy(self.token, tcp_connector("127.0.0.1", self.spec.server_port))

        def prepare() -> Coroutine[Any, Any, None]:
            model = loopback_listener(self.spec.gateway_port)  # made inside: this thread has joined
            return proxy.serve(listener, model, loopback_listener(EGRESS_PORT))

        self._in_sandbox_namespace("net", linux.CLONE_NEWNET, "endpoint", prepare)
        log(f"endpoint 127.0.0.1:{self.host_port} -> sandbox 127.0.0.1:{self.spec.server_port} (token required)")
        log(f"model channel: sandbox {self.gateway_url}, carried back over the endpoint")
        log(f"egress channel: sandbox http://127.0.0.1:{EGRESS_PORT}, carried back over the endpoint")

    def bind_endpoint(self) -> None:
        """The endpoint's host socket, listening: a connection made before the forwarder serves waits in its
        backlog (a unit from a template reports its endpoint before its restore is done)."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        listener.setblocking(False)
        self.listener = listener
        self.host_port = int(listener.getsockname()[1])
        self.gateway_url = f"http://127.0.0.1:{self.spec.gateway_port}"

    def setup(self) -> None:
        self.save()
        self.apply_limits()
        self.save()
        self.saved = self.checkpoint_folder()
        if self.slot is not None:
            # Reported now: start() returns (and the engine finishes its update) while the restore runs; a
            # connection to the endpoint waits in its backlog until the restored sandbox is served.
            self.bind_endpoint()
            self.save()
            self.report({"ok": True, "state": self.state().to_json()})
        if self.rootless:
            self.userns_fd = linux.own_user_namespace(os.getuid(), os.getgid(), subordinate_ids())
            linux.enter_user_namespace(self.userns_fd)  # single-threaded still: no server thread runs yet
        else:
            self.userns_fd = linux.user_namespace(self.uid_base, UID_COUNT)
        saved = self.saved
        self.check_stop()
        if saved is not None and (saved / checkpoint.META_FILE).is_file():
            self.build_root(saved / checkpoint.LAYER_COPY)
            self.restore_made(saved)
        else:
            self.build_root()
            self.boot()
        if saved is not None and not self.restored:
            self.make_checkpoint(saved)
            self.restore(saved)
        if self.restored:
            if self.slot is not None:
                self.set_hostname()
            self.start_endpoint()
        self.phase = "running"
        self.save()

    def checkpoint_folder(self) -> Path | None:
        """Where the unit's checkpoint is, or is to be made: in its own state dir (a pool unit), in the
        template slot it leases (an ephemeral unit; with every slot taken it boots, unchecked), or nowhere."""
        if not self.spec.checkpoint:
            return None
        if not self.spec.template:
            return self.folder / checkpoint.CHECKPOINT_DIR
        key = self.template_key()
        self.slot = templates.lease(templates.templates_dir(self.folder.parent.parent), key)
        if self.slot is None:
            log(f"template {key}: all {templates.MAX_SLOTS} slots are in use; this unit boots")
            return None
        # A restore brings back the dump's user namespace: root inside is the slot's uid, not one of our id's.
        self.uid_base = self.owner = self.slot.uid_base
        self.save()
        log(f"template {key}: slot {self.slot.folder} (host uid {self.uid_base} is root inside)")
        if not self.slot.has_checkpoint():
            self.slot.drop_checkpoint()  # what a unit killed while it made one left
        return self.slot.checkpoint

    def template_key(self) -> str:
        """What a dump depends on: the spec but the unit's id and labels, the sandbox's command line (its
        hostname aside, set after a restore), its seccomp filter, the image, the kernel and CRIU."""
        spec = {name: value for name, value in self.spec.to_json().items() if name not in ("sandbox_id", "labels")}
        argv = self.bwrap_argv(0, 0, 0)
        argv[argv.index("--hostname") + 1] = ""
        rootfs = Path(self.spec.rootfs).resolve()
        image = rootfs.stat()
        return templates.template_key(
            {
                "spec": spec,
                "sandbox": argv,
                "seccomp": hashlib.sha256((self.folder / SECCOMP_FILE).read_bytes()).hexdigest(),
                "image": [str(rootfs), image.st_ino, image.st_mtime_ns],
                "kernel": os.uname().release,
                "criu": [os.path.realpath(part) for part in checkpoint.criu_command()],  # current/ -> its version
            }
        )

    def boot(self) -> None:
        """Start the image's init under bubblewrap, with the endpoint ready before it runs (a checkpointed
        sandbox gets its endpoint once restored: the dump must hold nothing of ours)."""
        info_r, block_w = self.start_sandbox()
        try:
            self.read_info(info_r)
            self.save()
            if self.spec.allow_outbound:
                self.start_slirp()
            if self.saved is None:
                self.start_endpoint()
            os.write(block_w, b"1")  # bwrap goes on and executes the init
        finally:
            os.close(block_w)

    # --- checkpoint and restore (CRIU) ---------------------------------------------------------

    def wait_until_serving(self, timeout: float) -> None:
        """Until the computer-server listens in the sandbox (its socket in the sandbox's own
        ``/proc/<pid>/net/tcp``: no connection is made, so the dump holds none)."""
        assert self.init_pid is not None and self.sandbox is not None
        listening = f":{self.spec.server_port:04X} 00000000:0000 0A "
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError):
                for table in ("tcp", "tcp6"):
                    if listening in Path(f"/proc/{self.init_pid}/net/{table}").read_text():
                        return
            self.check_stop()
            if self.sandbox.poll() is not None:
                raise SetupError(f"the sandbox exited before its computer-server listened (see {SANDBOX_LOG_DIR})")
            if time.monotonic() > deadline:
                raise SetupError(f"the computer-server did not listen within {timeout:.0f} s; no checkpoint made")
            time.sleep(0.02)  # the kernel has no event for a socket that starts listening

    def make_checkpoint(self, saved: Path) -> None:
        """Dump the booted sandbox once it serves, before anything reaches it, with its layer and logs as
        they were; the dump kills it (a restore of the dump takes its place at once)."""
        assert self.init_pid is not None and self.sandbox is not None
        self.wait_until_serving(CHECKPOINT_TIMEOUT_S)
        images = saved / checkpoint.IMAGES
        images.mkdir(mode=0o700, parents=True)
        external = checkpoint.external_file_key(self.init_pid, 1)
        argv = checkpoint.dump_argv(checkpoint.criu_command(), self.init_pid, images, SANDBOX_LOG_DIR, external)
        log("checkpoint: " + " ".join(argv))
        started = time.monotonic()
        done = subprocess.run(argv, cwd=images, capture_output=True, timeout=CHECKPOINT_TIMEOUT_S, check=False)
        if done.returncode != 0:
            raise SetupError(f"criu dump failed ({done.returncode}): {_criu_error(images / 'dump.log')}")
        self.sandbox.wait(STOP_GRACE_S)  # bwrap, once the init it watched is gone
        _run(["tar", "-C", LAYER, "-cf", str(saved / checkpoint.LAYER_COPY), *LAYER_TAR_OPTIONS, "upper", "logs"])
        meta = {"external_file": external, "made_at": utc_now("seconds"), "rootfs": self.spec.rootfs}
        write_json_atomic(saved / checkpoint.META_FILE, meta)
        log(f"checkpoint made in {time.monotonic() - started:.2f} s")

    def restore(self, saved: Path) -> None:
        """Restore the checkpoint as our child, in this sandbox's cgroups, over the current layer."""
        meta = json.loads((saved / checkpoint.META_FILE).read_text())
        images = saved / checkpoint.IMAGES
        pidfile = saved / checkpoint.PIDFILE
        with contextlib.suppress(FileNotFoundError):
            pidfile.unlink()
        log_fd = _open_init_log()
        os.fchown(log_fd, self.owner, self.owner)  # as the dump recorded it: the sandbox root's
        os.makedirs(RESTORE_ROOT, mode=0o755, exist_ok=True)
        argv = checkpoint.restore_argv(
            checkpoint.criu_command(), images, RESTORE_ROOT, f"{LAYER}/logs", log_fd, meta["external_file"]
        )
        log("restore: " + " ".join(argv))
        started = time.monotonic()
        _images_readable(images, True)
        try:
            done = subprocess.run(
                argv,
                cwd=images,
                capture_output=True,
                pass_fds=(log_fd,),
                preexec_fn=self._preexec_restore,
                timeout=CHECKPOINT_TIMEOUT_S,
                check=False,
            )
        finally:
            os.close(log_fd)
            _images_readable(images, False)
        if done.returncode != 0:
            raise SetupError(f"criu restore failed ({done.returncode}): {_criu_error(images / 'restore.log')}")
        self.init_pid = int(pidfile.read_text().strip())
        self.sandbox = AdoptedChild(self.init_pid)
        self.init_start_time = procs.start_time(self.init_pid)
        self.pidns = procs.namespace(self.init_pid)
        self.restored = True
        self.save()
        log(f"restored the checkpoint in {time.monotonic() - started:.2f} s: init pid {self.init_pid}")

    def restore_made(self, saved: Path) -> None:
        """Restore a checkpoint made before: a pool unit's own (its reset boots afresh if that fails), or a
        template slot's. One of those that does not restore (CRIU or the kernel changed under it, its files
        damaged) is dropped, and the unit boots on a new layer and makes the slot a new one: it costs a boot."""
        if self.slot is None:
            self.restore(saved)
            return
        try:
            self.restore(saved)
        except SetupError as exc:
            log(f"[start] the template did not restore, so the unit boots afresh: {exc}")
            self.slot.drop_checkpoint()
            self.build_root(anew=True)
            self.boot()

    def set_hostname(self) -> None:
        """A restore from a template slot brings back the hostname of the unit that was dumped: this unit's id
        (what bubblewrap gives a booted unit), set in the sandbox's own UTS namespace."""

        def rename() -> None:
            socket.sethostname(self.spec.sandbox_id)

        self._in_sandbox_namespace("uts", linux.CLONE_NEWUTS, "hostname", rename)

    def _preexec_restore(self) -> None:
        """preexec_fn of criu restore: dies with us, in the sandbox's cgroups (the restored tasks inherit
        them: CRIU leaves cgroups alone), and sees the sandbox's root through a plain bind of its own."""
        procs.die_with_parent()
        self.cgroups.join()
        linux.private_mount_namespace()
        linux.mount(ROOT, RESTORE_ROOT, None, linux.MS_BIND)

    # --- run and stop --------------------------------------------------------------------------

    def on_sigterm(self, _signum: int, _frame: object) -> None:
        """Record the stop; raise it only where the main thread may be interrupted (``wait``, and the setup's
        safe points: ``check_stop``). Raised at any bytecode, it once landed in ``logging._releaseLock`` (the
        endpoint's thread had started asyncio), where it was ignored with the logging lock still held: the stop
        was lost, the endpoint's thread hung on the lock, and ``stop()`` had to kill the supervisor 10 s later."""
        self.stop_requested = True
        if self.interruptible:
            raise StopRequestedError

    def check_stop(self) -> None:
        """A safe point: a stop asked for meanwhile ends the setup here."""
        if self.stop_requested:
            raise StopRequestedError

    def stop_children(self) -> None:
        """SIGTERM to the sandbox's init (it forwards to the server), SIGKILL after a grace period."""
        sandbox = self.sandbox
        if sandbox is not None and sandbox.poll() is None:
            if self.init_pid is not None and self.phase == "running":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.init_pid, signal.SIGTERM)
                try:
                    sandbox.wait(STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    log(f"the sandbox did not stop within {STOP_GRACE_S:.0f} s; killing it")
            if sandbox.poll() is None:
                # bwrap's --die-with-parent takes the sandbox's PID 1, and so the whole PID namespace.
                sandbox.kill()
                sandbox.wait()
        slirp = self.slirp
        if slirp is not None and slirp.poll() is None:
            slirp.terminate()
            try:
                slirp.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                slirp.kill()
                slirp.wait()

    def keep_log_tails(self) -> None:
        """Copy the tails of the sandbox's logs out of its file system before that goes."""
        if not self.layer_mounted:
            return
        try:
            source = os.open(f"{LAYER}/logs", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            return
        try:
            for name in SANDBOX_LOG_NAMES:
                copy_tail(source, name, self.logs / name, LOG_TAIL_BYTES)
        finally:
            os.close(source)

    def wait(self) -> None:
        """Until SIGTERM, or until the sandbox or slirp4netns exits."""
        assert self.sandbox is not None
        self.interruptible = True
        self.check_stop()
        while True:
            pid, status = os.waitpid(-1, 0)
            if pid == self.sandbox.pid:
                self.sandbox.returncode = os.waitstatus_to_exitcode(status)
                self.exit_code = self.sandbox.returncode
                log(f"the sandbox exited with {self.exit_code}")
                return
            if self.slirp is not None and pid == self.slirp.pid:
                self.slirp.returncode = os.waitstatus_to_exitcode(status)
                log(f"slirp4netns exited with {self.slirp.returncode}; stopping the sandbox")
                return

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.on_sigterm)
        signal.signal(signal.SIGINT, self.on_sigterm)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        try:
            try:
                self.setup()
            except StopRequestedError:
                raise
            except Exception as exc:
                log("setup failed:\n" + traceback.format_exc())
                self.stop_children()
                self.keep_log_tails()
                self.report({"ok": False, "error": str(exc)})
                self.phase = "exited"
                return 1
            self.check_stop()
            self.report({"ok": True, "state": self.state().to_json()})
            self.wait()
        except StopRequestedError:
            log("stop requested")
            self.report({"ok": False, "error": "stopped during start"})
        finally:
            # No more SIGTERM interruptions while cleaning up.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            self.stop_children()
            self.keep_log_tails()
            self.oom_kills = cgroups.memory_oom_kills(self.cgroups.paths)
            self.phase = "exited"
            with contextlib.suppress(OSError):  # stop() may already be deleting the state dir
                self.save()
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ale_iac.substrates.local.supervisor")
    parser.add_argument("state_dir", type=Path)
    parser.add_argument("--ready-fd", type=int, default=None, help="fd on which to report readiness (one JSON line)")
    args = parser.parse_args(argv)
    folder = args.state_dir.resolve()
    os.chdir(folder)
    os.umask(0o077)  # everything it makes on the host is its owner's alone
    log(f"supervisor pid {os.getpid()} for {folder}")
    return Supervisor(folder, args.ready_fd).run()


if __name__ == "__main__":
    sys.exit(main())
