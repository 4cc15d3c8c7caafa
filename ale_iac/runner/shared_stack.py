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


class SharedStack:
    """The run's one stack of sandboxes, handed unit by unit; :meth:`close` destroys it."""

    def __init__(self, engine: Engine, profile: Profile, run_id: str, registry: RunRegistry) -> None:
        self.engine = engine
        self.profile = profile
        self.registry = registry
        self.stack = new_stack_name("run", run_id[-15:], "shared")
        self._pools: dict[tuple[str, str], Pool] = {}
        self._slots: dict[tuple[str, str], SlotGroup] = {}
        self.updates: StackUpdates | None = None
        """The stack's updates after its ``up`` (recreations, removals), when a route's units are reset by the
        engine."""

    def open(self, plans: Sequence[UnitPlan], concurrency: int) -> None:
        """Bring the stack up: per (snapshot, shape) of ``plans``, as many sandboxes as can be in use at once
        (the run's concurrency, or fewer units). Whatever an ``up`` that fails made is destroyed."""
        groups: dict[tuple[str, str], list[UnitPlan]] = {}
        for plan in plans:
            groups.setdefault(_group_key(self.profile, plan), []).append(plan)
        members: dict[tuple[str, str], list[str]] = {}
        specs: list[UnitSpec] = []
        for index, (key, group) in enumerate(sorted(groups.items())):
            members[key] = [f"g{index}-u{slot}" for slot in range(min(concurrency, len(group)))]
            labels = {"run": self.registry.run_id, POOL_LABEL: self.stack}
            shape = group[0].task.card.resources
            specs += [UnitSpec(name=name, snapshot=key[0], shape=shape, labels=labels) for name in members[key]]
        self.registry.claim(self.stack)  # before the up: a crash inside it leaves a stack gc can find
        try:
            units: dict[str, UnitOutputs] = up_units(self.engine, self.profile, self.stack, specs)
        except BaseException:
            self.close()
            raise
        records = leases.record_store(self.engine.backend_url)
        self.updates = StackUpdates(self.engine, self.profile, self.stack, {spec.name: spec for spec in specs}, units)
        for key, names in members.items():
            if _reset(self.profile.route(key[0])[1]) == "recreate":
                self._slots[key] = SlotGroup(
                    self.updates,
                    free=list(names),
                    demand=len(groups[key]),
                    ready_timeout_s=self.profile.ready_timeout_s,
                )
                continue
            self._pools[key] = Pool(
                self.stack,
                {name: units[name] for name in names},
                default_snapshot=key[0],
                ready_timeout_s=self.profile.ready_timeout_s,
                records=records,
            )

    def provisioner_for(self, plan: UnitPlan, timeout_s: float) -> Provisioner:
        """What gets a unit of ``plan`` one of the stack's sandboxes (of its snapshot and shape); ``timeout_s``:
        how long it may wait for one."""
        key = _group_key(self.profile, plan)
        if key in self._slots:
            return SlotProvisioner(self._slots[key], timeout_s)
        return PoolProvisioner(self._pools[key], lease_timeout_s=timeout_s)

    def close(self) -> None:
        """Destroy the stack (one CLI call) and forget its leases. A destroy that fails leaves the stack claimed
        by this run, so ``ale-iac gc`` finds it once the run has ended."""
        destroy_stack(self.engine, self.stack)
        self.registry.release(self.stack)
        leases.forget_stack(self.stack, leases.record_store(self.engine.backend_url))
