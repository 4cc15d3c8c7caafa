"""A qemu pool unit is reset between leases: its guest restored again from the saved memory state onto a
fresh overlay under the same sandbox id (the same Pulumi resource), with a new token and machine-id; nothing
of one task is visible to the next, also after a holder died. One guest at a time (TCG on 2 cores)."""

from __future__ import annotations

import stat

import psutil
import pytest

from ale_iac.engine import Engine
from ale_iac.profile import resolve_profile
from ale_iac.runner.provisioners import Pool
from ale_iac.runner.status import UnitStatus
from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.substrates.qemu import runtime
from ale_iac.substrates.qemu.disk import QemuDisk
from ale_iac.substrates.qemu.launcher import qemu_pids
from tests.substrates.qemu.conftest import qemu_disk
from tests.support.pools import ALL_TRACES, lease, lease_after_a_dead_holder, leave_traces, on_a_pool, traces

__all__ = ["qemu_disk"]
pytestmark = [pytest.mark.qemu, pytest.mark.engine, pytest.mark.timeout(1500), pytest.mark.xdist_group("qemu")]

POOL = "pool-reset-qemu"


async def _identity(handle: SandboxHandle) -> tuple[str, str]:
    async with handle.client() as client:
        hostname, machine_id = (await client.run_command("hostname; cat /etc/machine-id")).stdout.split()
    return hostname, machine_id


def test_a_qemu_pool_unit_is_restored_afresh_at_each_lease(qemu_disk: QemuDisk) -> None:
    on_a_pool(POOL, resolve_profile("qemu").profile, _scenario)
    assert runtime.list_sandboxes() == []
    assert not [p for p in psutil.process_iter(["cmdline"]) if POOL in " ".join(p.info["cmdline"] or [])]


async def _scenario(engine: Engine) -> None:
    pool = Pool.read(engine, POOL)
    [created] = pool.units.values()
    assert created.reset == "restore" and created.transport == "qemu"
    sandbox_id = created.resource_id

    first, handle_a, _ = await lease(pool, lease_timeout_s=30)
    identity_a = await _identity(handle_a)
    pid_a = runtime.inspect(sandbox_id).record["pid"]  # type: ignore[union-attr]
    await leave_traces(handle_a)
    assert await traces(handle_a) == ALL_TRACES
    assert await first.release(UnitStatus.SUCCEEDED, 1.0) == "unit reset, lease released"

    second, handle_b, record_b = await lease(pool, lease_timeout_s=30)
    assert record_b.names == ["leased"]
    assert handle_b.resource_id == sandbox_id
    assert (handle_b.endpoint, handle_b.token()) != (handle_a.endpoint, handle_a.token())
    assert await traces(handle_b) == []
    hostname_b, machine_id_b = await _identity(handle_b)
    assert hostname_b == identity_a[0] == sandbox_id and machine_id_b != identity_a[1]
    info = runtime.inspect(sandbox_id)
    assert info is not None and info.running and info.record["pid"] != pid_a
    assert info.record.get("saved_state"), "the reset unit was not restored from the saved state"
    assert not psutil.pid_exists(pid_a) or psutil.Process(pid_a).status() == psutil.STATUS_ZOMBIE
    # The new token: in the 0600 file of the 0700 unit folder, on no command line.
    token_file = info.unit_dir / runtime.TOKEN_FILE
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600 and stat.S_IMODE(info.unit_dir.stat().st_mode) == 0o700
    token = handle_b.token()
    assert token and token_file.read_text() == token
    assert not any(token in " ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))
    assert token not in (info.unit_dir / runtime.UNIT_FILE).read_text()
    assert token not in engine.log_path(POOL).read_text()

    # A holder that died before its reset: the next lease resets first.
    third, handle_c, _ = await lease_after_a_dead_holder(pool, second, handle_b, lease_timeout_s=30)
    await third.release(UnitStatus.SUCCEEDED, 1.0)
    [now] = engine.units(POOL).values()
    assert now.endpoint != handle_c.endpoint and now.resource_id == sandbox_id
    assert len(qemu_pids(runtime.unit_dir_of(sandbox_id))) == 1
