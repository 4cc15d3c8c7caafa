"""The limits of a local sandbox on cgroup v2 (and what ``ale-iac doctor`` predicts of them).

This machine runs cgroup v1 (the v1 path is tested with real sandboxes in ``test_runtime.py``). The v2
path is tested twice: against a real cgroup2 mount the test makes (the kernel's own files; here every
controller is bound to v1, so none is available in it), and against a temporary folder laid out like a
delegated cgroup2 subtree (``fake_cgroupfs``), where the values written can be read back.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ale_iac.substrates.local import cgroups
from ale_iac.substrates.local.cgroups import LimitRecord, Limits, SandboxCgroups

OWN = "/user.slice/user@1000.service/app.slice/run.scope"


def fake_cgroupfs(root: Path, *, delegated: str = "/user.slice/user@1000.service/app.slice") -> Path:
    """A folder laid out like a cgroup2 mount: the root, our own cgroup ``OWN``, and its parent delegated
    with memory, pids and cpu enabled for its children (what systemd's ``Delegate=yes`` gives)."""
    for folder in (root, root / OWN.lstrip("/")):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "cgroup.procs").write_text("")
        (folder / "cgroup.controllers").write_text("cpu memory pids\n")
        (folder / "cgroup.subtree_control").write_text("")
    (root / delegated.lstrip("/")).mkdir(parents=True, exist_ok=True)
    (root / delegated.lstrip("/") / "cgroup.subtree_control").write_text("cpu memory pids\n")
    (root / delegated.lstrip("/") / "cgroup.procs").write_text("")
    return root / delegated.lstrip("/")


def precreate(parent: Path, sandbox: SandboxCgroups, files: tuple[str, ...]) -> Path:
    """The files the kernel would make in the sandbox's new cgroup (a plain mkdir makes none)."""
    folder = parent / sandbox.name
    folder.mkdir()
    for name in files:
        (folder / name).write_text("max\n")
    return folder


def test_v2_limits_go_into_the_delegated_parent_of_a_folder_laid_out_like_cgroupfs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(cgroups.PARENT_ENV, raising=False)
    parent = fake_cgroupfs(tmp_path)
    sandbox = SandboxCgroups("sbx", "/state/sbx", root=tmp_path, own=f"0::{OWN}\n")
    folder = precreate(parent, sandbox, ("memory.max", "memory.swap.max", "pids.max", "cpu.max", "cgroup.procs"))
    sandbox.apply(Limits(memory_gb=1.5, pids_max=300, cpus=1), host_cpus=2)
    records = {record.name: record for record in sandbox.records}
    assert all(record.applied for record in records.values()), records
    assert (folder / "memory.max").read_text() == str(int(1.5 * 2**30))
    assert (folder / "memory.swap.max").read_text() == "0"  # no swap beyond the limit
    assert (folder / "pids.max").read_text() == "300"
    assert (folder / "cpu.max").read_text() == "100000 100000"
    assert "memory.swap.max=0" in records["memory_gb"].detail and str(folder) in records["memory_gb"].detail
    assert sandbox.paths == [folder]
    sandbox.join(4242)
    assert (folder / "cgroup.procs").read_text() == "4242"


def test_v2_without_swap_accounting_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cgroups.PARENT_ENV, raising=False)
    parent = fake_cgroupfs(tmp_path)
    sandbox = SandboxCgroups("sbx", "/state/sbx", root=tmp_path, own=f"0::{OWN}\n")
    precreate(parent, sandbox, ("memory.max",))
    sandbox.apply(Limits(memory_gb=1), host_cpus=2)
    record = sandbox.record("memory_gb")
    assert record is not None and record.applied and "memory.swap.max absent" in record.detail, record


def test_v2_uses_the_cgroup_named_by_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cgroupfs(tmp_path)
    chosen = fake_cgroupfs(tmp_path, delegated="/ale-iac")
    monkeypatch.setenv(cgroups.PARENT_ENV, "/ale-iac")
    assert cgroups.v2_parent(tmp_path, OWN, "/ale-iac") == (chosen, f"{cgroups.PARENT_ENV}=/ale-iac")
    missing, why = cgroups.v2_parent(tmp_path, OWN, "/nowhere")
    assert missing is None and "ALE_IAC_CGROUP=/nowhere: no such cgroup" in why
    monkeypatch.setenv(cgroups.PARENT_ENV, "/nowhere")
    sandbox = SandboxCgroups("sbx", "/state/sbx", root=tmp_path, own=f"0::{OWN}\n")
    sandbox.apply(Limits(memory_gb=1, pids_max=10), host_cpus=2)
    assert [(r.name, r.applied) for r in sandbox.records] == [("memory_gb", False), ("pids_limit", False)]
    assert all("no such cgroup" in r.detail for r in sandbox.records)
    assert sandbox.paths == []


