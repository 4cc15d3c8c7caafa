"""A shared stack's sandboxes that only the engine can reset (``reset: recreate``): the cloud kinds, ``kubernetes``,
and any host route that asks for it.

A unit of such a group takes one of the stack's sandboxes (a *slot*) and, when it ends, gives it back in one of
two ways, decided then: if more of the group's units will still ask for a slot than there are clean ones (free or
being remade), the slot's sandbox is **recreated** (its VM, pod or sandbox replaced: ``up --replace URN --target
URN``); otherwise it is **removed** from the stack, with its firewall rules, token and every other resource of the
unit (``up --target <the unit's root URN> --target-dependents``, the program no longer declaring it), so a cloud VM
nobody will use again does not wait for the run's end. Neither waits for the unit's neighbours: the first
request starts an update at once; requests made while it runs go together into the next one
(:class:`~ale_iac.runner.batches.Batches`), so units that end together share an engine call.

So a run of N units at ``-j C`` costs one ``up`` of ``min(C, N)`` sandboxes (one per share of
``shared_stack.SHARD_UNITS``), at most one update per unit that ends (fewer when units end together), and one
``destroy`` per stack, against three CLI calls per unit with a stack each.
Each unit keeps its own record and cleanup outcome; a crash leaves one stack, claimed by the run, which ``ale-iac
gc`` destroys whole. A unit interrupted with its run leaves its slot to the stack's destroy (one call for all).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from ale_iac.contract import UnitOutputs, UnitSpec
from ale_iac.engine import Engine
from ale_iac.errors import AleIacError, one_line
from ale_iac.profile import Profile
from ale_iac.provision import update_units
from ale_iac.runner.batches import Batches
from ale_iac.runner.experiment import UnitPlan
from ale_iac.runner.provisioners import NOTHING_TO_CLEAN, blocking
from ale_iac.runner.records import UnitRecord
from ale_iac.runner.status import UnitStatus
from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.sandbox.readiness import wait_ready

Change = Literal["recreate", "remove"]

RECREATED = "sandbox recreated for the next unit"
REMOVED = "destroyed"
LEFT_TO_THE_STACK = "left to the shared stack's destroy (run interrupted)"


class StackUpdates:
    """The shared stack's updates after its ``up``: recreations and removals of its units, batched; thread-safe.

    Each update's program declares only the units it recreates; the update targets them and the units it removes,
    and leaves the others as the stack has them (their handles exported as they were)."""

    def __init__(
        self,
        engine: Engine,
        profile: Profile,
        stack: str,
        specs: Mapping[str, UnitSpec],
        outputs: Mapping[str, UnitOutputs],
    ) -> None:
        self.engine = engine
        self.profile = profile
        self.stack = stack
        self._specs = dict(specs)
        self.outputs = dict(outputs)
        """Each unit's handle as last made (a recreation changes its resource id, endpoint and token)."""
        self.removed: set[str] = set()
        self.updates = 0
        """Engine calls made (one per batch)."""
        self._batches: Batches[str, Change, UnitOutputs] = Batches(self._apply)

    def recreate(self, name: str) -> UnitOutputs:
        """Replace the unit's sandbox (its ``reset_urns``); returns its new handle. Blocks for the update."""
        fresh = self._batches.submit(name, "recreate")
        assert fresh is not None  # _apply returns one for each recreation, or raises
        return fresh

    def remove(self, name: str) -> None:
        """Delete the unit and all its resources from the stack. Blocks for the update."""
        self._batches.submit(name, "remove")

    def _root(self, name: str) -> str:
        root = self.outputs[name].root_urn
        if root is None:
            raise AleIacError(f"unit {name} of stack '{self.stack}' exports no root_urn: it cannot be removed alone")
        return root

    def _apply(self, batch: dict[str, Change]) -> dict[str, UnitOutputs]:
        removing = sorted(name for name, change in batch.items() if change == "remove")
        recreating = sorted(name for name, change in batch.items() if change == "recreate")
        replace = [urn for name in recreating for urn in self.outputs[name].reset_urns]
        targets = [self._root(name) for name in removing] + replace
        gone = self.removed.union(removing)
        declared = [self._specs[name] for name in recreating]
        kept = {name: unit for name, unit in self.outputs.items() if name not in gone and name not in recreating}
        self.updates += 1
        exported = update_units(self.engine, self.profile, self.stack, declared, targets, replace, kept)
        self.removed = gone
        missing = [name for name in recreating if name not in exported]
        if missing:
            raise AleIacError(f"stack '{self.stack}' exports no unit {', '.join(missing)} after recreating it")
        fresh = {name: exported[name] for name in recreating}
        self.outputs.update(fresh)
        return fresh


