"""A pool unit is reset between leases: nothing of one task is visible to the next."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from ale_iac.engine import Engine
from ale_iac.infra.program import inline_program, pool_units
from ale_iac.profile import PoolSpec, resolve_profile
from ale_iac.runner.leases import dirty_marker
from ale_iac.runner.provisioners import Pool, PoolProvisioner
from ale_iac.runner.status import UnitStatus
from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.sandbox.readiness import wait_ready
from ale_iac.substrates.local import runtime as local_runtime

pytestmark = [pytest.mark.sandbox, pytest.mark.engine, pytest.mark.timeout(420)]

POOL = "pool-reset"
SECRET = "left-by-task-a-7f3e"


class _Record:
    """What a provisioner writes to a unit's record: its events."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def event(self, name: str, **fields: Any) -> None:
        self.events.append((name, fields))


async def _lease(pool: Pool) -> tuple[PoolProvisioner, SandboxHandle, _Record]:
    provisioner = PoolProvisioner(pool, lease_timeout_s=5)
    record = _Record()
    task = SimpleNamespace(task=SimpleNamespace(card=SimpleNamespace(snapshot=None)))
    handle = await provisioner.acquire(task, record)  # type: ignore[arg-type]  # the plan's snapshot only
    await wait_ready(handle, provisioner.ready_timeout_s)
    return provisioner, handle, record


async def _leave_traces(handle: SandboxHandle) -> None:
    async with handle.client() as client:
        await client.write_text(f"{handle.paths.home}/{SECRET}.txt", SECRET)
        started = await client.run_command(f"setsid sh -c 'sleep 86400; :' {SECRET} </dev/null >/dev/null 2>&1 &")
        assert started.exit_code == 0, started.stderr
        await client.set_clipboard(SECRET)


async def _traces(handle: SandboxHandle) -> list[str]:
    """What of ``_leave_traces`` this unit shows (all three on the unit that left them)."""
    found = []
    async with handle.client() as client:
        if await client.file_exists(f"{handle.paths.home}/{SECRET}.txt"):
            found.append("file in home")
        # "[a]": the pattern does not match the shell that runs pgrep.
        pattern = SECRET.replace("task-a", "task-[a]")
        if (await client.run_command(f"pgrep -f -- '{pattern}'")).exit_code == 0:
            found.append("process")
        if await client.get_clipboard() == SECRET:
            found.append("clipboard")
    return found


def test_a_pool_unit_is_clean_at_each_lease_also_after_a_holder_died() -> None:
    engine = Engine()
    profile = resolve_profile("local").profile
    engine.up(POOL, inline_program(profile, pool_units(PoolSpec(units=1), POOL), POOL))
    try:
        asyncio.run(_scenario(engine))
    finally:
        engine.destroy(POOL)
    assert local_runtime.list_sandboxes() == []


async def _scenario(engine: Engine) -> None:
    # Read once, as a run does: each lease still gets the unit's current endpoint and token.
    pool = Pool.read(engine, POOL)
    [created] = pool.units.values()

    first, handle_a, _ = await _lease(pool)
    await _leave_traces(handle_a)
    assert await _traces(handle_a) == ["file in home", "process", "clipboard"]
    assert dirty_marker(POOL, "u0", pool.records).exists()
    assert await first.release(UnitStatus.SUCCEEDED, 1.0) == "unit reset, lease released"
    assert not dirty_marker(POOL, "u0", pool.records).exists()

    second, handle_b, record_b = await _lease(pool)
    # The same unit and resource (a pool has one here), but a fresh sandbox: new endpoint and token.
    assert handle_b.unit == "u0" and handle_b.resource_id == created.resource_id
    assert (handle_b.endpoint, handle_b.token()) != (handle_a.endpoint, handle_a.token())
    assert [name for name, _ in record_b.events] == ["leased"]
    assert await _traces(handle_b) == []
    # The old endpoint is gone with its sandbox.
    assert [s.endpoint for s in local_runtime.list_sandboxes()] == [handle_b.endpoint]

    # A holder that dies before its reset (the kernel drops its lock, the marker stays): the next
    # lease resets the unit before handing it out.
    await _leave_traces(handle_b)
    assert second.lease is not None
    second.lease.release()
    third, handle_c, record_c = await _lease(pool)
    try:
        assert [name for name, _ in record_c.events] == ["reset", "leased"]
        assert await _traces(handle_c) == []
    finally:
        await third.release(UnitStatus.SUCCEEDED, 1.0)
    # The stack's own view follows the resets (what `ale-iac mcp --stack` and `sandbox env` read).
    [now] = engine.units(POOL).values()
    assert now.endpoint == local_runtime.list_sandboxes()[0].endpoint != handle_c.endpoint
