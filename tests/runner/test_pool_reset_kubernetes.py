"""A ``kubernetes`` pool for real: ``pulumi up`` of a pool stack (Pulumi.yaml, its stack file) makes its pods;
a lease that left traces is reset by replacing its pod (``reset: recreate``: ``pulumi up --replace`` of the
pod's URN), and the next lease, through a new port-forward, sees none of them; nothing is left afterwards."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from ale_iac.engine import Engine
from ale_iac.runner.provisioners import Pool
from ale_iac.runner.resets import reset_of
from ale_iac.runner.status import UnitStatus
from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.sandbox.readiness import wait_ready
from tests.support.kube import KubeCluster, objects_of
from tests.support.pools import lease_used_then_reset, plain_pulumi, pool_project

pytestmark = [
    pytest.mark.kubernetes,
    pytest.mark.engine,
    pytest.mark.xdist_group("kubernetes"),
    pytest.mark.timeout(3900),
]

POOL = "pool-kube"


def profile_text(kubeconfig: Path, units: int) -> str:
    return f"""config:
  ale-iac:profile:
    name: {POOL}
    default_snapshot: cpu-free-ubuntu
    ready_timeout_s: 180
    snapshots:
      cpu-free-ubuntu:
        provider: kubernetes
        kubeconfig: {kubeconfig}
        context: ale-iac-kube
        seccomp_localhost: ale-iac/sandbox.json
        reset: recreate
        shape: {{memory_gb: 1}}
  ale-iac:pool:
    units: {units}
"""


def test_a_kubernetes_pool_makes_its_pods_and_a_lease_replaces_one(
    kube_cluster: KubeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = Engine()
    project = pool_project(engine, tmp_path / "project", POOL, profile_text(kube_cluster.kubeconfig, 2))
    monkeypatch.chdir(project)
    plain_pulumi(engine, project, "stack", "init", POOL)
    try:
        plain_pulumi(engine, project, "up", "--yes", "-s", POOL)
        assert sorted(o.split("/")[0] for o in objects_of(kube_cluster, POOL)).count("Pod") == 2
        asyncio.run(_scenario(engine))
    finally:
        plain_pulumi(engine, project, "destroy", "--yes", "-s", POOL)
        plain_pulumi(engine, project, "stack", "rm", "--yes", "-s", POOL)
    assert objects_of(kube_cluster, POOL) == [] and engine.list_stacks() == []


async def _scenario(engine: Engine) -> None:
    pool = Pool.read(engine, POOL)
    assert len(pool.units) == 2
    before = {name: unit.resource_id for name, unit in pool.units.items()}
    assert all(unit.reset == "recreate" and unit.reset_urns[0].endswith("-pod") for unit in pool.units.values())
    second, fresh = await lease_used_then_reset(pool)
    try:
        assert fresh.resource_id not in before.values()  # a new pod (auto-named), reached by a new forward
        log = engine.log_path(POOL).read_text()
        assert "pulumi up --replace" in log and "+-1 replaced" in log
    finally:
        await second.release(UnitStatus.SUCCEEDED, 1.0)
    # One reset on its own, timed: the pod replaced through the engine, then ready through a new forward.
    unit = next(iter(engine.units(POOL).values()))
    reset = reset_of(POOL, unit)
    assert reset is not None
    started = time.monotonic()
    fresh = await asyncio.to_thread(reset, unit)
    replaced_s = time.monotonic() - started
    await wait_ready(SandboxHandle.from_outputs(POOL, fresh), 180)
    assert fresh.resource_id != unit.resource_id
    print(
        f"\n[measure] kubernetes pool reset: pod replaced in {replaced_s:.1f} s, ready "
        f"{time.monotonic() - started:.1f} s after the reset began",
        file=sys.stderr,
    )
