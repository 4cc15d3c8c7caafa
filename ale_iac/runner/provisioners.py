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
import os
import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pydantic import SecretStr

from ale_iac.contract import UnitOutputs, UnitSpec
from ale_iac.engine import Engine
from ale_iac.errors import AleIacError, one_line
from ale_iac.profile import CleanupMode, Profile, StaticRoute
from ale_iac.provision import UNIT_NAME, UpAhead, destroy_stack, new_stack_name, up_unit
from ale_iac.runner import leases
from ale_iac.runner.experiment import UnitPlan
from ale_iac.runner.records import UnitRecord
from ale_iac.runner.resets import current_outputs, reset_of
from ale_iac.runner.run_claims import RunRegistry
from ale_iac.runner.status import UnitStatus
from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.sandbox.readiness import wait_ready

T = TypeVar("T")
POOL_READY_TIMEOUT_S = 120.0

RETAINED = "retained"
NOTHING_TO_CLEAN = "nothing to clean"
NO_SANDBOX_MADE = "no sandbox was made (the stack made ahead for it was removed)"


async def blocking(fn: Callable[..., T], *args: Any) -> T:
    """Run an engine call in a thread. If cancelled, still wait for the thread to finish."""
    return await _in_thread(None, functools.partial(fn, *args))


BACKGROUND_NICE = 10
"""The niceness of engine calls off every unit's critical path (a stack made ahead, a stack destroyed after its
unit's slot was given back): on 2 cores they ran as fast as the next unit's ``up`` and readiness, and slowed
them down."""


async def in_background(fn: Callable[..., T], *args: Any) -> T:
    """:func:`blocking`, in a thread of its own at ``BACKGROUND_NICE``: the engine's CLI and the provider plugins
    it starts inherit the thread's niceness, so they yield the CPU to the units being provisioned and checked.
    A thread of its own, since a thread's niceness cannot go back down without privilege."""

    def lowered() -> T:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
        return fn(*args)

    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="background-engine-call")
    try:
        return await _in_thread(executor, lowered)
    finally:
        executor.shutdown(wait=False)  # its one thread ends with the call


