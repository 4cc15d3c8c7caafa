"""A shared stack's sandboxes reset by the engine (``reset: recreate``).

The slots' bookkeeping (recreate for a unit still to come, else remove; what an interrupted or failed unit does)
against a recording stand-in for the stack's updates; the updates themselves through the real engine on cloud
units served by the MOCK cloud provider plugins (``tests/support/mock_cloud_plugin.py``: no cloud is reachable
here). A whole run of real local units: tests/runner/test_evaluate.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ale_iac.contract import LINUX_DESKTOP_PATHS, Shape, UnitOutputs, UnitSpec
from ale_iac.engine import Engine
from ale_iac.errors import AleIacError
from ale_iac.provision import destroy_stack, up_units
from ale_iac.runner import shared_slots, shared_stack
from ale_iac.runner.run_claims import RunRegistry, read_claims
from ale_iac.runner.shared_slots import LEFT_TO_THE_STACK, RECREATED, REMOVED, SlotGroup, StackUpdates
from ale_iac.runner.shared_stack import SharedStack
from ale_iac.runner.status import UnitStatus
from tests.support.cloud import aliyun_route, aws_route, gcloud_route, profile
from tests.support.mock_cloud_plugin import MockCloudPlugin, serving


def _outputs(name: str, generation: int = 0) -> UnitOutputs:
    return UnitOutputs.model_validate(
        {
            "unit": name,
            "provider": "gcloud",
            "endpoint": "http://203.0.113.7:8000",
            "snapshot": "s",
            "image": "img",
            "resource_id": f"{name}-vm-{generation}",
            "paths": LINUX_DESKTOP_PATHS.model_dump(),
            "reset": "recreate",
        }
    )


class RecordingUpdates(StackUpdates):
    """Stands in for the stack's updates: records each change; a recreation makes a new generation."""

    def __init__(self, names: list[str], fail_recreate: bool = False) -> None:
        self.stack = "run-x-shared"
        self.outputs = {name: _outputs(name) for name in names}
        self.changes: list[tuple[str, str]] = []
        self.fail_recreate = fail_recreate

    def recreate(self, name: str) -> UnitOutputs:
        self.changes.append(("recreate", name))
        if self.fail_recreate:
            raise AleIacError("the update failed")
        self.outputs[name] = _outputs(name, int(self.outputs[name].resource_id.rsplit("-", 1)[1]) + 1)
        return self.outputs[name]

    def remove(self, name: str) -> None:
        self.changes.append(("remove", name))


@pytest.fixture(autouse=True)
def _no_server_to_wait_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in's sandboxes have no computer-server: a recreated one counts as ready at once."""

    async def ready(handle: Any, timeout_s: float) -> None:
        del handle, timeout_s

    monkeypatch.setattr(shared_slots, "wait_ready", ready)


def test_a_slot_is_recreated_while_units_are_to_come_then_removed() -> None:
    async def run() -> tuple[RecordingUpdates, list[str], list[str]]:
        updates = RecordingUpdates(["g0-u0", "g0-u1"])
        group = SlotGroup(dict.fromkeys(updates.outputs, updates), free=["g0-u0", "g0-u1"], demand=3, ready_timeout_s=5)
        first, second = await group.take(5), await group.take(5)
        waiting = asyncio.ensure_future(group.take(5))  # the third unit: no slot free
        outcomes = [await group.give_back(first.unit, UnitStatus.SUCCEEDED)]  # one unit to come: recreated
        third = await waiting
        outcomes.append(await group.give_back(second.unit, UnitStatus.AGENT_FAILED))  # none to come: removed
        outcomes.append(await group.give_back(third.unit, UnitStatus.SUCCEEDED))
        return updates, [first.resource_id, third.resource_id], outcomes

    updates, ids, outcomes = asyncio.run(run())
    assert updates.changes == [("recreate", "g0-u0"), ("remove", "g0-u1"), ("remove", "g0-u0")]
    assert ids == ["g0-u0-vm-0", "g0-u0-vm-1"]  # the third unit got the recreated sandbox, not the used one
    assert outcomes == [RECREATED, REMOVED, REMOVED]


def test_units_that_will_not_come_are_not_waited_for_and_an_interrupted_one_leaves_its_slot() -> None:
    async def run() -> tuple[RecordingUpdates, list[str]]:
        updates = RecordingUpdates(["g0-u0"])
        group = SlotGroup({"g0-u0": updates}, free=["g0-u0"], demand=3, ready_timeout_s=5)
        unit = await group.take(5)
        await group.withdraw()  # one cancelled while it waited, one whose task data was missing
        await group.withdraw()
        outcomes = [await group.give_back(unit.unit, UnitStatus.SUCCEEDED)]
        group.free, group.demand = ["g0-u0"], 1
        unit = await group.take(5)
        outcomes.append(await group.give_back(unit.unit, UnitStatus.INTERRUPTED))
        return updates, outcomes

    updates, outcomes = asyncio.run(run())
    assert updates.changes == [("remove", "g0-u0")]  # nobody left to serve: no recreation
    assert outcomes == [REMOVED, LEFT_TO_THE_STACK]  # the run's destroy takes it, in one call for all


def test_a_unit_waiting_for_a_slot_that_failed_to_come_back_is_told_why() -> None:
    async def run() -> tuple[str, BaseException | None]:
        updates = RecordingUpdates(["g0-u0"], fail_recreate=True)
        group = SlotGroup({"g0-u0": updates}, free=["g0-u0"], demand=2, ready_timeout_s=5)
        unit = await group.take(5)
        waiting = asyncio.ensure_future(group.take(5))
        outcome = await group.give_back(unit.unit, UnitStatus.SUCCEEDED)
        try:
            await waiting
        except AleIacError as exc:
            return outcome, exc
        return outcome, None

    outcome, error = asyncio.run(run())
    assert outcome.startswith("recreate failed: the update failed")
    assert error is not None and "has no sandbox left for this unit" in str(error)


