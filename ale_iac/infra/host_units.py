"""Units of the host substrates (``local``, ``docker``, ``qemu``: ``ale_iac.substrates.registry``) as one Pulumi
dynamic resource.

Declaring a unit makes it part of a stack's state, so ``pulumi destroy`` (and ``ale-iac gc`` through the stack)
removes it like any other resource. One provider serves every substrate: its CRUD validates the properties into
the substrate's typed inputs (``Substrate.inputs_model``) and calls the substrate; the resource's type name is
the substrate's (``pulumi-python:dynamic/ale:LocalSandbox``, ``...:DockerSandbox``, ``...:QemuSandbox``), so a
stack keeps its resources' URNs whichever version made it.

The provider object is dill-pickled *by reference* into each resource's state
(``ale_iac.infra.host_units.HostUnitProvider``), and the engine's provider process unpickles it: that process
must import ``ale_iac`` (the engine runs it with the venv's python), and the class must keep its import path
and stay free of instance state. Stacks made before this module pickled a provider per substrate; those paths
are kept as subclasses (``ale_iac/infra/legacy_providers.py``), so such a stack's units can still be destroyed.
"""

from __future__ import annotations

import functools
import re
import secrets
import types
from typing import Any, ClassVar

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, Resource, ResourceProvider

from ale_iac.contract import UnitSpec
from ale_iac.infra import DeclareContext
from ale_iac.profile import HostRoute
from ale_iac.substrates import registry
from ale_iac.substrates.registry import AnySubstrate

SUBSTRATE_KEY = "substrate"
"""The property naming the unit's substrate (not an input: a stack made before does not have it)."""
SECRET_OUTPUTS = ["endpoint_token"]
_SUFFIX_BYTES = 3  # six hex digits
_PREFIX_MAX = 48 - 1 - 2 * _SUFFIX_BYTES


def name_prefix(*parts: str) -> str:
    """Safe sandbox-id prefix from names: lowercase ``[a-z0-9-]``, no runs of '-', bounded length."""
    raw = "-".join(parts).lower()
    cleaned = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", raw)).strip("-")
    return (cleaned[:_PREFIX_MAX].rstrip("-")) or "sandbox"


def new_sandbox_id(prefix: str) -> str:
    """``<prefix>-<6 hex>``: unique per creation, so a replacement never collides with the old one."""
    return f"{name_prefix(prefix)}-{secrets.token_hex(_SUFFIX_BYTES)}"


def identity_labels(unit: UnitSpec, ctx: DeclareContext) -> dict[str, str]:
    """A unit's labels plus its identity (stack, unit, profile), which wins over its own of those names."""
    labels = {str(k): str(v) for k, v in unit.labels.items()}
    labels.update(stack=ctx.stack, unit=unit.name, profile=ctx.profile)
    return labels


class HostUnitProvider(ResourceProvider):
    """CRUD of one unit of a host substrate. Stateless: everything it needs comes in the properties."""

    substrate_name: ClassVar[str | None] = None
    """The substrate of a stack made before units recorded theirs (set by the legacy subclasses)."""

    def _substrate(self, props: dict[str, Any]) -> AnySubstrate:
        return registry.get(str(props.get(SUBSTRATE_KEY) or self.substrate_name))

    def create(self, props: dict[str, Any]) -> CreateResult:
        substrate = self._substrate(props)
        fields = substrate.inputs_model.model_fields
        inputs = substrate.inputs_model.model_validate({k: v for k, v in props.items() if k in fields})
        state = substrate.create(new_sandbox_id(inputs.name_prefix), inputs)
        outs = {**inputs.model_dump(mode="json"), SUBSTRATE_KEY: substrate.name, **state.model_dump(mode="json")}
        return CreateResult(id_=state.sandbox_id, outs=outs)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        """A host unit cannot change in place: any changed input replaces it (the new one first). An input a
        unit made by an older ale-iac lacks counts as its default, so a new field does not replace it."""
        fields = self._substrate(news).inputs_model.model_fields

        def value(props: dict[str, Any], key: str) -> Any:
            return props[key] if key in props else fields[key].get_default(call_default_factory=True)

        changed = [key for key in fields if value(olds, key) != value(news, key)]
        return DiffResult(changes=bool(changed), replaces=changed, delete_before_replace=False)

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        # Gone without a trace: a refresh drops it from the stack. What is left of a dead unit stays, so that
        # destroy cleans it up.
        substrate = self._substrate(props)
        if not substrate.exists(id_, substrate.home_of(props)):
            return ReadResult(None, {})
        return ReadResult(id_, props)

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        substrate = self._substrate(props)
        substrate.destroy(id_, substrate.home_of(props))


@functools.cache
def resource_class(substrate: str) -> type[Resource]:
    """The Pulumi resource class of ``substrate``'s units (type ``pulumi-python:dynamic/ale:<its type name>``)."""
    type_name = registry.get(substrate).resource_type
    return types.new_class(type_name, (Resource,), {"module": "ale", "name": type_name})


def declare_unit(unit: UnitSpec, snapshot: str, route: HostRoute, ctx: DeclareContext) -> pulumi.Output[dict[str, Any]]:
    """Declare one unit of the route's substrate; returns its ``UnitOutputs``-shaped handle (a secret output:
    it carries the endpoint's token)."""
    substrate = registry.get(route.provider)
    inputs = substrate.inputs_for(unit, route, name_prefix(ctx.stack, unit.name), identity_labels(unit, ctx))
    state_keys = list(substrate.state_model.model_fields)
    props = {**inputs.model_dump(mode="json"), SUBSTRATE_KEY: substrate.name, **dict.fromkeys(state_keys)}
    opts = pulumi.ResourceOptions(additional_secret_outputs=SECRET_OUTPUTS)
    resource = resource_class(substrate.name)(HostUnitProvider(), unit.name, props, opts)

    def handle(values: list[Any]) -> dict[str, Any]:
        *state_values, urn = values
        # An output a stack made by an older version lacks is None here: the model's default stands in.
        present = {key: value for key, value in zip(state_keys, state_values, strict=True) if value is not None}
        state = substrate.state_model.model_validate(present)
        return substrate.outputs_for(unit, snapshot, route, inputs, state, str(urn)).to_output()

    outputs = [getattr(resource, key) for key in state_keys]
    result: pulumi.Output[dict[str, Any]] = pulumi.Output.all(*outputs, resource.urn).apply(handle)
    return result
