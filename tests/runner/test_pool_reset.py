"""A pool unit is reset between leases: nothing of one task is visible to the next (local units; the docker
and qemu units' own modules, and ``reset: recreate`` in test_pool_recreate.py)."""

from __future__ import annotations

import functools

import pytest

from ale_iac.engine import Engine
from ale_iac.profile import LocalRoute, resolve_profile
from ale_iac.runner.provisioners import Pool
from ale_iac.runner.status import UnitStatus
from ale_iac.substrates.local import sandboxes as local_sandboxes
from tests.support.pools import lease_after_a_dead_holder, lease_used_then_reset, on_a_pool

pytestmark = [pytest.mark.sandbox, pytest.mark.engine, pytest.mark.timeout(420)]

POOL = "pool-reset"


@pytest.mark.parametrize("checkpoint", [False, pytest.param(True, marks=pytest.mark.criu)], ids=["boot", "checkpoint"])
def test_a_pool_unit_is_clean_at_each_lease_also_after_a_holder_died(checkpoint: bool) -> None:
    """Also with ``checkpoint: true``, where every reset is a CRIU restore of the unit's first, untouched boot."""
    profile = resolve_profile("local").profile
    route = profile.snapshots[profile.default_snapshot]
    assert isinstance(route, LocalRoute)
    routes = {profile.default_snapshot: route.model_copy(update={"checkpoint": checkpoint})}
    on_a_pool(POOL, profile.model_copy(update={"snapshots": routes}), functools.partial(_scenario, checkpoint))
    assert local_sandboxes.list_sandboxes() == []


async def _scenario(checkpoint: bool, engine: Engine) -> None:
    # Read once, as a run does: each lease still gets the unit's current endpoint and token.
    pool = Pool.read(engine, POOL)
    [created] = pool.units.values()
    assert created.reset == "restore"
    [sandbox] = local_sandboxes.list_sandboxes()
    assert sandbox.restored is checkpoint

    second, handle_b = await lease_used_then_reset(pool)
    # The same unit and resource (a pool has one here), but a fresh sandbox: new endpoint and token.
    assert handle_b.unit == "u0" and handle_b.resource_id == created.resource_id
    # The old endpoint is gone with its sandbox.
    assert [s.endpoint for s in local_sandboxes.list_sandboxes()] == [handle_b.endpoint]

    third, handle_c, _ = await lease_after_a_dead_holder(pool, second, handle_b)
    await third.release(UnitStatus.SUCCEEDED, 1.0)
    # The stack's own view follows the resets (what `ale-iac mcp --stack` and `sandbox env` read).
    [now] = engine.units(POOL).values()
    [sandbox] = local_sandboxes.list_sandboxes()
    assert now.endpoint == sandbox.endpoint != handle_c.endpoint
    assert sandbox.restored is checkpoint
