"""The qemu driver against real guests (TCG here): restore with a fresh identity and clock, the walls of
the endpoint and the network, and stop/failure paths that leave no process, overlay or socket."""

from __future__ import annotations

import socket
import stat
import time
from pathlib import Path

import httpx
import psutil
import pytest

from ale_iac.substrates.qemu import launcher, runtime
from ale_iac.substrates.qemu.disk import QemuDisk
from ale_iac.substrates.qemu.launcher import QemuSubstrateError, qemu_pids
from ale_iac.substrates.qemu.saved import find_saved_state
from tests.substrates.qemu.conftest import StartFn, endpoint, spec_for
from tests.support.sandbox import run, wait_for_status

pytestmark = [pytest.mark.qemu, pytest.mark.timeout(1200), pytest.mark.xdist_group("qemu")]


def _guest_clock_offset(state: runtime.QemuSandboxState) -> tuple[float, float]:
    """(guest clock - host clock, half the round trip) over one command."""
    before = time.time()
    reply = run(endpoint(state), "date +%s.%N")
    after = time.time()
    return float(reply["stdout"]) - (before + after) / 2, (after - before) / 2


def _gone(state: runtime.QemuSandboxState) -> None:
    assert not state.unit_dir.exists()
    assert state.pid is None or not psutil.pid_exists(state.pid) or psutil.Process(state.pid).status() == "zombie"
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", state.host_port), timeout=2):
        pass


def test_restored_units_each_get_their_own_identity_and_the_clock(start_unit: StartFn, qemu_disk: QemuDisk) -> None:
    first = start_unit()
    second = start_unit()
    saved = find_saved_state(spec_for(qemu_disk).machine(), "host")
    assert saved is not None and first.restored and second.restored
    for state in (first, second):
        wait_for_status(endpoint(state))
        reply = run(endpoint(state), "hostname; cat /etc/machine-id; uname -r")
        hostname, machine_id, kernel = reply["stdout"].split()
        assert hostname == state.sandbox_id == state.hostname
        assert machine_id == state.machine_id
        assert kernel.endswith("-amd64")  # Debian's own kernel: a real one, not the host's
        offset, uncertainty = _guest_clock_offset(state)
        assert abs(offset) < 1.0 + uncertainty, f"guest clock off by {offset:.3f} s"
    assert first.machine_id != second.machine_id and first.token != second.token
    # Nothing of one unit reaches the other: its own overlay, its own token.
    run(endpoint(first), "echo first > /root/only-in-first")
    assert run(endpoint(second), "test -e /root/only-in-first; echo $?")["stdout"].strip() == "1"
    other = httpx.get(f"{second.endpoint}/status", headers={"Authorization": f"Bearer {first.token}"}, timeout=10)
    assert other.status_code == 401
    # The saved state is frozen: units write to their own overlays only.
    assert saved.overlay.stat().st_mode & 0o222 == 0 and saved.state.stat().st_mode & 0o222 == 0


