"""How the host tells a unit's QEMU (or the launch script that becomes it) from every other process.

A unit's recorded pid is the launch script's until the script execs QEMU (through setpriv). A start whose
starter was killed in that window must still count as running, or ``ale-iac gc`` would pass over a QEMU that
appears a moment later (``test_runtime.py`` kills a real start; these pin the rule on command lines).
"""

from __future__ import annotations

from pathlib import Path

from ale_iac.substrates.qemu import launcher


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
