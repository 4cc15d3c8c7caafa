"""The supervisor of one local sandbox: ``local_supervisor STATE_DIR [--ready-fd FD]``.

Started (detached, in its own session) by ``local_runtime.start`` as ``python -m
ale_iac.infra.local_supervisor``. It lives as long as the sandbox, so it imports only the standard
library and ``local_runtime`` (keep it that way: every import here is memory per sandbox). It owns
the sandbox's processes for their whole life:

1. applies the resource hints it can (CPU affinity, a cgroup-v1 memory limit) and records all;
2. starts ``unshare --mount --propagation private`` -> overlay mount -> ``exec bwrap ...``, with
   bwrap paused (``--block-fd``) right after it made the namespaces;
3. attaches slirp4netns to the sandbox's network namespace, configures tap0 (without a default
   route unless outbound is allowed) and adds the 127.0.0.1 port forward;
4. lets bwrap go on to exec the image's init, writes ``state.json`` and reports to ``start()``;
5. waits. SIGTERM stops the sandbox (SIGTERM to its init, SIGKILL after a grace period); if the
   sandbox or slirp4netns dies on its own, the other one is stopped too. The state dir is left
   for ``stop()``, which deletes it, so the logs of a sandbox that died can still be read.

Everything it starts gets SIGKILL when it dies (PR_SET_PDEATHSIG; slirp4netns also watches an
exit fd), so a SIGKILLed supervisor takes its sandbox along.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from ale_iac.infra.local_runtime import (
    GUEST_ADDR,
    GUEST_CIDR,
    LOGS_DIR,
    MTU,
    SLIRP_DNS,
    SPEC_FILE,
    STATE_FILE,
    TAP,
    LimitRecord,
    LocalSandboxSpec,
    LocalSandboxState,
    now_iso,
    pid_namespace,
    proc_start_time,
    write_json_atomic,
)

PR_SET_PDEATHSIG = 1
SLIRP_SOCKET = "slirp.sock"  # relative to the state dir (our cwd): keeps the path short
SETUP_TIMEOUT_S = 20.0
STOP_GRACE_S = 3.0
# What root inside the sandbox keeps: Docker's default set without CAP_NET_RAW and CAP_MKNOD.
# No CAP_NET_ADMIN: the sandbox cannot add the default route it was not given.
SANDBOX_CAPS = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID",
    "CAP_SETUID", "CAP_SETPCAP", "CAP_SETFCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT",
    "CAP_AUDIT_WRITE",
)
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Runs in the private mount namespace made by unshare: mount the overlay, then become bwrap.
MOUNT_AND_EXEC = 'mount -t overlay overlay -o "$1" "$2"; shift 2; exec "$@"'

_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    pass


class StopRequestedError(Exception):
    pass


def log(message: str) -> None:
    print(f"[supervisor {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when the supervisor dies, however it dies."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Supervisor:
    def __init__(self, folder: Path, ready_fd: int | None) -> None:
        self.folder = folder
        self.ready_fd = ready_fd
        self.spec = LocalSandboxSpec.from_json(json.loads((folder / SPEC_FILE).read_text()))
        self.logs = folder / LOGS_DIR
        self.pid = os.getpid()
        start_time = proc_start_time(self.pid)
        assert start_time is not None
        self.start_time = start_time
        self.created_at = now_iso()
        self.limits: list[LimitRecord] = []
        self.cpus: set[int] | None = None
        self.cgroup: Path | None = None
        self.sandbox: subprocess.Popen[bytes] | None = None
        self.slirp: subprocess.Popen[bytes] | None = None
        self.slirp_exit_w: int | None = None
        self.init_pid: int | None = None
        self.pidns: str | None = None
        self.host_port = 0
        self.phase = "starting"
        self.exit_code: int | None = None

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
            limits=list(self.limits),
            allow_outbound=self.spec.allow_outbound,
            phase=self.phase,
            created_at=self.created_at,
            init_pid=self.init_pid,
            pid_namespace=self.pidns,
            cgroup=str(self.cgroup) if self.cgroup else None,
            exit_code=self.exit_code,
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

    def plan_limits(self) -> None:
        spec = self.spec
        available = sorted(os.sched_getaffinity(0))
        if spec.vcpus is None:
            self.limits.append(LimitRecord("vcpus", "none", False, "no vCPU hint"))
        elif spec.vcpus >= len(available):
            self.limits.append(
                LimitRecord("vcpus", str(spec.vcpus), False, f"host offers {len(available)} CPUs: not restricted")
            )
        else:
            # Spread sandboxes over the CPUs: the window starts at a position derived from the id.
            offset = sum(spec.sandbox_id.encode()) % len(available)
            chosen = {available[(offset + i) % len(available)] for i in range(spec.vcpus)}
            self.cpus = chosen
            self.limits.append(
                LimitRecord("vcpus", str(spec.vcpus), True, f"CPU affinity {sorted(chosen)}")
            )
        if spec.memory_gb is None:
            self.limits.append(LimitRecord("memory_gb", "none", False, "no memory hint"))
            return
        limit = int(spec.memory_gb * 2**30)
        try:
            self.cgroup = self._make_memory_cgroup(limit)
        except OSError as exc:
            self.limits.append(
                LimitRecord("memory_gb", str(spec.memory_gb), False, f"no cgroup-v1 memory limit: {exc}")
            )
            return
        self.limits.append(
            LimitRecord("memory_gb", str(spec.memory_gb), True, f"memory.limit_in_bytes={limit} in {self.cgroup}")
        )

    def _make_memory_cgroup(self, limit: int) -> Path:
        """A cgroup-v1 memory cgroup under our own one (so the host's limits still apply)."""
        root = Path("/sys/fs/cgroup/memory")
        if not (root / "cgroup.procs").is_file():
            raise OSError("no cgroup-v1 memory hierarchy at /sys/fs/cgroup/memory")
        current = "/"
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                current = path
        cgroup = root / current.lstrip("/") / f"ale-iac-{self.spec.sandbox_id}"
        cgroup.mkdir(exist_ok=True)
        try:
            (cgroup / "memory.limit_in_bytes").write_text(str(limit))
        except OSError:
            cgroup.rmdir()
            raise
        return cgroup

    def _preexec_sandbox(self) -> None:
        """preexec_fn of the sandbox: limits first, so that every later process inherits them."""
        _die_with_parent()
        if self.cpus:
            os.sched_setaffinity(0, self.cpus)
        if self.cgroup is not None:
            (self.cgroup / "cgroup.procs").write_text(str(os.getpid()))

    # --- start ---------------------------------------------------------------------------------

    def bwrap_argv(self, info_w: int, block_r: int) -> list[str]:
        spec = self.spec
        argv = [
            "bwrap",
            "--bind", str(self.folder / "merged"), "/",
            "--dev", "/dev",
            "--tmpfs", "/dev/shm",
            "--proc", "/proc",
            "--tmpfs", "/tmp",
            "--tmpfs", "/run",
            "--bind", str(self.logs), "/var/log/ale",
            "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--hostname", spec.sandbox_id,
            "--die-with-parent", "--new-session", "--as-pid-1",
            "--info-fd", str(info_w), "--block-fd", str(block_r),
            "--clearenv",
            "--setenv", "PATH", SANDBOX_PATH,
            "--setenv", "HOME", "/root",
            "--setenv", "LANG", "C.UTF-8",
            "--chdir", "/root",
            "--cap-drop", "ALL",
        ]
        for cap in SANDBOX_CAPS:
            argv += ["--cap-add", cap]
        argv += [
            "--", spec.init,
            "--port", str(spec.server_port),
            "--width", str(spec.screen_width),
            "--height", str(spec.screen_height),
            "--log-dir", "/var/log/ale",
        ]
        return argv

    def prepare_layer(self) -> str:
        upper = self.folder / "layer" / "upper"
        work = self.folder / "layer" / "work"
        for path in (upper, work, self.folder / "merged"):
            path.mkdir(parents=True, exist_ok=True)
        if self.spec.allow_outbound:
            (upper / "etc").mkdir(exist_ok=True)
            (upper / "etc" / "resolv.conf").write_text(f"nameserver {SLIRP_DNS}\n")
        lower = Path(self.spec.rootfs).resolve()
        for path in (lower, upper, work):
            if "," in str(path) or ":" in str(path):
                raise SetupError(f"path {path} cannot be used in overlay mount options (',' or ':')")
        return f"lowerdir={lower},upperdir={upper},workdir={work}"

    def start_sandbox(self) -> tuple[int, int]:
        """Start unshare/overlay/bwrap; returns (info read fd, block write fd)."""
        options = self.prepare_layer()
        info_r, info_w = os.pipe()
        block_r, block_w = os.pipe()
        argv = [
            "unshare", "--mount", "--propagation", "private", "--",
            "/bin/sh", "-c", MOUNT_AND_EXEC, "ale-sandbox", options, str(self.folder / "merged"),
            *self.bwrap_argv(info_w, block_r),
        ]
        log("starting: " + " ".join(argv))
        with open(self.logs / "init.log", "ab") as logf:
            self.sandbox = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                pass_fds=(info_w, block_r), preexec_fn=self._preexec_sandbox,  # noqa: PLW1509
            )
        os.close(info_w)
        os.close(block_r)
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
                raise SetupError("the sandbox exited during setup (overlay mount or bwrap failed; see init.log)")
            data += chunk
        os.close(info_r)
        self.init_pid = int(info["child-pid"])
        self.pidns = pid_namespace(self.init_pid)

    def start_slirp(self) -> None:
        assert self.init_pid is not None
        exit_r, exit_w = os.pipe()
        ready_r, ready_w = os.pipe()
        argv = [
            "slirp4netns", f"--mtu={MTU}", "--disable-host-loopback", f"--api-socket={SLIRP_SOCKET}",
            f"--exit-fd={exit_r}", f"--ready-fd={ready_w}",
        ]
        argv += ["--configure"] if self.spec.allow_outbound else ["--disable-dns"]
        argv += [str(self.init_pid), TAP]
        log("starting: " + " ".join(argv))
        with open(self.logs / "slirp4netns.log", "ab") as logf:
            self.slirp = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                pass_fds=(exit_r, ready_w), preexec_fn=_die_with_parent,  # noqa: PLW1509
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

    def configure_tap(self) -> None:
        """No-outbound network: an address on tap0 and no default route (slirp did not configure)."""
        assert self.init_pid is not None
        commands = f"addr add {GUEST_ADDR}/{GUEST_CIDR} dev {TAP}\nlink set {TAP} mtu {MTU} up\n"
        result = subprocess.run(
            ["nsenter", f"--net=/proc/{self.init_pid}/ns/net", "ip", "-batch", "-"],
            input=commands.encode(), capture_output=True, check=False,
        )
        if result.returncode != 0:
            raise SetupError(f"configuring {TAP} failed: {result.stderr.decode(errors='replace').strip()}")

    def slirp_api(self, request: dict[str, Any]) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(SETUP_TIMEOUT_S)
            sock.connect(SLIRP_SOCKET)
            sock.sendall(json.dumps(request).encode())
            sock.shutdown(socket.SHUT_WR)
            reply = b""
            while chunk := sock.recv(4096):
                reply += chunk
        result: dict[str, Any] = json.loads(reply)
        return result

    def add_port_forward(self) -> None:
        last_error = ""
        for _ in range(8):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind(("127.0.0.1", 0))
                port = int(probe.getsockname()[1])
            reply = self.slirp_api({
                "execute": "add_hostfwd",
                "arguments": {
                    "proto": "tcp", "host_addr": "127.0.0.1", "host_port": port,
                    "guest_addr": GUEST_ADDR, "guest_port": self.spec.server_port,
                },
            })
            if "return" in reply:
                self.host_port = port
                log(f"port forward 127.0.0.1:{port} -> {GUEST_ADDR}:{self.spec.server_port}")
                return
            last_error = json.dumps(reply)  # most likely the port was taken in between: retry
        raise SetupError(f"slirp4netns add_hostfwd failed: {last_error}")

    def setup(self) -> None:
        self.save()
        self.plan_limits()
        self.save()
        info_r, block_w = self.start_sandbox()
        try:
            self.read_info(info_r)
            self.save()
            self.start_slirp()
            if not self.spec.allow_outbound:
                self.configure_tap()
            self.add_port_forward()
            os.write(block_w, b"1")  # bwrap goes on and executes the init
        finally:
            os.close(block_w)
        self.phase = "running"
        self.save()

    # --- run and stop --------------------------------------------------------------------------

    def on_sigterm(self, _signum: int, _frame: object) -> None:
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
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                self.cgroup.rmdir()

    def wait(self) -> None:
        """Until SIGTERM, or until the sandbox or slirp4netns exits."""
        assert self.sandbox is not None and self.slirp is not None
        while True:
            pid, status = os.waitpid(-1, 0)
            if pid == self.sandbox.pid:
                self.sandbox.returncode = os.waitstatus_to_exitcode(status)
                self.exit_code = self.sandbox.returncode
                log(f"the sandbox exited with {self.exit_code}")
                return
            if pid == self.slirp.pid:
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
                self.report({"ok": False, "error": str(exc)})
                self.phase = "exited"
                return 1
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
            self.phase = "exited"
            with contextlib.suppress(OSError):  # stop() may already be deleting the state dir
                self.save()
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ale_iac.infra.local_supervisor")
    parser.add_argument("state_dir", type=Path)
    parser.add_argument("--ready-fd", type=int, default=None, help="fd on which to report readiness (one JSON line)")
    args = parser.parse_args(argv)
    folder = args.state_dir.resolve()
    os.chdir(folder)
    log(f"supervisor pid {os.getpid()} for {folder}")
    return Supervisor(folder, args.ready_fd).run()


if __name__ == "__main__":
    sys.exit(main())
