"""Starting and stopping one QEMU process through ``launch.sh``, on the host or in the runner container.

Both packagings run the same script with the same arguments (:func:`launch_args`):

* ``host``: ``/bin/sh launch.sh ...`` in a session of its own; the script execs QEMU, so the recorded pid
  is QEMU's. Its command line names the unit folder (in ``-name``), which is how a pid is recognised as the
  unit's (:func:`qemu_alive`) and never confused with a recycled one.

Either way QEMU never runs as root: the script execs it as the unit's own unprivileged host id
(:func:`qemu_uid`, uid and gid alike), with no capability, ``no_new_privs`` and QEMU's own seccomp filter,
and it reaches only the unit's ``vm/`` folder (:func:`vm_dir`, that id's own) and the files the script
opened for it (kernel, initrd, the overlay's backing chain, a saved state).
* ``container``: ``docker run`` of the runner image (``images/qemu-runner``: Debian with QEMU, built and
  imported locally, nothing pulled) with ``launch.sh`` bind-mounted read-only from this package, the unit
  folder read-write and the disk and saved-state folders read-only, all at their host paths; host network,
  so that QEMU's port forward binds the host's 127.0.0.1 exactly as on the host. Labelled like a docker
  unit (``ale-iac.kind=qemu-runner``), so that stop and gc find it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import psutil

from ale_iac.errors import AleIacError
from ale_iac.paths import home_id

LAUNCH_SCRIPT = Path(__file__).resolve().parent / "launch.sh"
CONTAINER_LAUNCH = "/opt/ale-iac/launch.sh"
Runner = Literal["host", "container"]
RUNNER_KIND = "qemu-runner"
LABEL = "ale-iac."
STOP_GRACE_S = 10.0
KILL_WAIT_S = 5.0
GONE_POLL_S = 0.05
EXEC_SETTLE_S = 1.0
EXEC_SETTLE_POLL_S = 0.002
VM = "vm"
QEMU_UID_START = 0x60000000
"""QEMU's host ids: ``QEMU_UID_START + slot``, above the local substrate's ranges (2^30 .. 2^30 + 2^28) and
far from any real or ``/etc/subuid`` id."""
QEMU_UID_SLOTS = 65536


class QemuSubstrateError(AleIacError):
    """QEMU failed to start, or a unit could not be made or removed; the message names the unit."""


@dataclass(frozen=True)
class Machine:
    """What one QEMU process is given (the saved-state key is everything but the unit folder and port)."""

    base: Path
    kernel: Path
    initrd: Path
    vcpus: int
    memory_mb: int
    accel: str
    width: int = 1280
    height: int = 800


@dataclass(frozen=True)
class Launched:
    runner: Runner
    pid: int | None = None
    container_id: str | None = None


def kvm_status() -> tuple[bool, str]:
    """Whether hardware KVM is usable here, and why (what ``doctor`` prints); otherwise TCG."""
    dev = Path("/dev/kvm")
    if not dev.exists():
        return False, "no /dev/kvm: TCG (software emulation)"
    if not os.access(dev, os.R_OK | os.W_OK):
        return False, "/dev/kvm is not accessible to this user: TCG (software emulation)"
    for module in ("kvm_intel", "kvm_amd"):
        if Path(f"/sys/module/{module}").exists():
            return True, f"/dev/kvm ({module}): KVM"
    if Path("/sys/module/kvm_pvm").exists():
        return False, "/dev/kvm is kvm_pvm, which does not boot a stock Debian kernel: TCG (software emulation)"
    return False, "/dev/kvm has no hardware module (kvm_intel, kvm_amd) loaded: TCG (software emulation)"


def accel() -> str:
    return "kvm" if kvm_status()[0] else "tcg"


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (QEMU binds it a moment later; a lost race fails the start cleanly)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def vm_dir(unit_dir: Path) -> Path:
    """What QEMU may write: its overlay, sockets, console log and the guest share; owned by :func:`qemu_uid`.
    The unit folder around it stays root's (its record, token and QEMU's own log)."""
    return unit_dir / VM


def qemu_uid(unit_dir: Path) -> int:
    """The host id QEMU of ``unit_dir`` runs as (uid and gid): one of ``QEMU_UID_SLOTS``, chosen by the folder,
    so that units are mostly different host users. Two that share a slot (about 1 pair in 65536) are still apart
    on the file system, each ``vm/`` being inside a root-only folder, but not for signals between them."""
    digest = hashlib.sha256(str(unit_dir).encode()).digest()
    return QEMU_UID_START + int.from_bytes(digest[:4], "big") % QEMU_UID_SLOTS


def name_marker(unit_dir: Path) -> str:
    """What QEMU's ``-name`` of ``unit_dir`` carries (a comma doubled, as launch.sh writes it)."""
    return "guest=ale:" + str(unit_dir).replace(",", ",,") + ","


