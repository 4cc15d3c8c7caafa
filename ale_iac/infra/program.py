"""The two ways a declaration runs: inline (``ale-iac evaluate``) and as the ``Pulumi.yaml`` program."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ale_iac.contract import POOL_LABEL, UNITS_OUTPUT, UnitSpec
from ale_iac.infra import declare
from ale_iac.profile import CONFIG_NAMESPACE, PoolSpec, Profile, parse_profile


def inline_program(
    profile: Profile,
    units: Sequence[UnitSpec],
    stack: str,
    on_units: Callable[[dict[str, Any]], None] | None = None,
    gate: Callable[[], bool] | None = None,
    kept: Mapping[str, dict[str, Any]] | None = None,
) -> Callable[[], None]:
    """A closure for the Automation API: declares ``units`` under ``profile``.

    ``on_units`` receives the ``units`` output's plain values (secrets revealed) once the update has
    resolved them, in this process: what a ``stack output --show-secrets`` after the update would read.
    The inline program runs in the caller's process, and ``up`` returns only after every apply ran.

    ``gate``, when given, is called before anything is declared and may block: the update waits in the
    program until it returns (``ale_iac.provision.UpAhead``); False declares nothing.

    ``kept``: handles (``UnitOutputs.to_output()``) of units the stack holds that this program does not declare,
    for a targeted update, which leaves what it does not target as the stack has it: exported as they are
    (a secret, as a declared unit's handle), so the stack's ``units`` output stays whole.
    """
    frozen = tuple(units)
    kept = dict(kept or {})

    def program() -> None:
        if gate is not None and not gate():
            return
        import pulumi

        handles: dict[str, Any] = declare(profile, frozen, stack, export=not kept)
        if kept:
            handles = {**{name: pulumi.Output.secret(handle) for name, handle in kept.items()}, **handles}
            pulumi.export(UNITS_OUTPUT, handles)
        if on_units is not None:
            pulumi.Output.from_input(handles).apply(on_units)

    return program


def pool_units(pool: PoolSpec, stack: str) -> list[UnitSpec]:
    """The units of a pool stack (:meth:`PoolSpec.members`: stable names, so ``pulumi up`` diffs stay small)."""
    return [
        UnitSpec(name=name, snapshot=snapshot, shape=pool.shape, labels={POOL_LABEL: stack})
        for name, snapshot in pool.members()
    ]


def project_program() -> None:
    """The program of ``Pulumi.yaml``: profile and pool come from the stack's config file."""
    import pulumi

    stack = pulumi.get_stack()
    config = pulumi.Config(CONFIG_NAMESPACE)
    loaded = parse_profile(config.require_object("profile"), f"stacks/Pulumi.{stack}.yaml", config.get_object("pool"))
    declare(loaded.profile, pool_units(loaded.pool or PoolSpec(units=1), stack), stack)
