"""A static profile: one unit per endpoint, leased like a pool's units (no stack)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from ale_iac.engine import Engine
from ale_iac.runner.evaluation import run_experiment
from ale_iac.runner.experiment import load_experiment
from tests.support.tasks import make_preset, make_task

# The engine is only constructed (a static profile makes no stack); readiness fails on dead endpoints in 1 s.
pytestmark = pytest.mark.engine

DEAD = ["http://127.0.0.1:9", "http://127.0.0.1:11"]


def test_each_unit_of_a_static_profile_leases_its_own_endpoint(tmp_path: Path) -> None:
    profile = tmp_path / "Pulumi.two.yaml"
    profile.write_text(
        "config:\n  ale-iac:profile:\n    name: two\n    ready_timeout_s: 1\n    snapshots:\n"
        f"      cpu-free-ubuntu: {{provider: static, endpoints: {json.dumps(DEAD)}}}\n"
    )
    tasks = ["t0", "t1", "t2"]
    for task in tasks:
        make_task(tmp_path, task)
    make_preset(tmp_path, "writer", "WriterAgent")
    spec = {"name": "st", "agents": ["writer.yaml"], "tasks": tasks, "profile": str(profile), "concurrency": 3}
    path = tmp_path / "exp.yaml"
    path.write_text(json.dumps(spec))

    summary = run_experiment(load_experiment(path))

    assert [unit.status for unit in summary.outcomes] == ["not_ready"] * 3
    leased = []
    for events in summary.run_dir.glob("*/events.jsonl"):
        rows = [json.loads(line) for line in events.read_text().splitlines()]
        [unit] = [r["unit"] for r in rows if r["event"] == "leased"]
        [ready] = [r for r in rows if r["event"] == "phase_end" and r["phase"] == "ready"]
        leased.append(unit)
        # The unit was served by its own endpoint (unit <snapshot>-<i> is endpoint i).
        assert DEAD[int(unit[-1])] in ready["error"]
    # Three units on two endpoints: both used, one twice (the third waited for a lease).
    assert sorted(Counter(leased).values()) == [1, 2] and set(leased) == {"cpu-free-ubuntu-0", "cpu-free-ubuntu-1"}
    assert Engine().list_stacks() == []


def test_a_static_route_of_forwarders_leases_units_that_carry_the_channel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lease's handles say what a stack's would (``infra/static.py``): one read of the route for both."""
    from ale_iac.contract import forwarder_channel
    from ale_iac.profile import parse_profile
    from ale_iac.runner.provisioners import static_pool

    monkeypatch.setenv("ALE_TEST_STATIC_TOKEN", "t0ken")
    route = {"provider": "static", "endpoints": DEAD, "endpoint_token_env": "ALE_TEST_STATIC_TOKEN"}
    snapshots = {"fw": {**route, "forwarder": True}, "plain": route}
    pool = static_pool(parse_profile({"name": "p", "snapshots": snapshots}, "p.yaml").profile)
    assert pool is not None
    channels = {name: unit.gateway_channel for name, unit in pool.units.items()}
    assert channels == {"fw-0": forwarder_channel(), "fw-1": forwarder_channel(), "plain-0": None, "plain-1": None}
