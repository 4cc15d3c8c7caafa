"""The ``qemu`` substrate's driver: start, inspect, stop and list unit guests; no Pulumi.

A unit is one QEMU process (on the host, or in the runner container: :mod:`launcher`) and one folder,
``$ALE_IAC_HOME/qemu/<sandbox id>/`` (0700), made before anything starts so that ``stop`` and
``ale-iac gc`` always find what a crash left:

* ``unit.json``: labels, expiry, runner, port, pid or container, the saved state it came from (no token);
* ``qemu.log``: QEMU's own output;
* ``token`` (0600), only for a unit remade by a pool reset (:func:`reset`): its token, which :func:`current`
  reads, because the lease that uses it may be another process than the one that reset it;
* ``vm/`` (0700), the one folder QEMU may write, owned by its unprivileged host id (``launcher.qemu_uid``):
  ``disk.qcow2``, the disposable overlay, on the saved state's frozen overlay (restored units) or on the
  qcow2 export itself (cold-booted units); ``qmp.sock`` (QMP), ``agent.sock`` (the guest agent's channel),
  ``serial.log`` (the guest console); ``share/``, the guest share (9p), mounted in the guest at
  ``/mnt/ale-share`` (the bulk transport). Nothing the host trusts (the record, the token) is in it.

The endpoint is the guest's authenticating forwarder (the local and docker substrates' ``authproxy``),
reached through QEMU's one port forward on the host's 127.0.0.1; the guest has user-mode networking with
``restrict=on``, so it reaches nothing else. The token goes to the guest over the agent channel (a 0600
socket in the 0700 folder) and lives in the guest agent's memory only (the forwarder runs in that process);
it is on no command line and in no file of the guest; on the host, only a reset unit's ``token`` holds it.

``unit.json`` keeps the unit's spec, so that :func:`reset` can remake a pool unit between leases under the
same id: the guest is stopped and its folder deleted (memory, overlay, share: nothing of a task survives),
then the unit is restored again from the saved memory state onto a fresh overlay, with a new token,
machine-id, random seed and port (the hostname is the sandbox id, so it stays).

A restored unit gets, before it answers anything, its own clock (the host's, sent as it resumes), its own
hostname (the sandbox id) and machine-id, a fresh seed for the guest kernel's random pool (also reseeded
by vmgenid), and its token; the saved state was taken before any unit's identity existed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ale_iac.clock import utc_now
from ale_iac.errors import AleIacError
from ale_iac.paths import ale_home
from ale_iac.substrates.qemu.launcher import (
    Launched,
    Machine,
    QemuSubstrateError,
    Runner,
    accel,
    alive,
    free_port,
    kill,
    kvm_status,
    launch,
    log_tail,
    vm_dir,
    wait_for_sockets,
)
from ale_iac.substrates.qemu.qmp import AgentChannel, Qmp
from ale_iac.substrates.qemu.saved import BOOT_TIMEOUT_S, ensure_saved_state

UNIT_FILE = "unit.json"
TOKEN_FILE = "token"
SHARE = "share"
RESTORE_TIMEOUT_S = 120.0
READY_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class QemuSandboxSpec:
    sandbox_id: str
    disk: Path
    kernel: Path
    initrd: Path
    vcpus: int = 1
    memory_mb: int = 2048
    screen_width: int = 1280
    screen_height: int = 800
    restore: bool = True
    runner: Runner = "host"
    runner_image: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    expires_at: str | None = None

    def to_record(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.update(disk=str(self.disk), kernel=str(self.kernel), initrd=str(self.initrd))
        return data

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> QemuSandboxSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        fields = {key: value for key, value in data.items() if key in known}
        fields.update(disk=Path(data["disk"]), kernel=Path(data["kernel"]), initrd=Path(data["initrd"]))
        return cls(**fields)

    def machine(self) -> Machine:
        return Machine(
            base=self.disk, kernel=self.kernel, initrd=self.initrd, vcpus=int(self.vcpus),
            memory_mb=int(self.memory_mb), accel=accel(), width=int(self.screen_width),
            height=int(self.screen_height),
        )  # fmt: skip


@dataclass(frozen=True)
class QemuSandboxState:
    sandbox_id: str
    unit_dir: Path
    endpoint: str
    host_port: int
    token: str
    runner: Runner
    pid: int | None
    container_id: str | None
    accel: str
    restored: bool
    hostname: str
    machine_id: str
    seconds_to_ready: float


@dataclass(frozen=True)
class QemuSandboxInfo:
    """A unit folder and whether its QEMU runs (for ``gc``, ``list`` and ``inspect``)."""

    sandbox_id: str
    unit_dir: Path
    running: bool
    labels: dict[str, str]
    record: dict[str, Any]


def units_dir(home: Path | None = None) -> Path:
    return (home or ale_home()) / "qemu"


def unit_dir_of(sandbox_id: str, home: Path | None = None) -> Path:
    if not sandbox_id or "/" in sandbox_id or sandbox_id.startswith("."):
        raise QemuSubstrateError(f"invalid sandbox id {sandbox_id!r}")
    return units_dir(home) / sandbox_id


def share_dir(sandbox_id: str, home: Path | None = None) -> Path:
    """The host side of a unit's guest share (``/mnt/ale-share`` in the guest)."""
    return vm_dir(unit_dir_of(sandbox_id, home)) / SHARE