def launch_args(unit_dir: Path, machine: Machine, port: int, incoming: Path | None) -> list[str]:
    args = [
        "--unit-dir", str(unit_dir), "--base", str(machine.base), "--kernel", str(machine.kernel),
        "--initrd", str(machine.initrd), "--port", str(port), "--uid", str(qemu_uid(unit_dir)),
        "--vcpus", str(machine.vcpus), "--memory-mb", str(machine.memory_mb), "--accel", machine.accel,
        "--width", str(machine.width), "--height", str(machine.height),
    ]  # fmt: skip
    for layer in backing_chain(machine.base)[1:]:
        args += ["--backing", str(layer)]
    if incoming is not None:
        args += ["--incoming", str(incoming)]
    return args


def launch(
    runner: Runner,
    unit_dir: Path,
    machine: Machine,
    port: int,
    *,
    incoming: Path | None = None,
    runner_image: str | None = None,
    labels: dict[str, str] | None = None,
) -> Launched:
    """Start QEMU for ``unit_dir`` (made 0700 if missing); returns at once, QEMU's sockets come later."""
    unit_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    args = launch_args(unit_dir, machine, port, incoming)
    if runner == "host":
        with os.fdopen(os.open(unit_dir / "qemu.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
            proc = subprocess.Popen(
                ["/bin/sh", str(LAUNCH_SCRIPT), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        _children[proc.pid] = proc
        return Launched("host", pid=proc.pid)
    if runner_image is None:
        raise QemuSubstrateError("the container runner needs its image (ale-iac images build qemu-runner)")
    return Launched("container", container_id=_run_container(runner_image, unit_dir, machine, args, labels or {}))


_children: dict[int, subprocess.Popen[bytes]] = {}
"""QEMU processes this process started: reaped when stopped, so that none stays a zombie."""


def container_name(unit_dir: Path) -> str:
    return f"ale-iac-qemu-{unit_dir.name}"


def _run_container(image: str, unit_dir: Path, machine: Machine, args: list[str], labels: dict[str, str]) -> str:
    from docker.errors import DockerException

    from ale_iac.docker_engine import client

    ro = {"mode": "ro"}
    volumes = {
        str(unit_dir): {"bind": str(unit_dir), "mode": "rw"},
        str(LAUNCH_SCRIPT): {"bind": CONTAINER_LAUNCH, **ro},
    }
    for path in {machine.base.parent, machine.kernel.parent, machine.initrd.parent}:
        volumes[str(path)] = {"bind": str(path), **ro}
    # The base of a restored unit is a saved state's overlay, whose own base is the export's disk.
    for layer in backing_chain(machine.base):
        volumes.setdefault(str(layer.parent), {"bind": str(layer.parent), **ro})
    # Not ``ale-iac.home``: that label is the docker executor's, whose gc would take these for its own.
    all_labels = {f"{LABEL}kind": RUNNER_KIND, f"{LABEL}qemu-home": home_id(), f"{LABEL}unit-dir": str(unit_dir)}
    all_labels.update({f"{LABEL}{k}": v for k, v in labels.items()})
    engine = client()
    try:
        container = engine.containers.run(
            image,
            command=["/bin/sh", CONTAINER_LAUNCH, *args],
            entrypoint=[],
            name=container_name(unit_dir),
            labels=all_labels,
            network_mode="host",
            userns_mode="host",  # the host's network namespace needs the host's user namespace
            volumes=volumes,
            devices=["/dev/kvm:/dev/kvm:rw"] if machine.accel == "kvm" else [],
            working_dir=str(unit_dir),
            detach=True,
            stdin_open=False,
            environment={"LANG": "C.UTF-8"},
        )
        return str(container.id)
    except DockerException as exc:
        raise QemuSubstrateError(f"qemu runner container for {unit_dir.name}: {exc}") from None
    finally:
        engine.close()


def backing_chain(disk: Path) -> list[Path]:
    """``disk`` and every image below it, top first (what launch.sh opens for QEMU, in this order)."""
    done = subprocess.run(
        ["qemu-img", "info", "--backing-chain", "--output=json", "-U", str(disk)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise QemuSubstrateError(f"cannot read the backing chain of {disk}: {done.stderr.strip()}")
    return [Path(layer["filename"]) for layer in json.loads(done.stdout)]


def qemu_alive(pid: int | None, unit_dir: Path) -> bool:
    """Whether ``pid`` is a live QEMU of ``unit_dir`` (its command line names the folder)."""
    if pid is None:
        return False
    child = _children.get(pid)
    if child is not None:
        # Our own child: between fork and exec its command line is still ours, so ask it directly.
        return child.poll() is None
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return _names_unit(_settled_cmdline(proc), unit_dir)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _settled_cmdline(proc: psutil.Process) -> list[str]:
    """The process's command line. While a process execs, the kernel shows its command line empty for a moment
    (the new image's arguments are not in place yet): the launch script execs ``setpriv``, which execs QEMU, and a
    unit read then looked stopped (a CI run's gc test; a loop of execs read empty 2,615 times in 992,050 reads).
    So an empty one is read again until it is not, for at most ``EXEC_SETTLE_S`` (a kernel thread's stays empty)."""
    deadline = time.monotonic() + EXEC_SETTLE_S
    cmdline: list[str] = proc.cmdline()
    while not cmdline and time.monotonic() < deadline:
        time.sleep(EXEC_SETTLE_POLL_S)
        cmdline = proc.cmdline()
    return cmdline


def container_running(unit_dir: Path) -> bool:
    from docker.errors import DockerException, NotFound

    from ale_iac.docker_engine import client

    try:
        engine = client(timeout=30)
    except AleIacError:
        return False
    try:
        return str(engine.containers.get(container_name(unit_dir)).status) == "running"
    except (NotFound, DockerException):
        return False
    finally:
        engine.close()


def alive(launched: Launched, unit_dir: Path) -> bool:
    if launched.runner == "host":
        return qemu_alive(launched.pid, unit_dir)
    return container_running(unit_dir)


def qemu_pids(unit_dir: Path) -> list[int]:
    """Host processes that run a QEMU of ``unit_dir`` (its ``-name`` names the folder): the way to
    find one whose pid was never recorded (its starter was killed right after starting it)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if _names_unit(proc.info["cmdline"] or [], unit_dir):
                found.append(int(proc.info["pid"]))
    return found


def _names_unit(cmdline: list[str], unit_dir: Path) -> bool:
    """Whether a command line is a QEMU of ``unit_dir``: its ``-name`` marker, or (a unit started before QEMU
    ran unprivileged) its overlay in the unit folder itself; or the launch script that will exec that QEMU
    (its ``--unit-dir``): until it does, the recorded pid is the script's, and a unit whose starter was killed
    then must still count as running, or gc would pass over a QEMU that starts a moment later."""
    marker, overlay = name_marker(unit_dir), f"file={unit_dir}/disk.qcow2,"
    # The marker's closing comma is single: ``a,`` must not match ``a,,b,`` (the folder ``a,b``).
    if any((arg.startswith(marker) and not arg.startswith(marker + ",")) or overlay in arg for arg in cmdline):
        return True
    return str(LAUNCH_SCRIPT) in cmdline[:2] and _argument(cmdline, "--unit-dir") == str(unit_dir)


def _argument(cmdline: list[str], flag: str) -> str | None:
    with contextlib.suppress(ValueError, IndexError):
        return cmdline[cmdline.index(flag) + 1]
    return None


def kill(launched: Launched, unit_dir: Path) -> None:
    """Stop the QEMU of ``unit_dir`` (SIGTERM, then SIGKILL after a grace) or remove its container. First, reap
    our QEMUs that another process stopped, so that none of them stays a zombie of this process."""
    for other, child in list(_children.items()):
        if child.poll() is not None:
            _children.pop(other, None)
    if launched.runner == "container":
        remove_container(unit_dir)
        return
    pid = launched.pid
    if pid is None or not qemu_alive(pid, unit_dir):
        _reap(pid)
        for other in qemu_pids(unit_dir):
            kill(Launched("host", pid=other), unit_dir)
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if not _wait_gone(pid, unit_dir, STOP_GRACE_S):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _wait_gone(pid, unit_dir, KILL_WAIT_S)


def _wait_gone(pid: int, unit_dir: Path, timeout: float) -> bool:
    """Wait until ``pid`` is no longer a live QEMU of ``unit_dir``; whether it went within ``timeout``.

    Judged by :func:`qemu_alive`, which counts a zombie as gone: a QEMU another process started (the
    engine's provider process made the unit, a run's reset stops it) stays a zombie until that parent reaps
    it, and waiting for its pid to disappear cost every such stop the whole wait (5 s a reset or destroy)."""
    deadline = time.monotonic() + timeout
    while qemu_alive(pid, unit_dir):
        if time.monotonic() >= deadline:
            return False
        _reap(pid, timeout=GONE_POLL_S)
    _reap(pid)
    return True


def _reap(pid: int | None, timeout: float = 0.0) -> None:
    """Reap ``pid`` if it is our child (waiting up to ``timeout``); otherwise wait up to ``timeout`` for it
    to go."""
    if pid is None:
        return
    proc = _children.get(pid)
    if proc is None:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).wait(timeout=timeout or 0.01)
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout or 0.01)
        _children.pop(pid, None)


def remove_container(unit_dir: Path) -> bool:
    return remove_container_named(container_name(unit_dir))


def orphan_containers() -> list[str]:
    """Names of this home's runner containers whose unit folder is gone (removed behind ale-iac's back);
    empty when no engine answers."""
    from docker.errors import DockerException

    from ale_iac.docker_engine import client

    try:
        engine = client(timeout=30)
    except AleIacError:
        return []
    try:
        labels = [f"{LABEL}kind={RUNNER_KIND}", f"{LABEL}qemu-home={home_id()}"]
        found = engine.containers.list(all=True, filters={"label": labels})
        return [str(c.name) for c in found if not Path(c.labels.get(f"{LABEL}unit-dir", "/")).is_dir()]
    except DockerException:
        return []
    finally:
        engine.close()


def remove_container_named(name: str) -> bool:
    """Remove a runner container (running or not); True if it was there."""
    from docker.errors import DockerException, NotFound

    from ale_iac.docker_engine import client

    engine = client(timeout=60)
    try:
        engine.containers.get(name).remove(force=True)
        return True
    except NotFound:
        return False
    except DockerException as exc:
        raise QemuSubstrateError(f"cannot remove the runner container {name}: {exc}") from None
    finally:
        engine.close()


def wait_for_sockets(launched: Launched, unit_dir: Path, deadline: float) -> None:
    """Until QEMU listens on its QMP and agent sockets; fails at once if it exits (with its log's tail)."""
    names = ("qmp.sock", "agent.sock")
    while not all((vm_dir(unit_dir) / name).is_socket() for name in names):
        if not alive(launched, unit_dir):
            raise QemuSubstrateError(f"QEMU of {unit_dir.name} exited at start: {log_tail(launched, unit_dir)}")
        if time.monotonic() > deadline:
            raise QemuSubstrateError(f"QEMU of {unit_dir.name} made no control socket in time")
        time.sleep(0.05)


def log_tail(launched: Launched, unit_dir: Path, lines: int = 10) -> str:
    text = ""
    if launched.runner == "host":
        with contextlib.suppress(OSError):
            text = (unit_dir / "qemu.log").read_text(errors="replace")
    else:
        with contextlib.suppress(Exception):
            from ale_iac.docker_engine import client

            engine = client(timeout=30)
            try:
                text = engine.containers.get(container_name(unit_dir)).logs().decode(errors="replace")
            finally:
                engine.close()
    return " | ".join(text.strip().splitlines()[-lines:]) or "(no output)"