async def _in_thread(executor: ThreadPoolExecutor | None, call: Callable[[], T]) -> T:
    future = asyncio.get_running_loop().run_in_executor(executor, call)
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

    async def prepare(self, plan: UnitPlan) -> None:
        """What can be done for the unit while it waits for its turn (off its critical path); may be nothing."""

    async def discard(self) -> None:
        """Undo :meth:`prepare` for a unit that never ran (cancelled while it waited)."""

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
    initialized: bool = False
    """Whether :meth:`prepare` made the (empty) stack already."""
    up_ahead: UpAhead | None = None
    """The unit's ``up``, started by :meth:`prepare` and held until :meth:`acquire` (or :meth:`discard`)."""
    acquired: bool = False
    """Whether the unit asked for its sandbox (from then on its stack is its own, to destroy or retain)."""

    @property
    def ready_timeout_s(self) -> float:
        return self.profile.ready_timeout_s

    def _claim_stack(self, plan: UnitPlan) -> str:
        self.stack = new_stack_name("run", self.run_id[-15:], plan.unit_id[-40:])
        self.registry.claim(self.stack)
        return self.stack

    async def prepare(self, plan: UnitPlan) -> None:
        """While the unit waits for a slot (off its critical path): ``stack init`` of its stack (0.4 s of the
        CLI), then its ``up`` started and held before it declares anything (:class:`UpAhead`: the CLI's start
        and key derivation, 0.5 s). If that fails the stack is forgotten and :meth:`acquire` makes it as usual
        (and fails there with the engine's error, in the unit's record)."""
        stack = self._claim_stack(plan)
        try:
            unit = self._unit(plan)
            await in_background(self.engine.init, stack)
            self.initialized = True
        except Exception:
            await self.discard()
            return
        # Not niced: once the unit's turn comes, this CLI is on its critical path.
        self.up_ahead = UpAhead(self.engine, self.profile, stack, unit)

    async def discard(self) -> None:
        if self.stack is None:
            return
        up_ahead, self.up_ahead = self.up_ahead, None
        with contextlib.suppress(Exception):  # what is left stays claimed, so gc and a second ^C see it
            if up_ahead is not None:
                await blocking(up_ahead.drop)
            await blocking(destroy_stack, self.engine, self.stack)
            self.registry.release(self.stack)
        self.stack, self.initialized = None, False

    def _unit(self, plan: UnitPlan) -> UnitSpec:
        snapshot, _ = self.profile.route(plan.task.card.snapshot)
        return UnitSpec(
            name=UNIT_NAME,
            snapshot=snapshot,
            shape=plan.task.card.resources,
            labels={"run": self.run_id, "unit": plan.unit_id[-60:]},
        )

    async def acquire(self, plan: UnitPlan, record: UnitRecord) -> SandboxHandle:
        unit = self._unit(plan)
        self.acquired = True
        stack = self.stack if self.initialized and self.stack is not None else self._claim_stack(plan)
        record.write_run(stack=stack)
        up_ahead, self.up_ahead = self.up_ahead, None
        if up_ahead is not None:
            return await blocking(up_ahead.go)
        return await blocking(up_unit, self.engine, self.profile, stack, unit, None, self.initialized)

    async def release(self, status: UnitStatus, score: float | None = None) -> str:
        if self.stack is None:
            return NOTHING_TO_CLEAN
        if not self.acquired:
            # The unit ended before it asked for its sandbox (its task's data missing, say): the stack
            # made ahead for it held nothing, and the unit's record names no stack.
            await self.discard()
            return NO_SANDBOX_MADE
        if not keep_sandbox(self.cleanup, status, score, self.retain_below):
            return await self._destroy()
        self.registry.retain(self.stack)
        return RETAINED

    async def _destroy(self) -> str:
        assert self.stack is not None
        try:
            existed = await in_background(destroy_stack, self.engine, self.stack)
        except Exception as exc:
            return f"destroy failed: {one_line(exc)} (run: ale-iac gc)"
        self.registry.release(self.stack)
        return "destroyed" if existed else "no stack was created"


@dataclass(frozen=True)
class Pool:
    """A pool stack's units, read from its outputs once per run."""

    stack: str
    """The pool stack (for a static profile, the name its leases go by: ``static-<profile>``)."""
    units: dict[str, UnitOutputs]
    default_snapshot: str | None = None
    """Served to a task that names no snapshot (else the pool must serve one snapshot only)."""
    ready_timeout_s: float = POOL_READY_TIMEOUT_S
    records: leases.RecordStore | None = None
    """Where lease records live, so runs of other homes and hosts sharing the backend see the leases."""

    @classmethod
    def read(cls, engine: Engine, stack: str) -> Pool:
        units = engine.units(stack)
        if not units:
            raise AleIacError(f"pool stack '{stack}' exports no units")
        return cls(stack, units, records=leases.record_store(engine.backend_url))

    def units_for(self, snapshot: str | None) -> list[str]:
        """The units serving a task of ``snapshot``; a task naming none needs a pool of one snapshot."""
        served = sorted({unit.snapshot for unit in self.units.values()})
        snapshot = snapshot or self.default_snapshot
        if snapshot is None:
            if len(served) > 1:
                raise AleIacError(
                    f"the task names no snapshot and pool '{self.stack}' serves several ({', '.join(served)})"
                )
            return sorted(self.units)
        names = sorted(name for name, unit in self.units.items() if unit.snapshot == snapshot)
        if not names:
            raise AleIacError(
                f"pool '{self.stack}' has no unit of snapshot {snapshot!r} (it serves {', '.join(served)})"
            )
        return names