# -- the updates, through the real engine -------------------------------------------------------------------------


@pytest.fixture
def clouds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, MockCloudPlugin]]:
    monkeypatch.setenv("ALE_IAC_HOME", str(tmp_path / "home"))
    with serving() as plugins:
        yield plugins


def _live(plugins: dict[str, MockCloudPlugin]) -> set[str]:
    return {urn for plugin in plugins.values() for urn in plugin.live.values()}


@pytest.mark.engine
def test_updates_replace_a_unit_s_vm_and_remove_a_unit_whole(clouds: dict[str, MockCloudPlugin]) -> None:
    # ale-iac's own disk (guest_agent): each unit has an endpoint token, which outputs and state keep secret.
    routes = {
        "g": gcloud_route(guest_agent=True),
        "a": aws_route(guest_agent=True),
        "y": aliyun_route(guest_agent=True),
    }
    cloud_profile = profile(routes)
    specs = {f"{s}{i}": UnitSpec(name=f"{s}{i}", snapshot=s) for s in routes for i in range(2)}
    with Engine() as engine:
        units = up_units(engine, cloud_profile, "shared-test", list(specs.values()))
        made = _live(clouds)
        assert all(any(f"::{name}" in urn for urn in made) for name in specs)
        updates = StackUpdates(engine, cloud_profile, "shared-test", specs, units)

        fresh = updates.recreate("g0")
        assert fresh.resource_id != units["g0"].resource_id
        assert _live(clouds) == made  # the same URNs: the VM replaced, nothing else touched
        assert clouds["gcp"].calls["delete"] == 1 and units["g0"].reset_urns == fresh.reset_urns

        for name in ("a1", "y0"):
            updates.remove(name)
        assert updates.updates == 3
        left = _live(clouds)
        assert not [urn for urn in left if "::a1" in urn or "::y0" in urn]  # each unit's resources, all of them
        gone = made - left
        assert gone and all("::a1" in urn or "::y0" in urn for urn in gone)  # and nothing of the others

        updates.recreate("a0")  # a later update does not bring a removed unit back
        assert _live(clouds) == left
        # The stack's output stays whole: the units an update left out are exported as they were, tokens secret.
        exported = engine.units("shared-test")
        assert sorted(exported) == sorted(set(specs) - {"a1", "y0"})
        assert exported["g1"] == units["g1"] and exported["g0"] == fresh and exported["a0"] != units["a0"]
        tokens = [unit.token() for unit in exported.values()]
        assert all(tokens)
        [state] = (engine.home / "state").rglob("shared-test.json")
        assert not [token for token in tokens if token and token in state.read_text()]
        assert destroy_stack(engine, "shared-test")
    assert _live(clouds) == set()


@pytest.mark.engine
def test_a_run_with_more_sandboxes_than_a_share_holds_gets_a_stack_per_share(
    clouds: dict[str, MockCloudPlugin], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five gcloud sandboxes at shares of 2: three stacks, each claimed by the run before its ``up``, each unit
    handed out from its own stack and removed there; ``close`` destroys all three."""
    monkeypatch.setattr(shared_stack, "SHARD_UNITS", 2)
    plans = [SimpleNamespace(task=SimpleNamespace(card=SimpleNamespace(snapshot="g", resources=Shape())))] * 5
    registry = RunRegistry("run-shares", tmp_path / "run")
    with Engine() as engine:
        shared = SharedStack(engine, profile({"g": gcloud_route()}), "run-shares", registry)
        shared.open(plans, concurrency=5)  # type: ignore[arg-type]  # what open reads of a plan
        assert len(shared.stacks) == 3 and shared.stacks[0] == shared.stack
        assert sorted(claim for c in read_claims() for claim in c.stacks) == sorted(shared.stacks)
        assert sorted(len(engine.units(stack)) for stack in shared.stacks) == [1, 2, 2]

        class Record:
            def event(self, name: str, **fields: Any) -> None:
                leased.append(fields)

        leased: list[dict[str, Any]] = []

        async def run_all() -> list[str]:
            provisioners = [shared.provisioner_for(plan, 5) for plan in plans]  # type: ignore[arg-type]
            handles = [await p.acquire(plan, Record()) for p, plan in zip(provisioners, plans, strict=True)]  # type: ignore[arg-type]
            assert {h.stack for h in handles} == set(shared.stacks)
            return [await p.release(UnitStatus.SUCCEEDED) for p in provisioners]

        assert asyncio.run(run_all()) == [REMOVED] * 5  # no unit left to come: each removed from its stack
        assert {e["stack"] for e in leased} == set(shared.stacks)
        assert all(engine.units(stack) == {} for stack in shared.stacks)
        shared.close()
        assert engine.list_stacks() == [] and not any(c.stacks for c in read_claims())
    assert _live(clouds) == set()


@pytest.mark.engine
def test_a_run_with_no_unit_to_run_makes_one_empty_stack(clouds: dict[str, MockCloudPlugin], tmp_path: Path) -> None:
    with Engine() as engine:
        shared = SharedStack(engine, profile({"g": gcloud_route()}), "run-none", RunRegistry("run-none", tmp_path))
        shared.open([], concurrency=4)
        assert shared.stacks == [shared.stack] and engine.units(shared.stack) == {}
        shared.close()
        assert engine.list_stacks() == []
