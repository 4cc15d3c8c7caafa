"""Checkpointed local sandboxes: dumped once, ready and untouched, and restored at every reset (real CRIU).

What a hostile agent must not reach from inside a restored sandbox is in ``tests/substrates/test_isolation.py``
(the ``local-checkpoint`` unit); a pool of such units through the engine in ``tests/runner/test_pool_reset.py``.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from ale_iac import procs
from ale_iac.images import ImageInfo
from ale_iac.substrates.local import checkpoint
from ale_iac.substrates.local import runtime as local_runtime
from ale_iac.substrates.local import sandboxes as local_sandboxes
from ale_iac.substrates.local.host import MODE_ROOTLESS
from ale_iac.substrates.local.sandboxes import LocalSandboxSpec, LocalSandboxState, SandboxError
from tests.support.lease_traces import LEASE_MARKS, lease_traces, leave_a_lease_behind
from tests.support.sandbox import (
    assert_nothing_left,
    cmd,
    listening_addresses,
    new_sandbox_id,
    run,
    wait_for_status,
)


@pytest.fixture
def checkpointed(desktop_image: ImageInfo, tmp_path: Path) -> Iterator[LocalSandboxState]:
    """A checkpointed sandbox, stopped (checkpoint and all) after the test, which must leave nothing."""
    spec = LocalSandboxSpec(
        sandbox_id=new_sandbox_id("ckpt"), rootfs=str(desktop_image.rootfs), memory_gb=1.0, checkpoint=True
    )
    home = tmp_path / "home"
    state = local_runtime.start(spec, home=home)
    pids = local_sandboxes.sandbox_pids(state)
    try:
        yield state
    finally:
        now = local_sandboxes.load_state(spec.sandbox_id, home=home)
        local_runtime.stop(spec.sandbox_id, home=home)  # a test may have seen it go already
        assert_nothing_left(now or state, pids)
        assert not (home / "sandboxes" / spec.sandbox_id).exists()


@pytest.mark.criu
def test_a_reset_restores_the_checkpoint_with_nothing_of_the_lease(checkpointed: LocalSandboxState) -> None:
    home = Path(checkpointed.state_dir).parent.parent
    assert checkpointed.restored  # the first start dumps the booted sandbox, then runs a restore of it
    saved = Path(checkpointed.state_dir) / checkpoint.CHECKPOINT_DIR
    assert (saved / checkpoint.META_FILE).is_file() and (saved / checkpoint.IMAGES / "pstree.img").is_file()
    assert Path(checkpointed.state_dir).stat().st_mode & 0o077 == 0  # the state dir keeps it from other users
    wait_for_status(checkpointed)
    current = checkpointed
    for _ in range(2):  # every reset restores the same checkpoint
        leave_a_lease_behind(current)
        assert lease_traces(current) == [*LEASE_MARKS, "process", "clipboard"]
        old_pids, old_token = local_sandboxes.sandbox_pids(current), local_sandboxes.auth_token(current)
        fresh = local_runtime.reset(current.sandbox_id, home=home)
        assert fresh.restored and fresh.state_dir == current.state_dir
        assert not [pid for pid in old_pids if procs.start_time(pid) is not None]
        assert not listening_addresses(current.host_port)
        assert fresh.host_port != current.host_port and local_sandboxes.auth_token(fresh) != old_token
        refused = httpx.post(
            f"{fresh.endpoint}/cmd", json={"command": "version"}, headers={"Authorization": f"Bearer {old_token}"}
        )
        assert refused.status_code == 401
        wait_for_status(fresh)
        assert lease_traces(fresh) == []
        # The desktop works as a booted one does: a command, a screenshot, its logs still written.
        assert run(fresh, "cat /proc/1/cmdline | tr '\\0' ' '")["stdout"].startswith("/usr/bin/python3 ")
        assert cmd(fresh, "screenshot", {}).get("image_data")
        assert fresh.init_pid is not None and Path(f"/proc/{fresh.init_pid}/cgroup").read_text().count(
            fresh.sandbox_id
        ) == len(fresh.cgroups)
        current = fresh


@pytest.mark.criu
def test_a_restored_sandbox_dies_with_its_supervisor(checkpointed: LocalSandboxState) -> None:
    wait_for_status(checkpointed)
    assert checkpointed.init_pid is not None
    assert psutil.Process(checkpointed.init_pid).ppid() == checkpointed.supervisor_pid  # CRIU's sibling: its child
    os.kill(checkpointed.supervisor_pid, signal.SIGKILL)
    assert procs.wait_gone(checkpointed.init_pid, checkpointed.init_start_time, 10)


@pytest.mark.criu
def test_a_checkpoint_that_does_not_restore_is_made_anew_by_a_boot(checkpointed: LocalSandboxState) -> None:
    """A damaged checkpoint (or one CRIU or the kernel no longer takes) costs one boot, not the unit."""
    home = Path(checkpointed.state_dir).parent.parent
    saved = Path(checkpointed.state_dir) / checkpoint.CHECKPOINT_DIR
    (saved / checkpoint.IMAGES / "inventory.img").unlink()
    fresh = local_runtime.reset(checkpointed.sandbox_id, home=home)
    assert fresh.restored and (saved / checkpoint.IMAGES / "inventory.img").is_file()  # a new checkpoint
    log = (Path(fresh.state_dir) / local_sandboxes.LOGS_DIR / local_sandboxes.SUPERVISOR_LOG).read_text()
    assert "[reset] the checkpoint did not restore, so the unit booted afresh" in log
    assert "criu restore failed (1): Error" in log and "Unexpected EOF" in log
    wait_for_status(fresh)
    assert run(fresh, "echo ok")["stdout"] == "ok\n"
    assert local_runtime.reset(checkpointed.sandbox_id, home=home).restored  # the new checkpoint restores


@pytest.mark.sandbox
def test_a_checkpoint_is_refused_before_anything_is_made(
    desktop_image: ImageInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    outbound = LocalSandboxSpec(
        sandbox_id="ckpt-outbound", rootfs=str(desktop_image.rootfs), allow_outbound=True, checkpoint=True
    )
    with pytest.raises(SandboxError, match="cannot have outbound network"):
        local_runtime.start(outbound, home=home)
    no_root = LocalSandboxSpec(sandbox_id="ckpt-rootless", rootfs=str(desktop_image.rootfs), checkpoint=True)
    with monkeypatch.context() as rootless:
        rootless.setattr(local_runtime, "host_mode", lambda: MODE_ROOTLESS)
        with pytest.raises(SandboxError, match=r"checkpoints need root \(CRIU restores namespaces\)"):
            local_runtime.start(no_root, home=home)
    monkeypatch.setenv("ALE_IAC_CRIU", str(tmp_path / "no-criu"))
    no_criu = LocalSandboxSpec(sandbox_id="ckpt-no-criu", rootfs=str(desktop_image.rootfs), checkpoint=True)
    with pytest.raises(SandboxError, match=r"ALE_IAC_CRIU=.* is not an executable file"):
        local_runtime.start(no_criu, home=home)
    assert not (home / "sandboxes").exists() or list((home / "sandboxes").iterdir()) == []


# --- which CRIU (no sandbox: fake executables) -----------------------------------------------------------


def _fake_criu(folder: Path, version: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "criu"
    path.write_text(f"#!/bin/sh\n[ \"$1\" = --version ] && echo 'Version: {version}' && exit 0\necho 'Looks good.'\n")
    path.chmod(0o755)
    return path


def test_criu_is_the_override_then_the_fetched_copy_then_a_recent_one_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ALE_IAC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("ALE_IAC_CRIU", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    with pytest.raises(checkpoint.CheckpointError, match=r"no CRIU: run scripts/criu\.sh fetch"):
        checkpoint.criu_command()
    old = _fake_criu(tmp_path / "bin", "3.17.1")
    with pytest.raises(checkpoint.CheckpointError, match=rf"{old} is CRIU 3\.17; checkpoints need 4\.2 or later"):
        checkpoint.criu_command()
    assert checkpoint.criu_status() == (
        False,
        f"{old} is CRIU 3.17; checkpoints need 4.2 or later (scripts/criu.sh fetch)",
    )
    recent = _fake_criu(tmp_path / "bin", "4.2")
    assert checkpoint.criu_command() == [str(recent)]
    assert checkpoint.criu_status() == (True, f"CRIU 4.2 ({recent}): criu check passes")
    fetched = _fake_criu(tmp_path / "cache" / "criu" / "current", "4.2")  # what scripts/criu.sh writes there
    assert checkpoint.criu_command() == [str(fetched)]
    override = _fake_criu(tmp_path / "override", "4.3")
    monkeypatch.setenv("ALE_IAC_CRIU", str(override))
    assert checkpoint.criu_command() == [str(override)]
