"""A run's own pool: one stack for the whole run instead of one per unit (``shared_stack: true``).

A run of N units at ``-j C`` on an ephemeral profile makes N stacks, each in three CLI calls (``stack init``,
``up``, ``destroy``): engine time grows with every unit. With a shared stack the run brings up one stack of
``min(C, units)`` sandboxes per (snapshot, shape) its units need, in one ``up``, before the first unit starts;
each unit leases one of them like a pool's unit (``PoolProvisioner``), and when the unit ends its sandbox is
reset (the route's ``restore``: the substrate replaces it by a fresh one under the same id, so nothing of one
unit is seen by the next) without waiting for its neighbours; the stack is destroyed, in one more call, when
the run ends. Each unit keeps its own record and its own cleanup (``unit reset, lease released``).

The run claims the stack before its ``up`` (``RunRegistry``), so ``ale-iac gc`` destroys it after a crash like
any other stack of a dead run.

Only a route whose units are reset without the engine can be shared this way (``reset: restore`` of a host
substrate), and only when no unit's sandbox is kept after it ends (cleanup ``destroy``, no ``retain_below``):
:func:`check_shared_stack` says what stands in the way, naming the experiment file and its field.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ale_iac.contract import POOL_LABEL, UnitOutputs, UnitSpec
from ale_iac.engine import Engine
from ale_iac.errors import ConfigError
from ale_iac.profile import CleanupMode, HostRoute, Profile
from ale_iac.provision import destroy_stack, new_stack_name, up_units
from ale_iac.runner import leases
from ale_iac.runner.experiment import UnitPlan
from ale_iac.runner.provisioners import Pool
from ale_iac.runner.run_claims import RunRegistry
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
        substrate = substrates.get(route.provider) if substrates.is_substrate(route.provider) else None
        if (
            not isinstance(route, HostRoute)
            or route.reset != "restore"
            or substrate is None
            or Capability.RESTORE not in substrate.capabilities
        ):
            reset = getattr(route, "reset", "none")
            raise ConfigError(
                source,
                FIELD,
                f"snapshot {snapshot!r} of profile {profile.name} ({route.provider}, reset: {reset}) is not reset by "
                "its substrate without the engine (reset: restore of local, docker or qemu), which a shared stack "
                "needs between its units: use a stack per unit (shared_stack: false)",
            )


class SharedStack:
    """The run's one stack of sandboxes, leased unit by unit; :meth:`close` destroys it."""

    def __init__(self, engine: Engine, profile: Profile, run_id: str, registry: RunRegistry) -> None:
        self.engine = engine
        self.profile = profile
        self.registry = registry
        self.stack = new_stack_name("run", run_id[-15:], "shared")
        self._pools: dict[tuple[str, str], Pool] = {}

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
        for key, names in members.items():
            self._pools[key] = Pool(
                self.stack,
                {name: units[name] for name in names},
                default_snapshot=key[0],
                ready_timeout_s=self.profile.ready_timeout_s,
                records=records,
            )

    def pool_for(self, plan: UnitPlan) -> Pool:
        """The sandboxes a unit of ``plan`` leases from (those of its snapshot and shape)."""
        return self._pools[_group_key(self.profile, plan)]

    def close(self) -> None:
        """Destroy the stack (one CLI call) and forget its leases. A destroy that fails leaves the stack claimed
        by this run, so ``ale-iac gc`` finds it once the run has ended."""
        destroy_stack(self.engine, self.stack)
        self.registry.release(self.stack)
        leases.forget_stack(self.stack, leases.record_store(self.engine.backend_url))