@dataclass
class SlotGroup:
    """The slots of one (snapshot, shape) of the run's shared stacks, handed to the group's units one at a time."""

    updates: Mapping[str, StackUpdates]
    """Each slot's stack (its updates): a group of more than ``shared_stack.SHARD_UNITS`` spans several."""
    free: list[str]
    """Slots whose sandbox is clean and ready, nobody's."""
    demand: int
    """The group's units that will still ask for a slot (those not yet given one, less those that ended first)."""
    ready_timeout_s: float
    remaking: int = 0
    """Slots being recreated (clean, and free, once their update ends)."""
    in_use: int = 0
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    @property
    def stacks(self) -> str:
        """The group's stacks, for messages."""
        return ", ".join(sorted({updates.stack for updates in self.updates.values()}))

    def stack_of(self, slot: str) -> str:
        return self.updates[slot].stack

    async def take(self, timeout_s: float) -> UnitOutputs:
        """A clean slot's handle; waits while every slot is in use or being recreated."""
        async with self.changed:
            try:
                async with asyncio.timeout(timeout_s):
                    await self.changed.wait_for(lambda: bool(self.free) or self.remaking + self.in_use == 0)
            except TimeoutError:
                raise AleIacError(
                    f"no sandbox of the shared stack ({self.stacks}) came free within {timeout_s:.0f} s"
                ) from None
            if not self.free:
                raise AleIacError(
                    f"the shared stack ({self.stacks}) has no sandbox left for this unit (a recreation failed)"
                )
            name = self.free.pop(0)
            self.demand -= 1
            self.in_use += 1
        return self.updates[name].outputs[name]

    async def withdraw(self) -> None:
        """A unit of the group that will not ask for a slot after all (it ended, or was cancelled, first)."""
        async with self.changed:
            self.demand -= 1

    async def give_back(self, name: str, status: UnitStatus) -> str:
        """Recreate the slot for a unit still to come, or remove it; returns the cleanup's outcome."""
        async with self.changed:
            self.in_use -= 1
            interrupted = status is UnitStatus.INTERRUPTED
            recreate = not interrupted and self.demand > len(self.free) + self.remaking
            self.remaking += recreate
            self.changed.notify_all()
        if interrupted:
            return LEFT_TO_THE_STACK
        if not recreate:
            try:
                await blocking(self.updates[name].remove, name)
            except Exception as exc:
                return f"remove failed: {one_line(exc)} (the shared stack's destroy at the run's end removes it)"
            return REMOVED
        try:
            fresh = await blocking(self.updates[name].recreate, name)
            # Ready before it is free: the next unit gets a sandbox it can use at once.
            await wait_ready(SandboxHandle.from_outputs(self.stack_of(name), fresh), self.ready_timeout_s)
        except Exception as exc:
            async with self.changed:
                self.remaking -= 1
                self.changed.notify_all()
            return f"recreate failed: {one_line(exc)} (the slot is left to the shared stack's destroy)"
        async with self.changed:
            self.remaking -= 1
            self.free.append(name)
            self.changed.notify_all()
        return RECREATED


@dataclass
class SlotProvisioner:
    """A unit's sandbox from a :class:`SlotGroup` of the run's shared stack (which made it: the unit makes no stack)."""

    group: SlotGroup
    timeout_s: float
    slot: str | None = None
    withdrawn: bool = False
    stack: str | None = None

    @property
    def ready_timeout_s(self) -> float:
        return self.group.ready_timeout_s

    async def prepare(self, plan: UnitPlan) -> None:
        """Nothing: the slot is taken when the unit's turn comes."""

    async def discard(self) -> None:
        await self._withdraw()

    async def _withdraw(self) -> None:
        if not self.withdrawn and self.slot is None:
            self.withdrawn = True
            await self.group.withdraw()

    async def acquire(self, plan: UnitPlan, record: UnitRecord) -> SandboxHandle:
        unit = await self.group.take(self.timeout_s)
        self.slot = unit.unit
        stack = self.group.stack_of(unit.unit)
        record.event("leased", stack=stack, unit=unit.unit)
        return SandboxHandle.from_outputs(stack, unit)

    async def release(self, status: UnitStatus, score: float | None = None) -> str:
        if self.slot is None:
            await self._withdraw()
            return NOTHING_TO_CLEAN
        return await self.group.give_back(self.slot, status)