def test_v2_a_parent_that_is_not_delegated_is_reported_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(cgroups.PARENT_ENV, raising=False)
    fake_cgroupfs(tmp_path)
    real_access = cgroups.os.access
    parent = str(tmp_path / OWN.lstrip("/")).rsplit("/", 1)[0]
    monkeypatch.setattr(
        cgroups.os, "access", lambda path, mode: False if str(path).startswith(parent) else real_access(path, mode)
    )
    folder, why = cgroups.v2_parent(tmp_path, OWN)
    assert folder is None and "systemd-run --user --scope -p Delegate=yes" in why, why
    checks = {check.name: check for check in cgroups.host_limits(rootless=True, root=tmp_path, own=f"0::{OWN}\n")}
    assert not checks["limit memory_gb"].ok and not checks["limit memory_gb"].required
    assert "Delegate=yes" in checks["limit memory_gb"].fix
    assert checks["limit pids_limit"].ok and "RLIMIT_NPROC" in checks["limit pids_limit"].detail


def test_pids_fall_back_to_rlimit_nproc_only_when_the_cgroup_was_not_applied() -> None:
    applied = LimitRecord("pids_limit", "100", True, "pids.max=100")
    assert cgroups.nproc_fallback(applied, 100) is None
    refused = LimitRecord("pids_limit", "100", False, "cgroup v1 pids: not writable")
    fallback = cgroups.nproc_fallback(refused, 100)
    assert fallback is not None and fallback.applied and "RLIMIT_NPROC=100" in fallback.detail
    assert "not writable" in fallback.detail  # why the cgroup was not used stays in the record


def test_oom_kills_are_read_from_v1_and_v2_counters(tmp_path: Path) -> None:
    v1, v2, none = tmp_path / "v1", tmp_path / "v2", tmp_path / "none"
    for folder in (v1, v2, none):
        folder.mkdir()
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\noom_group_kill 0\n")
    assert cgroups.memory_oom_kills([none, v1]) == 3
    assert cgroups.memory_oom_kills([v2]) == 2
    assert cgroups.memory_oom_kills([none]) == 0


@contextlib.contextmanager
def cgroup2_mount(target: Path) -> Iterator[Path]:
    target.mkdir()
    done = subprocess.run(["mount", "-t", "cgroup2", "none", str(target)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"the kernel refuses a cgroup2 mount here: {done.stderr.strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True)


@pytest.mark.needs_root
def test_v2_on_a_real_cgroup2_mount(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's own cgroup2 files: the sandbox's cgroup is made, joined and removed for real; each limit
    is applied exactly when its controller is available in the mount (none here: all are bound to v1)."""
    monkeypatch.delenv(cgroups.PARENT_ENV, raising=False)
    with cgroup2_mount(tmp_path / "cgroup2") as root:
        available = set((root / "cgroup.controllers").read_text().split())
        sandbox = SandboxCgroups("real-v2", str(tmp_path), root=root, own="0::/\n")
        sleeper = subprocess.Popen(["sleep", "60"])
        try:
            sandbox.apply(Limits(memory_gb=1, pids_max=64, cpus=1), host_cpus=2)
            for name, controller in cgroups.V1_CONTROLLERS.items():
                record = sandbox.record(name)
                assert record is not None and record.applied == (controller in available), record
                if not record.applied:
                    assert f"the {controller} controller is not available" in record.detail
            folder = root / sandbox.name
            assert sandbox.paths == [folder] and (folder / "cgroup.procs").is_file()  # made by the kernel
            sandbox.join(sleeper.pid)
            assert Path(f"/proc/{sleeper.pid}/cgroup").read_text().count(f"0::/{sandbox.name}") == 1
        finally:
            sleeper.kill()
            sleeper.wait()
            cgroups.remove(sandbox.paths, "real-v2")
        assert not (root / sandbox.name).exists()
