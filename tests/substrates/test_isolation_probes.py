"""The substrates' isolation probes without a unit: check names, and the pids cgroup on cgroup v1 and v2."""

from __future__ import annotations

from pathlib import Path

import pytest

from ale_iac.substrates import isolation
from ale_iac.substrates.docker.isolation import NOT_APPLICABLE as DOCKER_NOT_APPLICABLE
from ale_iac.substrates.qemu.isolation import NOT_APPLICABLE as QEMU_NOT_APPLICABLE


def _tree(root: Path, cgroup: str, files: dict[str, str]) -> tuple[Path, Path]:
    proc, sysfs = root / "proc", root / "cgroup"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "cgroup").write_text(cgroup)
    for name, text in files.items():
        (sysfs / name).parent.mkdir(parents=True, exist_ok=True)
        (sysfs / name).write_text(text)
    return proc, sysfs


def test_pids_current_on_cgroup_v1_with_either_driver(tmp_path: Path) -> None:
    for driver_path in ("/docker/abc", "/system.slice/docker-abc.scope"):
        root = tmp_path / driver_path.replace("/", "_")
        cgroup = f"12:memory:{driver_path}\n5:pids:{driver_path}\n1:name=systemd:{driver_path}\n0::/\n"
        proc, sysfs = _tree(root, cgroup, {f"pids{driver_path}/pids.current": "17\n"})
        assert isolation.pids_current(42, proc, sysfs) == 17


def test_pids_current_on_cgroup_v2_and_on_a_hybrid_host(tmp_path: Path) -> None:
    proc, sysfs = _tree(tmp_path / "v2", "0::/system.slice/docker-abc.scope\n", {
        "cgroup.procs": "", "system.slice/docker-abc.scope/pids.current": "9\n",
    })  # fmt: skip
    assert isolation.pids_current(42, proc, sysfs) == 9
    proc, sysfs = _tree(tmp_path / "hybrid", "3:cpu:/x\n0::/docker/abc\n", {
        "unified/cgroup.procs": "", "unified/docker/abc/pids.current": "4\n",
    })  # fmt: skip
    assert isolation.pids_current(42, proc, sysfs) == 4


def test_no_pids_cgroup_is_an_error_not_a_zero(tmp_path: Path) -> None:
    proc, sysfs = _tree(tmp_path, "4:memory:/docker/abc\n", {})
    with pytest.raises(FileNotFoundError):
        isolation.pids_current(42, proc, sysfs)


def test_every_reason_names_a_known_check_and_a_typo_is_refused() -> None:
    assert len(set(isolation.CHECKS)) == len(isolation.CHECKS)
    for reasons in (DOCKER_NOT_APPLICABLE, QEMU_NOT_APPLICABLE):
        assert set(reasons) <= set(isolation.CHECKS) and all(reasons.values())
    with pytest.raises(KeyError):
        isolation.unknown_check("no-such-check")
