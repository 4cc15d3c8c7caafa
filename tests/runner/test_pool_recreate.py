"""``reset: recreate``: a pool unit recreated between leases through the real Pulumi engine (``pulumi up
--replace URN --target URN`` with the pool's own program, Pulumi.yaml and its stack file), here on a local
unit (cloud plugins cannot be installed here; the clouds' default is checked under mocks in test_resets.py).
Nothing of one task is visible to the next, also after a holder died; nothing is left afterwards."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ale_iac.engine import Engine
from ale_iac.runner.provisioners import Pool
from ale_iac.runner.status import UnitStatus
from ale_iac.substrates.local import sandboxes as local_sandboxes
from tests.support.pools import (
    lease_after_a_dead_holder,
    lease_used_then_reset,
    plain_pulumi,
    pool_project,
)

pytestmark = [pytest.mark.sandbox, pytest.mark.engine, pytest.mark.timeout(480)]

POOL = "pool-recreate"
PROFILE = f"""config:
  ale-iac:profile:
    name: {POOL}
    default_snapshot: cpu-free-ubuntu
    ready_timeout_s: 120
    snapshots:
      cpu-free-ubuntu:
        provider: local
        image: desktop
        reset: recreate
        shape: {{vcpus: 1, memory_gb: 2}}
  ale-iac:pool:
    units: 1
"""


def test_a_recreate_pool_unit_is_a_new_resource_at_each_lease(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine()
    project = pool_project(engine, tmp_path / "project", POOL, PROFILE)
    monkeypatch.chdir(project)  # a run of the pool from the checkout that brought it up

    plain_pulumi(engine, project, "stack", "init", POOL)
    try:
        plain_pulumi(engine, project, "up", "--yes", "-s", POOL)
        asyncio.run(_scenario(engine))
    finally:
        plain_pulumi(engine, project, "destroy", "--yes", "-s", POOL)
        plain_pulumi(engine, project, "stack", "rm", "--yes", "-s", POOL)
    assert local_sandboxes.list_sandboxes() == [] and engine.list_stacks() == []


async def _scenario(engine: Engine) -> None:
    pool = Pool.read(engine, POOL)
    [created] = pool.units.values()
    assert created.reset == "recreate"
    assert created.reset_urns == [f"urn:pulumi:{POOL}::ale-iac::pulumi-python:dynamic/ale:LocalSandbox::u0"]

    # A new resource (a new sandbox id), its outputs from the stack: the run read the old ones.
    second, handle_b = await lease_used_then_reset(pool)
    assert handle_b.resource_id != created.resource_id and handle_b.reset_urns == created.reset_urns
    assert [s.sandbox_id for s in local_sandboxes.list_sandboxes()] == [handle_b.resource_id]
    log = engine.log_path(POOL).read_text()
    assert "pulumi up --replace" in log and "+-1 replaced" in log

    # A holder that died before its reset: the next lease recreates the unit first.
    third, handle_c, _ = await lease_after_a_dead_holder(pool, second, handle_b)
    try:
        assert handle_c.resource_id not in (created.resource_id, handle_b.resource_id)
    finally:
        await third.release(UnitStatus.SUCCEEDED, 1.0)
    [now] = engine.units(POOL).values()
    assert [s.sandbox_id for s in local_sandboxes.list_sandboxes()] == [now.resource_id] != [handle_c.resource_id]