def test_the_endpoint_is_loopback_only_and_needs_the_token(start_unit: StartFn) -> None:
    state = start_unit()
    assert httpx.get(f"{state.endpoint}/status", timeout=10).status_code == 401
    wait_for_status(endpoint(state))
    listening = [
        conn.laddr
        for conn in psutil.Process(state.pid).net_connections(kind="inet")
        if conn.status == psutil.CONN_LISTEN
    ]
    assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening
    # The token lives in the guest's /run only; it is on no command line of the host.
    assert not any(state.token in " ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))
    assert state.token not in (state.unit_dir / "unit.json").read_text()
    # Nor in any file of the guest (the agent keeps it in memory); the probe splits it to stay off its own line.
    half = len(state.token) // 2
    where = "/run /etc /root /tmp /var /opt/ale-iac /mnt"
    probe = f't={state.token[:half]!r}{state.token[half:]!r}; grep -rlF -- "$t" {where}; true'
    assert run(endpoint(state), probe, http_timeout=180)["stdout"] == ""


def test_the_guest_reaches_no_network(start_unit: StartFn) -> None:
    state = start_unit()
    probe = (
        "import socket\n"
        "for host, port in (('10.0.2.2', 22), ('10.0.2.2', 80), ('192.0.2.1', 80), ('1.1.1.1', 53)):\n"
        "    try:\n"
        "        socket.create_connection((host, port), timeout=3).close(); print('reached', host)\n"
        "    except OSError as exc:\n"
        "        print('blocked', host, type(exc).__name__)\n"
        "try:\n"
        "    socket.getaddrinfo('deb.debian.org', 80); print('resolved')\n"
        "except OSError:\n"
        "    print('no dns')\n"
    )
    out = run(endpoint(state), f"python3 -c {__import__('shlex').quote(probe)}", http_timeout=120)["stdout"]
    assert "reached" not in out and "resolved" not in out and out.count("blocked") == 4, out


def test_stop_leaves_no_process_overlay_or_socket(start_unit: StartFn) -> None:
    state = start_unit()
    vm = launcher.vm_dir(state.unit_dir)
    assert (vm / "disk.qcow2").is_file() and (vm / "qmp.sock").is_socket()
    info = runtime.inspect(state.sandbox_id)
    assert info is not None and info.running and info in runtime.list_sandboxes()
    assert runtime.stop(state.sandbox_id) is True
    _gone(state)
    assert runtime.inspect(state.sandbox_id) is None and runtime.stop(state.sandbox_id) is False


def test_a_failed_start_leaves_nothing(qemu_disk: QemuDisk, tmp_path: Path) -> None:
    import dataclasses

    spec = dataclasses.replace(spec_for(qemu_disk, restore=False), kernel=tmp_path / "no-such-kernel")
    with pytest.raises(QemuSubstrateError, match=spec.sandbox_id):
        runtime.start(spec)
    assert runtime.inspect(spec.sandbox_id) is None and not runtime.unit_dir_of(spec.sandbox_id).exists()
    assert not any(spec.sandbox_id in " ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))


@pytest.mark.engine
def test_gc_stops_a_guest_no_stack_lists_and_a_killed_save(
    start_unit: StartFn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ale_iac.engine import Engine
    from ale_iac.runner.gc import collect
    from ale_iac.substrates.qemu import saved

    state = start_unit(labels={"stack": "run-gone-stack", "unit": "u0"})
    # The saved states live in the host's shared cache, which any gc (of any home: other tests' too) sweeps;
    # this test's killed save lives where only this process's gc looks.
    states = tmp_path / "states"
    monkeypatch.setattr(saved, "states_dir", lambda: states)
    killed_save = states / ".b-000000000000-999999"  # a saver killed before it started QEMU
    killed_save.mkdir(parents=True)
    assert killed_save in saved.stale_builds()
    report = collect(Engine(), dry_run=True)
    assert state.sandbox_id in report.sandboxes_stopped and runtime.inspect(state.sandbox_id) is not None
    assert killed_save.name in report.sandboxes_stopped and killed_save.exists()
    report = collect(Engine())
    assert state.sandbox_id in report.sandboxes_stopped and killed_save.name in report.sandboxes_stopped
    _gone(state)
    assert not killed_save.exists()


def test_the_unit_folder_is_root_only_but_for_qemu_s_own(start_unit: StartFn) -> None:
    """The unit folder and what the host keeps there are root's; ``vm/`` and all in it are the unprivileged id
    QEMU runs as; nothing is open to anyone else, and nothing the guest planted is a real setuid file, FIFO or
    device node on the host."""
    state = start_unit()
    plant = "cd /mnt/ale-share && echo x > planted && chmod 4755 planted && mkfifo fifo && mknod null c 1 3"
    assert run(endpoint(state), plant)["return_code"] == 0
    vm, qemu = launcher.vm_dir(state.unit_dir), launcher.qemu_uid(state.unit_dir)
    assert qemu != 0 and psutil.Process(state.pid).uids().real == qemu
    for path in [state.unit_dir, *state.unit_dir.rglob("*")]:
        mode, owner = path.lstat().st_mode, path.lstat().st_uid
        assert owner == (qemu if path.is_relative_to(vm) else 0) and mode & 0o077 == 0, (path, owner, oct(mode))
        assert not mode & 0o6000, (path, oct(mode))  # the guest's setuid bit is metadata only (mapped-xattr)
        assert stat.S_ISDIR(mode) or stat.S_ISREG(mode) or stat.S_ISSOCK(mode), path  # no FIFO or device node
    assert {p.name for p in state.unit_dir.iterdir()} <= {"vm", "unit.json", "qemu.log", "token"}


@pytest.mark.engine
def test_a_start_killed_midway_is_found_and_removed_by_gc(qemu_disk: QemuDisk) -> None:
    import json
    import os
    import signal
    import subprocess
    import sys

    from ale_iac.engine import Engine
    from ale_iac.runner.gc import collect

    spec = spec_for(qemu_disk, restore=False, labels={"stack": "run-killed-start", "unit": "u0"})
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from ale_iac.substrates.qemu import runtime\n"
        f"runtime.start(runtime.QemuSandboxSpec(sandbox_id={spec.sandbox_id!r}, disk=Path({str(spec.disk)!r}), "
        f"kernel=Path({str(spec.kernel)!r}), initrd=Path({str(spec.initrd)!r}), restore=False, "
        f"labels={spec.labels!r}))\n"
    )
    starter = subprocess.Popen([sys.executable, "-c", code])
    record = runtime.unit_dir_of(spec.sandbox_id) / "unit.json"
    deadline = time.monotonic() + 120
    try:
        # Killed while the guest boots: QEMU runs, nobody waits for it.
        while not (record.exists() and json.loads(record.read_text()).get("pid")):
            assert time.monotonic() < deadline and starter.poll() is None, "the start never launched QEMU"
            time.sleep(0.05)
    finally:
        starter.send_signal(signal.SIGKILL)
        starter.wait()
    unit_dir = runtime.unit_dir_of(spec.sandbox_id)
    try:
        # At once: the recorded pid may still be the launch script's, before it execs QEMU.
        info = runtime.inspect(spec.sandbox_id)
        assert info is not None and info.running
        report = collect(Engine())
        assert spec.sandbox_id in report.sandboxes_stopped, report
        assert runtime.inspect(spec.sandbox_id) is None
        assert qemu_pids(unit_dir) == []
    finally:
        for pid in qemu_pids(unit_dir):  # a failed check leaves no QEMU behind
            os.kill(pid, signal.SIGKILL)
