"""declare(): turn a profile and a list of units into resources.

``declare()`` is the single entry point, used by the inline program of ``ale-iac evaluate`` and by
the ``Pulumi.yaml`` program alike. It routes each unit's snapshot to a provider module, lets that
module declare the unit's resources, and exports the handles under the ``units`` stack output
(see ``ale_iac.contract``). Provider modules are imported lazily so that a profile using only
``local`` never imports a cloud SDK.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ale_iac.contract import UNITS_OUTPUT, UnitSpec
from ale_iac.errors import ConfigError
from ale_iac.profile import PROVIDER_KINDS, Profile
from ale_iac.substrates import registry


@dataclass(frozen=True)
class DeclareContext:
    """Facts about the stack being declared that providers put into names, labels and TTLs."""

    stack: str
    profile: str
    index: int
    unit_count: int


class ProviderModule(Protocol):
    def declare_unit(self, unit: UnitSpec, snapshot: str, route: Any, ctx: DeclareContext) -> Any:
        """Declare the unit's resources; return its handle (a UnitOutputs-shaped dict or Output)."""


def provider_module(kind: str) -> ProviderModule:
    """The module that declares units of provider ``kind``: ``ale_iac.infra.host_units`` for a host substrate,
    ``ale_iac.infra.<kind>`` for the others (the clouds, static endpoints)."""
    if kind not in PROVIDER_KINDS:
        raise ConfigError("profile", "provider", f"unknown provider kind {kind!r} (one of {', '.join(PROVIDER_KINDS)})")
    name = "host_units" if registry.is_substrate(kind) else kind
    module: ProviderModule = importlib.import_module(f"ale_iac.infra.{name}")
    return module


def declare(profile: Profile, units: Sequence[UnitSpec], stack: str, export: bool = True) -> dict[str, Any]:
    """Declare every unit of ``units`` under ``profile`` and export their handles.

    Must run inside a Pulumi program (inline, ``Pulumi.yaml`` or under mocks).
    """
    import pulumi

    names = [u.name for u in units]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"stack {stack}", "units", f"duplicate unit names: {', '.join(duplicates)}")
    handles: dict[str, Any] = {}
    for index, unit in enumerate(units):
        snapshot, route = profile.route(unit.snapshot)
        ctx = DeclareContext(stack=stack, profile=profile.name, index=index, unit_count=len(units))
        handles[unit.name] = provider_module(route.provider).declare_unit(unit, snapshot, route, ctx)
    if export:
        pulumi.export(UNITS_OUTPUT, handles)
    return handles
