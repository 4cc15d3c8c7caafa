"""A docker pool unit is reset between leases: a new container, volumes and network under the same sandbox id
(the same Pulumi resource); nothing of one task is visible to the next, also after a holder died."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from ale_iac.engine import Engine
from ale_iac.paths import home_id
from ale_iac.profile import resolve_profile
from ale_iac.runner.provisioners import Pool
from ale_iac.runner.status import UnitStatus
from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.substrates.docker import runtime
from tests.support.pools import lease_after_a_dead_holder, lease_used_then_reset, on_a_pool

pytestmark = [pytest.mark.docker, pytest.mark.engine, pytest.mark.timeout(420)]

POOL = "pool-reset-docker"


def _objects(sandbox_id: str) -> dict[str, list[str]]:
    """The engine objects of a unit, by kind: their ids."""
    client = runtime.client()
    label = {"label": [f"{runtime.LABEL_SANDBOX}={sandbox_id}"]}
    try:
        return {
            "containers": sorted(str(c.id) for c in client.containers.list(all=True, filters=label)),
            "networks": sorted(str(n.id) for n in client.networks.list(filters=label)),
            "volumes": sorted(str(v.attrs["CreatedAt"]) + str(v.name) for v in client.volumes.list(filters=label)),
        }
    finally:
        client.close()


def _inspect_text(container_id: str) -> str:
    client = runtime.client()
    try:
        return json.dumps(client.api.inspect_container(container_id))
    finally:
        client.close()


def _units_left() -> list[str]:
    """This home's docker units' engine objects (another test's, or another home's, are not this test's)."""
    client = runtime.client()
    label = {"label": [f"{runtime.LABEL_KIND}={runtime.KIND}", f"{runtime.LABEL_HOME}={home_id()}"]}
    try:
        return [
            *(f"container {c.name}" for c in client.containers.list(all=True, filters=label)),
            *(f"network {n.name}" for n in client.networks.list(filters=label)),
            *(f"volume {v.name}" for v in client.volumes.list(filters=label)),
        ]
    finally:
        client.close()


def test_a_docker_pool_unit_is_a_new_container_at_each_lease(docker_image: str) -> None:
    on_a_pool(POOL, resolve_profile("docker").profile, _scenario)
    assert _units_left() == []


async def _scenario(engine: Engine) -> None:
    pool = Pool.read(engine, POOL)
    [created] = pool.units.values()
    assert created.reset == "restore" and created.transport == "docker"
    before = _objects(created.resource_id)

    second, handle_b = await lease_used_then_reset(pool)
    assert handle_b.resource_id == created.resource_id
    after = _objects(created.resource_id)
    # Nothing of the old unit's engine objects is left: a new container, network and four new volumes.
    assert len(after["containers"]) == 1 and len(after["networks"]) == 1 and len(after["volumes"]) == 4
    for kind in ("containers", "networks", "volumes"):
        assert not set(before[kind]) & set(after[kind]), f"{kind} survived the reset"
    # The bulk transport follows the new container; the token is in none of its configuration.
    assert handle_b.container_id == after["containers"][0] != created.container_id
    token = handle_b.token()
    assert token and token not in _inspect_text(after["containers"][0])
    assert token not in engine.log_path(POOL).read_text()
    await _bulk_transport_works(handle_b)

    # A holder that died before its reset: the next lease resets first.
    third, handle_c, _ = await lease_after_a_dead_holder(pool, second, handle_b)
    await third.release(UnitStatus.SUCCEEDED, 1.0)
    # The stack's own view follows the resets.
    [now] = engine.units(POOL).values()
    assert now.container_id == _objects(created.resource_id)["containers"][0] != handle_c.container_id
    assert now.endpoint != handle_c.endpoint


async def _bulk_transport_works(handle: SandboxHandle) -> None:
    """The archive transport reaches the new container (by the handle's container id)."""
    assert handle.container_id is not None
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "probe.txt").write_text("probe")
        assert runtime.copy_in(handle.container_id, Path(folder), f"{handle.paths.home}/bulk") == 1
    async with handle.client() as client:
        assert await client.read_text(f"{handle.paths.home}/bulk/probe.txt") == "probe"


def test_a_shared_stack_run_on_the_docker_profile_gives_each_unit_a_new_container(tmp_path: Path) -> None:
    """Three units at -j 1 on one docker unit of a shared stack: each finds none of the files the unit before it
    left (a new container, volumes and network each time), and nothing is left after the run."""
    from ale_iac.runner.evaluation import run_experiment
    from ale_iac.runner.experiment import load_experiment
    from tests.support.tasks import make_clean_slate_task, make_preset

    make_clean_slate_task(tmp_path, "clean-slate")
    make_preset(tmp_path, "writer", "WriterAgent")
    spec = {"name": "t", "agents": ["writer.yaml"], "tasks": ["clean-slate"], "repeats": 3, "profile": "docker"}
    path = tmp_path / "exp.yaml"
    path.write_text(json.dumps({**spec, "shared_stack": True}))
    summary = run_experiment(load_experiment(path))
    assert [(o.status, o.score) for o in summary.outcomes] == [("succeeded", 1.0)] * 3, summary.outcomes
    assert {o.cleanup for o in summary.outcomes} == {"unit reset, lease released"}
    assert Engine().list_stacks() == []
    assert runtime.list_sandboxes() == []  # this home's units
