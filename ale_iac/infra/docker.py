"""The ``docker`` provider: a container per unit on the local Docker engine, as a Pulumi dynamic resource.

pulumi-docker's provider plugin cannot be installed on these machines, so the container is declared like
the ``local`` unit: a dynamic resource whose provider only calls the driver
(``ale_iac.substrates.docker.runtime``: create, inspect, stop). The image is the ``desktop`` recipe's
export into the engine (``images.ensure_docker_image``: ``ale-iac/desktop:<hash12>``), made by the
provider's ``create`` if the engine lacks it (declaring never needs an engine); nothing is pulled.

The provider object is dill-pickled by reference (``ale_iac.infra.docker.DockerSandboxProvider``): keep
this import path and keep it free of instance state, or destroying an existing stack's units breaks.
"""

from __future__ import annotations

from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, Resource, ResourceProvider

from ale_iac.contract import LINUX_DESKTOP_PATHS, UnitOutputs, UnitSpec
from ale_iac.images import ensure_docker_image, require_image
from ale_iac.infra import DeclareContext
from ale_iac.infra.local import identity_labels, name_prefix, new_sandbox_id, replace_on_change, sandbox_options
from ale_iac.profile import DockerRoute

PROVIDER_KIND = "docker"
INPUT_KEYS = (
    "name_prefix",
    "image_recipe",
    "image",
    "screen_width",
    "screen_height",
    "allow_outbound",
    "vcpus",
    "memory_gb",
    "shm_gb",
    "pids_limit",
    "ttl_hours",
    "labels",
)
"""Inputs of a DockerSandbox; a change to any of them replaces the container."""
OUTPUT_KEYS = (
    "image_tag",
    "sandbox_id",
    "container_id",
    "endpoint",
    "endpoint_token",
    "host_port",
    "expires_at",
    "limits",
)
SECRET_OUTPUTS = ["endpoint_token"]


class DockerSandboxProvider(ResourceProvider):
    """CRUD of one unit container. Stateless: everything it needs comes in the properties."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        from ale_iac.infra.cloud_common import expiry_for
        from ale_iac.substrates.docker import runtime

        expiry = expiry_for(float(props.get("ttl_hours") or 24.0)).iso
        tag = ensure_docker_image(str(props["image_recipe"]))  # exported once per recipe hash, never pulled
        spec = runtime.DockerSandboxSpec(
            sandbox_id=new_sandbox_id(str(props["name_prefix"])),
            image=tag,
            screen_width=int(props.get("screen_width") or 1280),
            screen_height=int(props.get("screen_height") or 800),
            allow_outbound=bool(props.get("allow_outbound", False)),
            vcpus=None if props.get("vcpus") is None else int(props["vcpus"]),
            memory_gb=None if props.get("memory_gb") is None else float(props["memory_gb"]),
            shm_gb=float(props.get("shm_gb") or runtime.DEFAULT_SHM_GB),
            pids_limit=int(props.get("pids_limit") or runtime.DEFAULT_PIDS_LIMIT),
            labels={str(k): str(v) for k, v in dict(props.get("labels") or {}).items()},
            expires_at=expiry,
        )
        state = runtime.start(spec)
        outs = {k: props[k] for k in INPUT_KEYS if k in props}
        outs.update(
            image_tag=tag,
            sandbox_id=state.sandbox_id,
            container_id=state.container_id,
            endpoint=state.endpoint,
            endpoint_token=state.token,
            host_port=state.host_port,
            expires_at=expiry,
            limits=[
                {"name": r.name, "requested": r.requested, "applied": r.applied, "detail": r.detail}
                for r in state.limits
            ],
        )
        return CreateResult(id_=state.sandbox_id, outs=outs)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        return replace_on_change(INPUT_KEYS, olds, news)

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        from ale_iac.substrates.docker import runtime

        # Removed behind Pulumi's back: a refresh drops it from the stack. A stopped container stays, so
        # that destroy removes it with its network and volumes.
        if runtime.inspect(id_) is None:
            return ReadResult(None, {})
        return ReadResult(id_, props)

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        from ale_iac.substrates.docker import runtime

        runtime.stop(id_)


class DockerSandbox(Resource, module="ale", name="DockerSandbox"):
    """A unit container (type token ``pulumi-python:dynamic/ale:DockerSandbox``)."""

    sandbox_id: pulumi.Output[str]
    container_id: pulumi.Output[str]
    endpoint: pulumi.Output[str]
    endpoint_token: pulumi.Output[str]
    host_port: pulumi.Output[int]
    expires_at: pulumi.Output[str]
    limits: pulumi.Output[list[dict[str, Any]]]

    def __init__(self, name: str, props: dict[str, Any], opts: pulumi.ResourceOptions | None = None) -> None:
        opts = sandbox_options("DockerSandbox", name, props, INPUT_KEYS, SECRET_OUTPUTS, opts)
        super().__init__(DockerSandboxProvider(), name, {**props, **dict.fromkeys(OUTPUT_KEYS)}, opts)


def declare_unit(
    unit: UnitSpec, snapshot: str, route: DockerRoute, ctx: DeclareContext
) -> pulumi.Output[dict[str, Any]]:
    """Declare one unit container for ``unit``; returns its ``UnitOutputs``-shaped handle."""
    image = require_image(route.image)
    shape = unit.shape.over(route.shape)
    labels = identity_labels(unit, ctx)
    props: dict[str, Any] = {
        "name_prefix": name_prefix(ctx.stack, unit.name),
        "image_recipe": route.image,
        "image": image.ref,
        "screen_width": route.screen_width,
        "screen_height": route.screen_height,
        "allow_outbound": route.allow_outbound,
        "vcpus": shape.vcpus,
        "memory_gb": shape.memory_gb,
        "shm_gb": route.shm_gb,
        "pids_limit": route.pids_limit,
        "ttl_hours": route.ttl_hours,
        "labels": labels,
    }
    sandbox = DockerSandbox(unit.name, props)

    def handle(values: list[Any]) -> dict[str, Any]:
        endpoint, token, sandbox_id, container_id, expires_at, urn = values
        return UnitOutputs(
            unit=unit.name,
            provider=PROVIDER_KIND,
            endpoint=str(endpoint),
            endpoint_token=token,
            os="linux",
            snapshot=snapshot,
            image=image.ref,
            resource_id=str(sandbox_id),
            paths=LINUX_DESKTOP_PATHS,
            labels=labels,
            expires_at=None if expires_at is None else str(expires_at),
            managed=True,
            transport="docker",
            container_id=None if container_id is None else str(container_id),
            reset=route.reset,
            reset_urns=[str(urn)],
        ).to_output()

    result: pulumi.Output[dict[str, Any]] = pulumi.Output.all(
        sandbox.endpoint,
        sandbox.endpoint_token,
        sandbox.sandbox_id,
        sandbox.container_id,
        sandbox.expires_at,
        sandbox.urn,
    ).apply(handle)
    return result