def _write_record(unit_dir: Path, record: dict[str, Any]) -> None:
    tmp = unit_dir / f".{UNIT_FILE}.tmp"
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        out.write(json.dumps(record, indent=2) + "\n")
    tmp.replace(unit_dir / UNIT_FILE)


def _read_record(unit_dir: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((unit_dir / UNIT_FILE).read_text())
        return data
    except (OSError, ValueError):
        return {}


def _launched_of(record: dict[str, Any]) -> Launched:
    return Launched(runner=record.get("runner", "host"), pid=record.get("pid"), container_id=record.get("container_id"))


def _unit_record(spec: QemuSandboxSpec, machine: Machine) -> dict[str, Any]:
    """What the unit's folder records of it from the start (``unit.json``; the port and the process follow)."""
    return {
        "sandbox_id": spec.sandbox_id,
        "labels": dict(spec.labels),
        "expires_at": spec.expires_at,
        "created_at": utc_now("seconds"),
        "runner": spec.runner,
        "accel": machine.accel,
        "vcpus": machine.vcpus,
        "memory_mb": machine.memory_mb,
        "owner_pid": os.getpid(),
        "spec": spec.to_record(),
    }


def _give_identity(sandbox_id: str, unit_dir: Path, launched: Launched, *, resumed: bool) -> dict[str, Any]:
    """A new identity (hostname, machine id, seed, token) sent to the guest agent once the guest is up (booted,
    or ``resumed`` from the saved state), and applied by it; returns the identity."""
    identity = {
        "hostname": sandbox_id,
        "machine_id": secrets.token_hex(16),
        "seed": secrets.token_hex(64),
        "token": secrets.token_urlsafe(32),
        "share": True,
    }
    agent = AgentChannel(vm_dir(unit_dir) / "agent.sock")
    try:
        if resumed:
            _resume(unit_dir, launched)
        else:
            try:
                agent.wait_for("waiting", time.monotonic() + BOOT_TIMEOUT_S)
            except TimeoutError:
                raise QemuSubstrateError(f"the guest did not boot within {BOOT_TIMEOUT_S:.0f} s") from None
        agent.send({**identity, "epoch_ns": time.time_ns()})
        try:
            agent.wait_for("ready", time.monotonic() + READY_TIMEOUT_S)
        except TimeoutError:
            raise QemuSubstrateError("the guest agent did not apply the unit's identity in time") from None
    finally:
        agent.close()
    return identity


def start(
    spec: QemuSandboxSpec, log: Callable[[str], None] | None = None, *, keep_token: bool = False
) -> QemuSandboxState:
    """Start a unit guest and give it its identity; returns once its forwarder listens in the guest (the
    endpoint answers through QEMU's forward right after). Whatever was made is removed on failure.
    ``keep_token``: also write the token to the unit's ``token`` file (a reset unit's, for :func:`current`)."""
    started = time.monotonic()
    unit_dir = unit_dir_of(spec.sandbox_id)
    units_dir().mkdir(parents=True, exist_ok=True, mode=0o700)
    unit_dir.mkdir(mode=0o700)
    machine = spec.machine()
    record = _unit_record(spec, machine)
    _write_record(unit_dir, record)
    try:
        incoming = None
        if spec.restore:
            saved = ensure_saved_state(machine, spec.runner, runner_image=spec.runner_image, log=log)
            record["saved_state"] = str(saved.path)
            machine = dataclasses.replace(machine, base=saved.overlay)
            incoming = saved.state
        port = free_port()
        record["host_port"] = port
        launched = launch(
            spec.runner, unit_dir, machine, port, incoming=incoming, runner_image=spec.runner_image,
            labels={"sandbox": spec.sandbox_id, **{k: v for k, v in spec.labels.items() if k in ("stack", "unit")}},
        )  # fmt: skip
        record.update(pid=launched.pid, container_id=launched.container_id)
        _write_record(unit_dir, record)
        launch_at = time.monotonic()
        wait_for_sockets(launched, unit_dir, time.monotonic() + 60)
        identity = _give_identity(spec.sandbox_id, unit_dir, launched, resumed=incoming is not None)
        if not alive(launched, unit_dir):
            raise QemuSubstrateError(f"QEMU exited: {log_tail(launched, unit_dir)}")
        if keep_token:
            fd = os.open(unit_dir / TOKEN_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(str(identity["token"]))
    except BaseException as exc:
        with contextlib.suppress(Exception):
            stop(spec.sandbox_id)
        if isinstance(exc, AleIacError | OSError | TimeoutError):
            raise QemuSubstrateError(f"qemu unit {spec.sandbox_id}: {exc}") from None
        raise
    return QemuSandboxState(
        sandbox_id=spec.sandbox_id,
        unit_dir=unit_dir,
        endpoint=f"http://127.0.0.1:{port}",
        host_port=port,
        token=str(identity["token"]),
        runner=spec.runner,
        pid=launched.pid,
        container_id=launched.container_id,
        accel=machine.accel,
        restored=incoming is not None,
        hostname=str(identity["hostname"]),
        machine_id=str(identity["machine_id"]),
        seconds_to_ready=round(time.monotonic() - (launch_at if incoming is not None else started), 3),
    )


def reset(sandbox_id: str, log: Callable[[str], None] | None = None) -> QemuSandboxState:
    """Replace a unit by a fresh one of the same spec under the same id (a pool unit between leases): its
    QEMU stopped and its folder deleted, then restored from the saved state onto a new overlay with a new
    identity and port (read them from the returned state, or later with :func:`current`)."""
    unit_dir = unit_dir_of(sandbox_id)
    if not unit_dir.is_dir():
        raise QemuSubstrateError(f"qemu unit {sandbox_id} does not exist ({unit_dir}): nothing to reset")
    recorded = _read_record(unit_dir).get("spec")
    if not isinstance(recorded, dict):
        raise QemuSubstrateError(
            f"qemu unit {sandbox_id} records no spec (made before pool resets existed); replace it with "
            "pulumi up --replace"
        )
    spec = QemuSandboxSpec.from_record(recorded)
    stop(sandbox_id)
    return start(spec, log, keep_token=True)


def current(sandbox_id: str, home: Path | None = None) -> tuple[str, str] | None:
    """(endpoint, token) of a unit a reset remade; None for one that was never reset (what the stack
    recorded at its creation is still right) or that is gone."""
    unit_dir = unit_dir_of(sandbox_id, home)
    try:
        token = (unit_dir / TOKEN_FILE).read_text().strip()
    except OSError:
        return None
    port = _read_record(unit_dir).get("host_port")
    if not token or not isinstance(port, int):
        return None
    return f"http://127.0.0.1:{port}", token


def _resume(unit_dir: Path, launched: Launched) -> None:
    """Wait until the incoming state is loaded (``paused``), then ``cont``. A ``cont`` sent while QEMU is
    still ``inmigrate`` leaves the guest stopped for good."""
    deadline = time.monotonic() + RESTORE_TIMEOUT_S
    with Qmp(vm_dir(unit_dir) / "qmp.sock") as qmp:
        while True:
            status = (qmp.execute("query-status") or {}).get("status")
            if status == "paused":
                qmp.execute("cont")
                return
            if status == "running":
                return
            if status not in ("inmigrate", "prelaunch"):
                raise QemuSubstrateError(f"restoring the saved state failed (QEMU status {status})")
            if time.monotonic() > deadline or not alive(launched, unit_dir):
                raise QemuSubstrateError(f"the saved state did not load: {log_tail(launched, unit_dir)}")
            time.sleep(0.02)


def host_checks() -> list[tuple[str, bool, str]]:
    """What the ``qemu`` profile needs of this host (``doctor`` prints these): QEMU and its accelerator."""
    rows: list[tuple[str, bool, str]] = []
    for tool in ("qemu-system-x86_64", "qemu-img"):
        path = shutil.which(tool)
        rows.append((f"qemu: {tool}", path is not None, path or "missing (apt-get install qemu-system-x86 qemu-utils)"))
    kvm, detail = kvm_status()
    rows.append(("qemu: accelerator", True, f"{'kvm' if kvm else 'tcg'}: {detail}"))
    running = [info for info in list_sandboxes() if info.running]
    rows.append(("qemu: units", True, f"{len(running)} running guest(s) of this home"))
    return rows


def inspect(sandbox_id: str, home: Path | None = None) -> QemuSandboxInfo | None:
    """The unit's folder and QEMU, or None when the folder is gone."""
    unit_dir = unit_dir_of(sandbox_id, home)
    if not unit_dir.is_dir():
        return None
    record = _read_record(unit_dir)
    return QemuSandboxInfo(
        sandbox_id=sandbox_id,
        unit_dir=unit_dir,
        running=alive(_launched_of(record), unit_dir) if record else False,
        labels={str(k): str(v) for k, v in dict(record.get("labels") or {}).items()},
        record=record,
    )


def list_sandboxes(home: Path | None = None) -> list[QemuSandboxInfo]:
    """Every unit folder of this home, running or not."""
    root = units_dir(home)
    if not root.is_dir():
        return []
    names = [path.name for path in sorted(root.iterdir()) if path.is_dir() and not path.name.startswith(".")]
    found = [inspect(name, home) for name in names]
    return [info for info in found if info is not None]


def stop(sandbox_id: str, home: Path | None = None) -> bool:
    """Stop the unit's QEMU (or remove its runner container) and delete its folder: overlay, sockets,
    share. Idempotent; True if the unit was there."""
    unit_dir = unit_dir_of(sandbox_id, home)
    if not unit_dir.exists():
        return False
    record = _read_record(unit_dir)
    launched = _launched_of(record)
    if launched.runner == "container" or record.get("runner") == "container":
        kill(dataclasses.replace(launched, runner="container"), unit_dir)
    else:
        kill(launched, unit_dir)
    if alive(launched, unit_dir):
        raise QemuSubstrateError(f"qemu unit {sandbox_id}: its QEMU (pid {launched.pid}) did not stop")
    shutil.rmtree(unit_dir)
    return True
