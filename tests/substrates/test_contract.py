"""Every registered substrate provides the whole contract (``ale_iac.substrates.base``), and the rest of the
package asks the registry, never a particular substrate."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import pytest

from ale_iac import profile
from ale_iac.contract import LINUX_DESKTOP_PATHS, UnitOutputs, UnitSpec
from ale_iac.errors import AleIacError
from ale_iac.images import ImageInfo
from ale_iac.substrates import registry
from ale_iac.substrates.base import (
    Capability,
    HostCheck,
    MissingCapabilityError,
    Substrate,
    UnitInputs,
    UnitState,
    require,
)
from tests.support.source_scan import scan

PACKAGE = Path(__file__).resolve().parents[2] / "ale_iac"
NAMES = registry.names()


def _unit(provider: str, **fields: Any) -> UnitOutputs:
    values: dict[str, Any] = {
        "unit": "u0",
        "provider": provider,
        "endpoint": "http://127.0.0.1:1",
        "snapshot": "s",
        "image": "desktop",
        "resource_id": "u0-abcdef",
        "paths": LINUX_DESKTOP_PATHS,
        "managed": True,
    }
    return UnitOutputs(**{**values, **fields})


def _overrides(substrate: Substrate[Any, Any, Any], method: str) -> bool:
    return getattr(type(substrate), method) is not getattr(Substrate, method)


@pytest.mark.parametrize("name", NAMES)
def test_each_substrate_is_whole_and_typed(name: str) -> None:
    substrate = registry.get(name)  # a Substrate that left an abstract method out cannot be made
    assert isinstance(substrate, Substrate) and substrate.name == name
    assert issubclass(substrate.inputs_model, UnitInputs) and issubclass(substrate.state_model, UnitState)
    inputs, outputs = set(substrate.inputs_model.model_fields), set(substrate.state_model.model_fields)
    assert not inputs & outputs, "inputs and outputs share the resource's property names"
    assert "substrate" not in inputs | outputs
    assert substrate.folder_output in outputs | {""}
    route = next(r for r in profile.ROUTE_TYPES if get_args(r.model_fields["provider"].annotation) == (name,))
    assert issubclass(route, profile.HostRoute), f"the {name} route has what every host route has"


@pytest.mark.parametrize("name", NAMES)
def test_a_capability_is_had_whole_or_not_at_all(name: str) -> None:
    substrate = registry.get(name)
    has = substrate.capabilities
    assert (Capability.BULK_TRANSPORT in has) == (substrate.transport is not None)
    assert (Capability.RESTORE in has) == _overrides(substrate, "reset")
    assert (Capability.LIMITS in has) == _overrides(substrate, "limits")
    assert bool(substrate.image_exports) == _overrides(substrate, "export_image")
    channel = substrate.model_channel()  # what the handles carry as gateway_channel
    assert (Capability.HOST_CHANNEL in has) == (channel is not None)
    assert channel is None or channel.sandbox_url == "http://127.0.0.1:4010"


def test_the_contract_s_forwarder_channel_is_the_forwarder_s_model_port() -> None:
    """The declaring side (a cloud VM of ale-iac's disk, a static forwarder) names the port without importing the
    forwarder, which is copied into units as a file of its own: the two must agree."""
    from ale_iac.contract import FORWARDER_MODEL_PORT, forwarder_channel
    from ale_iac.substrates.authproxy import EGRESS_PORT, MODEL_PORT

    assert (FORWARDER_MODEL_PORT, FORWARDER_MODEL_PORT + 1) == (MODEL_PORT, EGRESS_PORT)
    assert forwarder_channel().sandbox_url == f"http://127.0.0.1:{MODEL_PORT}"


def test_names_and_resource_types_are_unique() -> None:
    types = [registry.get(name).resource_type for name in NAMES]
    assert len(set(types)) == len(types) == len(NAMES)
    with pytest.raises(AleIacError, match=r"no substrate 'kvm' \(known: local, docker, qemu\)"):
        registry.get("kvm")


@pytest.mark.parametrize("name", NAMES)
def test_a_missing_capability_is_refused_naming_the_substrate_and_the_capability(name: str) -> None:
    substrate = registry.get(name)
    for capability in Capability:
        if capability in substrate.capabilities:
            require(substrate, capability)
            continue
        with pytest.raises(MissingCapabilityError) as refused:
            registry.require_of(_unit(name), capability, "asked by the test")
        assert str(refused.value) == f"the {name} substrate does not provide {capability.value}: asked by the test"
    if Capability.RESTORE not in substrate.capabilities:
        with pytest.raises(MissingCapabilityError, match=name):
            substrate.reset("u0-abcdef")


def test_a_unit_of_no_substrate_is_refused_too() -> None:
    assert registry.of_unit(_unit("gcloud")) is None
    assert registry.of_unit(_unit("local", managed=False)) is None
    with pytest.raises(AleIacError, match="unit u0 runs on gcloud, which is no host substrate: it has no restore"):
        registry.require_of(_unit("gcloud"), Capability.RESTORE)


@pytest.mark.parametrize("name", NAMES)
def test_host_checks_say_what_the_host_has(name: str) -> None:
    checks = registry.get(name).host_checks()
    assert checks and all(isinstance(check, HostCheck) and check.name and check.detail for check in checks)


@pytest.mark.image
@pytest.mark.parametrize("name", NAMES)
def test_inputs_come_from_the_route_and_the_unit(name: str, desktop_image: ImageInfo) -> None:
    substrate = registry.get(name)
    route = profile.parse_profile({"name": "p", "snapshots": {"s": {"provider": name}}}, "test").profile.route("s")[1]
    assert isinstance(route, profile.HostRoute)
    unit = UnitSpec(name="u0", shape=profile.Shape(vcpus=1, memory_gb=2))
    inputs = substrate.inputs_for(unit, route, "stack-u0", {"stack": "stack"})
    assert inputs.image == desktop_image.ref and inputs.name_prefix == "stack-u0"
    assert inputs.labels == {"stack": "stack"} and inputs.screen_width == route.screen_width
    dumped = inputs.model_dump(mode="json")
    assert substrate.inputs_model.model_validate(dumped) == inputs  # what the state keeps reads back the same
    assert None not in (dumped.get("vcpus"), dumped.get("memory_gb")), "the unit's shape reaches the inputs"


# --- the rest of the package asks the registry ------------------------------------------------------


def _outside_substrates() -> list[Path]:
    return [path for path in PACKAGE.rglob("*.py") if "substrates" not in path.relative_to(PACKAGE).parts]


def test_no_module_outside_the_substrates_imports_a_particular_one() -> None:
    particular = tuple(f"ale_iac.substrates.{name}" for name in NAMES)
    found = [
        f"{path}: {module}"
        for path, source in scan(_outside_substrates()).items()
        for module in [*source.imports, *source.from_names]
        if module in particular or module.startswith(tuple(f"{p}." for p in particular))
    ]
    assert found == []


def test_no_code_outside_the_substrates_branches_on_a_substrate_s_name() -> None:
    """``unit.provider == "docker"``, ``handle.transport != "qemu"``, ``provider in ("local", ...)``: the
    registry answers these questions."""
    found = [
        f"{path}:{compare.line}"
        for path, source in scan(_outside_substrates()).items()
        for compare in source.compares
        if {"provider", "transport"} & set(compare.attributes) and set(NAMES) & set(compare.strings)
    ]
    assert found == []
