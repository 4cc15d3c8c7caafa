"""Where a unit's sandbox comes from and where it goes: an ephemeral stack of its own, or a pool's unit.

A provisioner serves one unit: ``acquire`` returns a ready-to-probe handle, ``release`` applies the
cleanup mode (always called, also after a failure or a cancel) and says what became of the sandbox.
Engine calls run in a thread and are never abandoned half-way: a cancelled ``acquire`` still waits
for its ``pulumi up`` to finish, so the ``release`` that follows cannot race it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from ale_iac.contract import UnitSpec
from ale_iac.engine import Engine
from ale_iac.errors import one_line
from ale_iac.profile import CleanupMode, Profile
from ale_iac.provision import UNIT_NAME, destroy_stack, new_stack_name, up_unit
from ale_iac.runner import leases
from ale_iac.runner.experiment import UnitPlan
from ale_iac.runner.records import UnitRecord
from ale_iac.runner.registry import RunRegistry
from ale_iac.runner.status import UnitStatus
from ale_iac.sandbox.handle import SandboxHandle

T = TypeVar("T")
POOL_READY_TIMEOUT_S = 120.0

RETAINED = "retained"
NOTHING_TO_CLEAN = "nothing to clean"


async def blocking(fn: Callable[..., T], *args: Any) -> T:
    """Run an engine call in a thread. If cancelled, still wait for the thread to finish."""
    future = asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            await future
        raise


def keep_sandbox(cleanup: CleanupMode, status: UnitStatus, score: float | None, retain_below: float | None) -> bool:
    """Whether a unit's sandbox is retained. ``retain``: always. ``retain-on-failure``: when the unit did
    not succeed (any status but ``succeeded``: provisioning, readiness, setup, agent, timeout, grading
    failed, or interrupted). ``retain_below``, in any mode: also when it scored below that, or got no score."""
    if cleanup is CleanupMode.RETAIN:
        return True
    if cleanup is CleanupMode.RETAIN_ON_FAILURE and status is not UnitStatus.SUCCEEDED:
        return True
    return retain_below is not None and status is not UnitStatus.INTERRUPTED and (score is None or score < retain_below)


class Provisioner(Protocol):
    """Gets one unit a sandbox, and gives it back."""

    @property
    def stack(self) -> str | None:
        """The stack this unit made (None when it made none)."""

    @property
    def ready_timeout_s(self) -> float: ...

    async def acquire(self, plan: UnitPlan, record: UnitRecord) -> SandboxHandle: ...

    async def release(self, status: UnitStatus, score: float | None = None) -> str:
        """Apply the cleanup mode; returns the outcome (destroyed, retained, lease released, ...)."""
        ...


@dataclass
class StackProvisioner:
    """One ephemeral stack per unit, destroyed or retained per the cleanup mode."""

    engine: Engine
    profile: Profile
    run_id: str
    cleanup: CleanupMode
    registry: RunRegistry
    retain_below: float | None = None
    stack: str | None = None

    @property
    def ready_timeout_s(self) -> float:
        return self.profile.ready_timeout_s

    async def acquire(self, plan: UnitPlan, record: UnitRecord) -> SandboxHandle:
        snapshot, _ = self.profile.route(plan.task.card.snapshot)
        self.stack = new_stack_name("run", self.run_id[-15:], plan.unit_id[-40:])
        self.registry.claim(self.stack)
        record.write_run(stack=self.stack)
        unit = UnitSpec(
            name=UNIT_NAME,
            snapshot=snapshot,
            shape=plan.task.card.resources,
            labels={"run": self.run_id, "unit": plan.unit_id[-60:]},
        )
        return await blocking(up_unit, self.engine, self.profile, self.stack, unit)

    async def release(self, status: UnitStatus, score: float | None = None) -> str:
        if self.stack is None:
            return NOTHING_TO_CLEAN
        if not keep_sandbox(self.cleanup, status, score, self.retain_below):
            return await self._destroy()
        self.registry.retain(self.stack)
        return RETAINED

    async def _destroy(self) -> str:
        assert self.stack is not None
        try:
            existed = await blocking(destroy_stack, self.engine, self.stack)
        except Exception as exc:
            return f"destroy failed: {one_line(exc)} (run: ale-iac gc)"
        self.registry.release(self.stack)
        return "destroyed" if existed else "no stack was created"


@dataclass
class PoolProvisioner:
    """A unit leased from a pool stack (``pulumi up`` made it); released, never destroyed."""

    engine: Engine
    pool: str
    lease_timeout_s: float
    ready_timeout_s: float = POOL_READY_TIMEOUT_S
    stack: str | None = None
    lease: leases.Lease | None = None

    async def acquire(self, plan: UnitPlan, record: UnitRecord) -> SandboxHandle:
        units = await self.engine.units_async(self.pool)
        self.lease = await leases.lease(self.pool, units, self.lease_timeout_s)
        record.event("leased", stack=self.pool, unit=self.lease.unit)
        return SandboxHandle.from_outputs(self.pool, units[self.lease.unit])

    async def release(self, status: UnitStatus, score: float | None = None) -> str:
        if self.lease is None:
            return NOTHING_TO_CLEAN
        self.lease.release()
        return "lease released"