def static_pool(profile: Profile, backend_url: str | None = None) -> Pool | None:
    """A profile whose routes are all ``static`` as a pool without a stack: one unit per endpoint, so a
    run uses every endpoint, at most one unit on each at a time (None for any other profile)."""
    routes = profile.snapshots
    if not all(isinstance(route, StaticRoute) for route in routes.values()):
        return None
    default = profile.default_snapshot or (next(iter(routes)) if len(routes) == 1 else None)
    stack = f"static-{profile.name}"
    units: dict[str, UnitOutputs] = {}
    for snapshot, route in routes.items():
        assert isinstance(route, StaticRoute)
        token = route.endpoint_token()
        for i, endpoint in enumerate(route.endpoints):
            name = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', snapshot)}-{i}"
            units[name] = UnitOutputs(
                unit=name,
                provider="static",
                endpoint=endpoint.rstrip("/"),
                os=route.os,
                snapshot=snapshot,
                image=route.image,
                resource_id=endpoint.rstrip("/"),
                paths=route.paths,
                labels={"profile": profile.name, "unit": name},
                managed=False,
                endpoint_token=SecretStr(token) if token else None,
                gateway_channel=route.gateway_channel(),
            )
    return Pool(
        stack,
        units,
        default_snapshot=default,
        ready_timeout_s=profile.ready_timeout_s,
        records=leases.record_store(backend_url),
    )


@dataclass
class PoolProvisioner:
    """A unit of the task's snapshot leased from a pool stack (``pulumi up`` made it); reset and released,
    never destroyed.

    A unit is reset before its lease is released, so the next lease gets it clean. A lease whose holder
    died before that (the kernel drops the lock, the dirty marker stays) resets the unit first.
    """

    pool: Pool
    lease_timeout_s: float
    stack: str | None = None
    lease: leases.Lease | None = None
    unit: UnitOutputs | None = None
    record: UnitRecord | None = None

    @property
    def ready_timeout_s(self) -> float:
        return self.pool.ready_timeout_s

    async def prepare(self, plan: UnitPlan) -> None:
        """Nothing: a lease is taken when the unit's turn comes."""

    async def discard(self) -> None:
        """Nothing was prepared."""

    async def acquire(self, plan: UnitPlan, record: UnitRecord) -> SandboxHandle:
        stack = self.pool.stack
        self.record = record
        self.lease = await leases.lease(
            stack, self.pool.units_for(plan.task.card.snapshot), self.lease_timeout_s, self.pool.records
        )
        self.unit = self.pool.units[self.lease.unit]
        marker = leases.dirty_marker(stack, self.lease.unit, self.pool.records)
        reset = reset_of(stack, self.unit)  # ale_iac/runner/resets.py: restore, recreate or none
        if marker.exists() and reset is not None:
            self.unit = await blocking(reset, self.unit)
            record.event("reset", stack=stack, unit=self.lease.unit, reason="the previous lease ended unreset")
        else:
            # A reset since the run read the outputs moved its endpoint.
            self.unit = await blocking(current_outputs, stack, self.unit)
        marker.touch()
        record.event("leased", stack=stack, unit=self.lease.unit)
        return SandboxHandle.from_outputs(stack, self.unit)

    async def release(self, status: UnitStatus, score: float | None = None) -> str:
        if self.lease is None:
            return NOTHING_TO_CLEAN
        marker = leases.dirty_marker(self.pool.stack, self.lease.unit, self.pool.records)
        if self.lease.lost is not None and self.record is not None:
            self.record.event("lease_lost", stack=self.pool.stack, unit=self.lease.unit, error=self.lease.lost)
        try:
            reset = reset_of(self.pool.stack, self.unit) if self.unit is not None else None
            if reset is None or self.unit is None:
                marker.unlink(missing_ok=True)
                return "lease released (unit not reset)"
            try:
                fresh = await blocking(reset, self.unit)
                # Ready before the lease is free: the next lease gets a unit it can use at once.
                await wait_ready(SandboxHandle.from_outputs(self.pool.stack, fresh), self.ready_timeout_s)
            except Exception as exc:
                return f"lease released; reset failed: {one_line(exc)} (the next lease retries it)"
            marker.unlink(missing_ok=True)
            return "unit reset, lease released"
        finally:
            self.lease.release()
