"""The host substrates that exist: the one place that names them.

Each entry is ``<provider kind>: <module>:<class>``, a :class:`~ale_iac.substrates.base.Substrate` imported
on first use (a profile that uses only ``local`` never imports the Docker SDK or QEMU's drivers). The rest
of the code asks this module, never a particular substrate: adding one is a folder and a line here.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ale_iac.contract import HostChannel, UnitOutputs
from ale_iac.errors import AleIacError
from ale_iac.substrates.base import Capability, LogFn, Substrate, require

SUBSTRATES: Mapping[str, str] = {
    "local": "ale_iac.substrates.local.substrate:LocalSubstrate",
    "docker": "ale_iac.substrates.docker.substrate:DockerSubstrate",
    "qemu": "ale_iac.substrates.qemu.substrate:QemuSubstrate",
}

AnySubstrate = Substrate[Any, Any, Any]


def names() -> tuple[str, ...]:
    """Every registered substrate's name, in registration order."""
    return tuple(SUBSTRATES)


def is_substrate(kind: str) -> bool:
    """Whether units of provider ``kind`` run on a host substrate (not a cloud or a static endpoint)."""
    return kind in SUBSTRATES


@functools.cache
def get(name: str) -> AnySubstrate:
    """The substrate ``name``; an error listing the known ones for any other name."""
    target = SUBSTRATES.get(name)
    if target is None:
        raise AleIacError(f"no substrate {name!r} (known: {', '.join(SUBSTRATES)})")
    module, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module), attr)
    if not (isinstance(cls, type) and issubclass(cls, Substrate)) or cls.name != name:
        raise AleIacError(f"{target} is not the Substrate {name!r}")
    substrate: AnySubstrate = cls()
    return substrate


def all_substrates() -> list[AnySubstrate]:
    """Every registered substrate."""
    return [get(name) for name in SUBSTRATES]


def of_unit(unit: UnitOutputs) -> AnySubstrate | None:
    """The substrate a unit runs on, when it is one this host manages; None for a cloud VM, a static
    endpoint or a unit this host did not make."""
    return get(unit.provider) if unit.managed and is_substrate(unit.provider) else None


def require_of(unit: UnitOutputs, capability: Capability, why: str = "") -> AnySubstrate:
    """The unit's substrate, refusing (naming the provider and the capability) when it has none or lacks it."""
    substrate = of_unit(unit)
    if substrate is None:
        raise AleIacError(
            f"unit {unit.unit} runs on {unit.provider}, which is no host substrate: it has no {capability.value}"
            + (f": {why}" if why else "")
        )
    require(substrate, capability, why)
    return substrate


FORWARDERS = (
    "a host substrate's unit, a cloud route's with guest_agent: true (ale-iac's own disk), "
    "a static route's with forwarder: true"
)
"""The units whose endpoint is an ale-iac forwarder, in the words a refusal uses."""


def require_channel(unit: UnitOutputs, why: str = "") -> HostChannel:
    """The unit's host channels (the model channel and, from the same forwarder, the egress channel): had by any
    unit whose outputs say its endpoint is an ale-iac forwarder (``gateway_channel``), whatever its provider. A
    host substrate's unit is refused when its substrate lacks the capability (naming the substrate and it); any
    other unit without the channel is refused naming the unit, its provider and what it lacks."""
    substrate = of_unit(unit)
    if substrate is not None:
        require(substrate, Capability.HOST_CHANNEL, why)
    if unit.gateway_channel is None:
        raise AleIacError(
            f"unit {unit.unit} runs on {unit.provider}, whose endpoint is no ale-iac forwarder (its outputs carry "
            f"no gateway_channel; one is {FORWARDERS}): it has no {Capability.HOST_CHANNEL.value}"
            + (f": {why}" if why else "")
        )
    return unit.gateway_channel


def units_on_image(rootfs: Path) -> list[str]:
    """Ids of live units, of any substrate, whose root is ``rootfs``."""
    return [sandbox_id for substrate in all_substrates() for sandbox_id in substrate.units_on_image(rootfs)]


def export_targets() -> tuple[str, ...]:
    """Every export a built image can be made into: the image cache's own and the substrates'."""
    from ale_iac.images import EXPORT_TARGETS

    own = tuple(target for s in all_substrates() for target in s.image_exports)
    return (*EXPORT_TARGETS, *own)


def export_image(name: str, target: str, log: LogFn) -> str:
    """Export the built image ``name`` to ``target`` (one of :func:`export_targets`)."""
    from ale_iac.images import EXPORT_TARGETS
    from ale_iac.images import export_image as export_own

    if target in EXPORT_TARGETS:
        return export_own(name, target, log=log)
    for substrate in all_substrates():
        if target in substrate.image_exports:
            return substrate.export_image(name, target, log)
    raise AleIacError(f"unknown image export target {target!r} (known: {', '.join(export_targets())})")
