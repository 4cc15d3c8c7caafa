"""The ``local`` provider: a sandbox on this host (``local_runtime``) as a Pulumi dynamic resource.

Declaring it makes the sandbox part of a stack's state, so ``pulumi destroy`` (and ``ale-iac gc``
through the stack) removes it like any other resource.

The provider object is dill-pickled *by reference* into the resource's state
(``ale_iac.infra.local.LocalSandboxProvider``), and the engine's provider process unpickles it:
that process must import ``ale_iac`` (the engine runs it with ``PULUMI_PYTHON_CMD`` set to the
venv's python), and the class must keep this import path and stay free of instance state, or
deleting an existing stack's sandboxes breaks.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, Resource, ResourceProvider

from ale_iac.contract import LINUX_DESKTOP_PATHS, HostChannel, UnitOutputs, UnitSpec
from ale_iac.images import require_image
from ale_iac.infra import DeclareContext
from ale_iac.profile import LocalRoute

PROVIDER_KIND = "local"
INPUT_KEYS = (
    "name_prefix",
    "rootfs",
    "image",
    "screen_width",
    "screen_height",
    "allow_outbound",
    "vcpus",
    "memory_gb",
    "disk_gb",
    "pids_limit",
    "labels",
)
"""Inputs of a LocalSandbox; a change to any of them replaces the sandbox."""
OUTPUT_KEYS = (
    "sandbox_id",
    "endpoint",
    "endpoint_token",
    "host_port",
    "supervisor_pid",
    "state_dir",
    "limits",
    "gateway_socket",
    "gateway_url",
)
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


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


class LocalSandboxProvider(ResourceProvider):
    """CRUD of one local sandbox. Stateless: everything it needs comes in the properties."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        from ale_iac.substrates.local import runtime as local_runtime

        spec = local_runtime.LocalSandboxSpec(
            sandbox_id=new_sandbox_id(str(props["name_prefix"])),
            rootfs=str(props["rootfs"]),
            screen_width=int(props.get("screen_width") or 1280),
            screen_height=int(props.get("screen_height") or 800),
            allow_outbound=bool(props.get("allow_outbound", False)),
            vcpus=_optional_int(props.get("vcpus")),
            memory_gb=_optional_float(props.get("memory_gb")),
            disk_gb=int(props.get("disk_gb") or local_runtime.DEFAULT_DISK_GB),
            pids_limit=int(props.get("pids_limit") or local_runtime.DEFAULT_PIDS_LIMIT),
            labels={str(k): str(v) for k, v in dict(props.get("labels") or {}).items()},
        )
        state = local_runtime.start(spec)
        outs = {k: props[k] for k in INPUT_KEYS if k in props}
        outs.update(
            sandbox_id=state.sandbox_id,
            endpoint=state.endpoint,
            endpoint_token=local_runtime.auth_token(state),
            host_port=state.host_port,
            supervisor_pid=state.supervisor_pid,
            state_dir=state.state_dir,
            gateway_socket=state.gateway_socket,
            gateway_url=state.gateway_url,
            limits=[
                {"name": r.name, "requested": r.requested, "applied": r.applied, "detail": r.detail}
                for r in state.limits
            ],
        )
        return CreateResult(id_=state.sandbox_id, outs=outs)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        return replace_on_change(INPUT_KEYS, olds, news)

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        from ale_iac.substrates.local import runtime as local_runtime

        # Gone without a trace (state dir deleted): tell a refresh it no longer exists. A dead
        # sandbox whose state dir remains stays in the stack, so that destroy cleans it up.
        if local_runtime.load_state(id_, home=_home_of(props)) is None:
            return ReadResult(None, {})
        return ReadResult(id_, props)

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        from ale_iac.substrates.local import runtime as local_runtime

        local_runtime.stop(id_, home=_home_of(props))


def _home_of(props: dict[str, Any]) -> Path | None:
    return home_of(props, "state_dir")


def home_of(props: dict[str, Any], folder_key: str) -> Path | None:
    """The ale-iac home a host sandbox was created in, from the folder recorded at creation
    (``<home>/<kind>/<id>``, under ``props[folder_key]``).

    The provider process of a later ``destroy`` may run with another ``ALE_IAC_HOME``; the folder
    recorded at creation is where the sandbox really is.
    """
    folder = props.get(folder_key)
    return Path(str(folder)).parent.parent if folder else None


