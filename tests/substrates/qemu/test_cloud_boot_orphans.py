"""Which cloud disk boots ``gc`` counts as orphaned (``cloud_boot.orphans``), against stand-in processes that
carry a boot's marks on their command line (its ``-name`` and its serial log's path): a boot whose starter
lives is not one; one whose starter is gone, or never wrote its record, is; a boot of another user is never a
normal user's to judge (its folder is unreadable to that user, which once made every live boot of root's look
orphaned to a rootless ``gc``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ale_iac.substrates.qemu import cloud_boot

StandIn = Callable[[Path], subprocess.Popen[bytes]]


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    started: list[subprocess.Popen[bytes]] = []

    def start(guest_dir: Path) -> subprocess.Popen[bytes]:
        guest_dir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-c", "import sys; sys.stdin.read()", "-name", cloud_boot.QEMU_NAME]
        proc = subprocess.Popen([*argv, "-serial", f"file:{guest_dir / 'serial.log'}"], stdin=subprocess.PIPE)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


def _gone_pid() -> int:
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    return int(ended.stdout)


def test_a_boot_is_orphaned_only_when_its_starter_is_gone(stand_in: StandIn, tmp_path: Path) -> None:
    live, dead, unrecorded = tmp_path / "live", tmp_path / "dead", tmp_path / "unrecorded"
    procs = {name: stand_in(folder) for name, folder in (("live", live), ("dead", dead), ("unrecorded", unrecorded))}
    (live / cloud_boot.OWNER).write_text(f"{os.getpid()}\n")
    (dead / cloud_boot.OWNER).write_text(f"{_gone_pid()}\n")

    found = {(pid, folder) for pid, folder in cloud_boot.orphans() if folder.parent == tmp_path}

    assert found == {(procs["dead"].pid, dead), (procs["unrecorded"].pid, unrecorded)}


def test_another_users_boots_are_not_a_normal_users_to_judge(stand_in: StandIn, tmp_path: Path) -> None:
    mine = os.geteuid()
    stand_in(tmp_path / "unrecorded")
    assert [folder for _, folder in cloud_boot.orphans(euid=mine) if folder.parent == tmp_path] == [
        tmp_path / "unrecorded"
    ]
    someone_else = mine + 4242 if mine else 4242
    assert [folder for _, folder in cloud_boot.orphans(euid=someone_else) if folder.parent == tmp_path] == []
