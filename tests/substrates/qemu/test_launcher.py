"""How the host tells a unit's QEMU (or the launch script that becomes it) from every other process.

A unit's recorded pid is the launch script's until the script execs QEMU (through setpriv). A start whose
starter was killed in that window must still count as running, or ``ale-iac gc`` would pass over a QEMU that
appears a moment later (``test_runtime.py`` kills a real start; these pin the rule on command lines). And how it
stops one that another process started.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from ale_iac.substrates.qemu import launcher

NEVER_REAPS = (
    "import subprocess, sys; child = subprocess.Popen(sys.argv[1:]); print(child.pid, flush=True); sys.stdin.read()"
)
"""A parent that starts its arguments as a child, prints the child's pid and never reaps it (until its stdin
closes and it exits)."""


def script(unit: Path) -> list[str]:
    """The launch script's command line as ``launcher.start`` makes it, for the host runner."""
    return ["/bin/sh", str(launcher.LAUNCH_SCRIPT), "--unit-dir", str(unit), "--base", "/b", "--port", "1"]


def test_the_launch_script_counts_as_its_units_qemu_before_it_execs(tmp_path: Path) -> None:
    unit = tmp_path / "u"
    assert launcher._names_unit(script(unit), unit)
    assert not launcher._names_unit(script(unit), tmp_path / "u2")
    assert not launcher._names_unit(script(tmp_path / "u2"), unit)
    assert not launcher._names_unit(script(unit), tmp_path)  # a folder above the unit's is not it
    assert not launcher._names_unit(["/bin/sh", "/elsewhere/launch.sh", "--unit-dir", str(unit)], unit)
    assert not launcher._names_unit(["/bin/sh", str(launcher.LAUNCH_SCRIPT), "--unit-dir"], unit)


def test_qemus_own_command_line_names_its_unit_by_the_marker(tmp_path: Path) -> None:
    unit = tmp_path / "a,b"
    cmdline = ["qemu-system-x86_64", "-name", f"guest=ale:{str(unit).replace(',', ',,')},process=ale-qemu"]
    assert launcher._names_unit(cmdline, unit)
    assert not launcher._names_unit(cmdline, tmp_path / "a")


@pytest.mark.timeout(120)
def test_a_qemu_another_process_started_is_stopped_without_waiting_for_its_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A unit's QEMU is often another process's child (the engine's provider process made the unit; a run's
    reset, or ``destroy`` after one, stops it): once it exits it stays a zombie until that parent reaps it.
    The stop must count it as gone then. With both of ``kill``'s waits an hour long, it returns only if it
    does not wait for the zombie to disappear (it waited 5 s on every such stop)."""
    unit = tmp_path / "u"
    monkeypatch.setattr(launcher, "STOP_GRACE_S", 3600.0)
    monkeypatch.setattr(launcher, "KILL_WAIT_S", 3600.0)
    stand_in = [sys.executable, "-c", "import time; time.sleep(3600)", "-name", launcher.name_marker(unit) + "x"]
    parent = subprocess.Popen(
        [sys.executable, "-c", NEVER_REAPS, *stand_in], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert parent.stdin is not None and parent.stdout is not None
    try:
        pid = int(parent.stdout.readline())
        assert launcher.qemu_alive(pid, unit)
        launcher.kill(launcher.Launched("host", pid=pid), unit)
        assert not launcher.qemu_alive(pid, unit)
        assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # its parent has still not reaped it
    finally:
        parent.stdin.close()
        parent.wait(30)


def test_a_unit_read_while_its_launch_script_execs_still_counts_as_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """During an exec the kernel shows a process's command line empty for a moment (the launch script execs
    setpriv, which execs QEMU); read then, the unit must not look stopped (gc would remove a starting unit)."""
    unit = tmp_path / "u"
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *script(unit)[1:]])
    try:
        reads = iter([[], [], script(unit)])  # empty twice, as mid-exec, then its own
        monkeypatch.setattr(psutil.Process, "cmdline", lambda _self: next(reads))
        assert launcher.qemu_alive(stand_in.pid, unit)
        monkeypatch.setattr(psutil.Process, "cmdline", lambda _self: [])  # a kernel thread's: empty for good
        monkeypatch.setattr(launcher, "EXEC_SETTLE_S", 0.05)
        assert not launcher.qemu_alive(stand_in.pid, unit)
    finally:
        stand_in.kill()
        stand_in.wait()
