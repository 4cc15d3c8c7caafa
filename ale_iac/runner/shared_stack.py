"""A run's own pool: one stack for the whole run instead of one per unit (``shared_stack: true``).

A run of N units at ``-j C`` on an ephemeral profile makes N stacks, each in three CLI calls (``stack init``,
``up``, ``destroy``): engine time grows with every unit. With a shared stack the run brings up one stack of
``min(C, units)`` sandboxes per (snapshot, shape) its units need, in one ``up``, before the first unit starts;
each unit takes one of them, and when the unit ends its sandbox is made fresh for the next unit (or, on an
engine-reset route with no unit left to serve, removed) without waiting for its neighbours; the stack is
destroyed, in one more call, when the run ends. Each unit keeps its own record and its own cleanup outcome.

How a sandbox is made fresh is its route's ``reset``:

* ``restore`` (a host substrate's): the substrate replaces it under the same id, without the engine; its units
  lease it like a pool's unit (``PoolProvisioner``, outcome ``unit reset, lease released``);
* ``recreate`` (the cloud kinds', ``kubernetes``', or a host route's that asks for it): the engine replaces it,
  or removes it once no unit of its group is left to come; units that end together share that update
  (``ale_iac.runner.shared_slots``).

The run claims the stack before its ``up`` (``RunRegistry``), so ``ale-iac gc`` destroys it after a crash like
any other stack of a dead run.

Only a route whose units can be made fresh can be shared this way (not ``reset: none``), and only when no unit's
sandbox is kept after it ends (cleanup ``destroy``, no ``retain_below``): :func:`check_shared_stack` says what
stands in the way, naming the experiment file and its field.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ale_iac.contract import POOL_LABEL, UnitOutputs, UnitSpec
from ale_iac.engine import Engine
from ale_iac.errors import ConfigError
from ale_iac.profile import AnyRoute, CleanupMode, Profile
from ale_iac.provision import destroy_stack, new_stack_name, up_units
from ale_iac.runner import leases
from ale_iac.runner.experiment import UnitPlan
from ale_iac.runner.provisioners import Pool, PoolProvisioner, Provisioner
from ale_iac.runner.run_claims import RunRegistry
from ale_iac.runner.shared_slots import SlotGroup, SlotProvisioner, StackUpdates
from ale_iac.substrates import registry as substrates
from ale_iac.substrates.base import Capability

FIELD = "shared_stack"


def _group_key(profile: Profile, plan: UnitPlan) -> tuple[str, str]:
    snapshot, _ = profile.route(plan.task.card.snapshot)
    return snapshot, plan.task.card.resources.model_dump_json()


def check_shared_stack(
    profile: Profile, plans: Sequence[UnitPlan], cleanup: CleanupMode, retain_below: float | None, source: Path
) -> None:
    """Refuse a shared stack the run could not keep its promises with, before anything is made."""
    if cleanup is not CleanupMode.DESTROY:
        raise ConfigError(
            source,
            FIELD,
            f"a shared stack resets each unit's sandbox for the next unit, so cleanup '{cleanup.value}' cannot keep "
            "one: use cleanup: destroy, or a stack per unit (shared_stack: false)",
        )
    if retain_below is not None:
        raise ConfigError(
            source,
            FIELD,
            "a shared stack resets each unit's sandbox for the next unit, so retain_below cannot keep one: "
            "leave retain_below out, or use a stack per unit (shared_stack: false)",
        )
    for snapshot in sorted({_group_key(profile, plan)[0] for plan in plans}):
        _, route = profile.route(snapshot)
        if _reset(route) == "recreate":
            continue
        substrate = substrates.get(route.provider) if substrates.is_substrate(route.provider) else None
        if _reset(route) != "restore" or substrate is None or Capability.RESTORE not in substrate.capabilities:
            raise ConfigError(
                source,
                FIELD,
                f"snapshot {snapshot!r} of profile {profile.name} ({route.provider}, reset: {_reset(route)}) cannot "
                "be made fresh between units (reset: restore of local, docker or qemu, or reset: recreate), which a "
                "shared stack needs: use a stack per unit (shared_stack: false)",
            )


def _reset(route: AnyRoute) -> str:
    return str(getattr(route, "reset", "none"))


SHARD_UNITS = 16
"""At most this many sandboxes of routes the engine resets in one stack; more go into further stacks of the run.
The file backend writes the whole state after every step, so an update of a stack of N units costs about N^2: an
``up`` of 100 gcloud units took 39.6 s, 0.40 s a unit, against 0.27 and 0.25 s a unit for 10 and 25
(docs/benchmarks.md, Cloud units in a shared stack). Units a substrate resets stay in one stack: its engine calls
are its ``up`` and ``destroy`` only."""


class SharedStack:
    """The run's stacks of sandboxes, handed unit by unit; :meth:`close` destroys them.

    One stack (:attr:`stack`) in general; a run with more than :data:`SHARD_UNITS` sandboxes of routes the engine
    resets has one more per such share (``<stack>`` then ``...-shared1-...``, ``...-shared2-...``), each its own
    ``up``, updates and ``destroy``."""

    def __init__(self, engine: Engine, profile: Profile, run_id: str, registry: RunRegistry) -> None:
        self.engine = engine
        self.profile = profile
        self.registry = registry
        self.run_id = run_id
        self.stack = new_stack_name("run", run_id[-15:], "shared")
        self.stacks: list[str] = []
        """Every stack of the run, the first being :attr:`stack` (those :meth:`open` made or began to)."""
        self._pools: dict[tuple[str, str], Pool] = {}
        self._slots: dict[tuple[str, str], SlotGroup] = {}

    def open(self, plans: Sequence[UnitPlan], concurrency: int) -> None:
        """Bring the stacks up: per (snapshot, shape) of ``plans``, as many sandboxes as can be in use at once
        (the run's concurrency, or fewer units). Whatever an ``up`` that fails made is destroyed, and so are the
        other stacks."""
        groups: dict[tuple[str, str], list[UnitPlan]] = {}
        for plan in plans:
            groups.setdefault(_group_key(self.profile, plan), []).append(plan)
        members: dict[tuple[str, str], list[str]] = {}
        by_substrate: list[UnitSpec] = []
        by_engine: list[UnitSpec] = []
        for index, (key, group) in enumerate(sorted(groups.items())):
            members[key] = [f"g{index}-u{slot}" for slot in range(min(concurrency, len(group)))]
            shape = group[0].task.card.resources
            specs = [UnitSpec(name=name, snapshot=key[0], shape=shape) for name in members[key]]
            (by_engine if self._engine_resets(key) else by_substrate).extend(specs)
        shares = [by_substrate] if by_substrate else []
        shares += [by_engine[i : i + SHARD_UNITS] for i in range(0, len(by_engine), SHARD_UNITS)]
        shares = shares or [[]]  # a run with no unit to run (a resumed one, all done): an empty stack, as before
        self.stacks = [self.stack] + [
            new_stack_name("run", self.run_id[-15:], f"shared{i}") for i in range(1, len(shares))
        ]
        for stack in self.stacks:
            self.registry.claim(stack)  # before the up: a crash inside it leaves a stack gc can find
        try:
            made = self._up_all(shares)
        except BaseException:
            self.close()
            raise
        updates_of: dict[str, StackUpdates] = {}
        for stack, units in made.items():
            updates = StackUpdates(self.engine, self.profile, stack, units[0], units[1])
            updates_of.update(dict.fromkeys(units[0], updates))
        records = leases.record_store(self.engine.backend_url)
        for key, names in members.items():
            if self._engine_resets(key):
                self._slots[key] = SlotGroup(
                    {name: updates_of[name] for name in names},
                    free=list(names),
                    demand=len(groups[key]),
                    ready_timeout_s=self.profile.ready_timeout_s,
                )
                continue
            self._pools[key] = Pool(
                self.stack,
                {name: updates_of[name].outputs[name] for name in names},
                default_snapshot=key[0],
                ready_timeout_s=self.profile.ready_timeout_s,
                records=records,
            )

    def _engine_resets(self, key: tuple[str, str]) -> bool:
        return _reset(self.profile.route(key[0])[1]) == "recreate"

    def _up_all(self, shares: list[list[UnitSpec]]) -> dict[str, tuple[dict[str, UnitSpec], dict[str, UnitOutputs]]]:
        """Each share's ``up`` in its stack (two at a time: the host's cores); per stack, its units' specs and
        handles. The first failure is raised once every ``up`` has ended."""

        def up(stack: str, share: list[UnitSpec]) -> tuple[dict[str, UnitSpec], dict[str, UnitOutputs]]:
            labelled = [
                UnitSpec(
                    name=s.name,
                    snapshot=s.snapshot,
                    shape=s.shape,
                    labels={"run": self.registry.run_id, POOL_LABEL: stack},
                )
                for s in share
            ]
            return {s.name: s for s in labelled}, up_units(self.engine, self.profile, stack, labelled)

        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="shared-stack-up") as pool:
            futures = {stack: pool.submit(up, stack, share) for stack, share in zip(self.stacks, shares, strict=True)}
        return {stack: future.result() for stack, future in futures.items()}

    def provisioner_for(self, plan: UnitPlan, timeout_s: float) -> Provisioner:
        """What gets a unit of ``plan`` one of the stacks' sandboxes (of its snapshot and shape); ``timeout_s``:
        how long it may wait for one."""
        key = _group_key(self.profile, plan)
        if key in self._slots:
            return SlotProvisioner(self._slots[key], timeout_s)
        return PoolProvisioner(self._pools[key], lease_timeout_s=timeout_s)

    def close(self) -> None:
        """Destroy the stacks (one CLI call each) and forget their leases. A stack whose destroy fails stays
        claimed by this run, so ``ale-iac gc`` finds it once the run has ended; the first such failure is raised
        once every stack was tried."""
        failed: BaseException | None = None
        for stack in self.stacks or [self.stack]:
            try:
                destroy_stack(self.engine, stack)
            except Exception as exc:
                failed = failed or exc
                continue
            self.registry.release(stack)
            leases.forget_stack(stack, leases.record_store(self.engine.backend_url))
        if failed is not None:
            raise failed