def replace_on_change(input_keys: Sequence[str], olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
    """A host sandbox cannot change in place: any changed input replaces it (the new one first)."""
    changed = [key for key in input_keys if olds.get(key) != news.get(key)]
    return DiffResult(changes=bool(changed), replaces=changed, delete_before_replace=False)


class LocalSandbox(Resource, module="ale", name="LocalSandbox"):
    """A local sandbox (type token ``pulumi-python:dynamic/ale:LocalSandbox``)."""

    sandbox_id: pulumi.Output[str]
    endpoint: pulumi.Output[str]
    endpoint_token: pulumi.Output[str]
    host_port: pulumi.Output[int]
    supervisor_pid: pulumi.Output[int]
    state_dir: pulumi.Output[str]
    limits: pulumi.Output[list[dict[str, Any]]]
    gateway_socket: pulumi.Output[str]
    gateway_url: pulumi.Output[str]

    def __init__(self, name: str, props: dict[str, Any], opts: pulumi.ResourceOptions | None = None) -> None:
        opts = sandbox_options("LocalSandbox", name, props, INPUT_KEYS, SECRET_OUTPUTS, opts)
        super().__init__(LocalSandboxProvider(), name, {**props, **dict.fromkeys(OUTPUT_KEYS)}, opts)


def sandbox_options(
    resource: str,
    name: str,
    props: dict[str, Any],
    input_keys: Sequence[str],
    secret_outputs: list[str],
    opts: pulumi.ResourceOptions | None,
) -> pulumi.ResourceOptions:
    """A host sandbox resource's options, once its properties are checked: its token is a secret output
    (encrypted in the state, shown as [secret] by plain pulumi)."""
    unknown = sorted(set(props) - set(input_keys))
    if unknown:
        raise ValueError(f"{resource} {name}: unknown properties {unknown}")
    secret = pulumi.ResourceOptions(additional_secret_outputs=secret_outputs)
    return pulumi.ResourceOptions.merge(opts, secret) if opts else secret


def identity_labels(unit: UnitSpec, ctx: DeclareContext) -> dict[str, str]:
    """A unit's labels plus its identity (stack, unit, profile), which wins over its own of those names."""
    labels = {str(k): str(v) for k, v in unit.labels.items()}
    labels.update(stack=ctx.stack, unit=unit.name, profile=ctx.profile)
    return labels


def declare_unit(
    unit: UnitSpec, snapshot: str, route: LocalRoute, ctx: DeclareContext
) -> pulumi.Output[dict[str, Any]]:
    """Declare one local sandbox for ``unit``; returns its ``UnitOutputs``-shaped handle."""
    image = require_image(route.image)
    shape = unit.shape.over(route.shape)
    labels = identity_labels(unit, ctx)
    props: dict[str, Any] = {
        "name_prefix": name_prefix(ctx.stack, unit.name),
        "rootfs": str(image.rootfs),
        "image": image.ref,
        "screen_width": route.screen_width,
        "screen_height": route.screen_height,
        "allow_outbound": route.allow_outbound,
        "vcpus": shape.vcpus,
        "memory_gb": shape.memory_gb,
        "disk_gb": shape.disk_gb,
        "pids_limit": route.pids_limit,
        "labels": labels,
    }
    sandbox = LocalSandbox(unit.name, props)

    def handle(values: list[Any]) -> dict[str, Any]:
        endpoint, token, sandbox_id, gateway_socket, gateway_url, urn = values
        channel = HostChannel(host_socket=gateway_socket, sandbox_url=gateway_url) if gateway_socket else None
        return UnitOutputs(
            unit=unit.name,
            provider=PROVIDER_KIND,
            endpoint=str(endpoint),
            endpoint_token=token,
            gateway_channel=channel,
            os="linux",
            snapshot=snapshot,
            image=image.ref,
            resource_id=str(sandbox_id),
            paths=LINUX_DESKTOP_PATHS,
            labels=labels,
            managed=True,
            reset=route.reset,
            reset_urns=[str(urn)],
        ).to_output()

    # The handle carries the token, so the whole output is secret (Output.all keeps secretness).
    result: pulumi.Output[dict[str, Any]] = pulumi.Output.all(
        sandbox.endpoint,
        sandbox.endpoint_token,
        sandbox.sandbox_id,
        sandbox.gateway_socket,
        sandbox.gateway_url,
        sandbox.urn,
    ).apply(handle)
    return result
