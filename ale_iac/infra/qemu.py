"""The ``qemu`` provider: a QEMU guest per unit (a real kernel), as a Pulumi dynamic resource.

As for ``local`` and ``docker``, the provider only calls the driver (``ale_iac.substrates.qemu.runtime``:
start, inspect, stop). The disk is the ``desktop`` recipe's qcow2 export (``images.ensure_qcow2_image``,
made by the provider's ``create`` if missing: declaring never needs QEMU); each unit gets a disposable
overlay and, by default, is restored from a memory state saved once per image and machine shape. The
shape gives the guest's vCPUs and memory. With ``runner: container``, QEMU runs in the ``qemu-runner``
image on the local Docker engine (built and imported locally, nothing pulled), from the same launch script.

The provider object is dill-pickled by reference (``ale_iac.infra.qemu.QemuSandboxProvider``): keep this
import path and keep it free of instance state, or destroying an existing stack's units breaks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, Resource, ResourceProvider

from ale_iac.contract import LINUX_DESKTOP_PATHS, UnitOutputs, UnitSpec
from ale_iac.images import require_image
from ale_iac.infra import DeclareContext
from ale_iac.infra.local import (
    home_of,
    identity_labels,
    name_prefix,
    new_sandbox_id,
    replace_on_change,
    sandbox_options,
)
from ale_iac.profile import QemuRoute

PROVIDER_KIND = "qemu"
RUNNER_IMAGE = "qemu-runner"
"""The recipe (images/qemu-runner) of the runner container."""
DEFAULT_VCPUS = 1
DEFAULT_MEMORY_GB = 2.0
INPUT_KEYS = (
    "name_prefix",
    "image_recipe",
    "image",
    "screen_width",
    "screen_height",
    "vcpus",
    "memory_gb",
    "restore",
    "runner",
    "ttl_hours",
    "labels",
)
"""Inputs of a QemuSandbox; a change to any of them replaces the guest."""
OUTPUT_KEYS = (
    "sandbox_id",
    "endpoint",
    "endpoint_token",
    "host_port",
    "unit_dir",
    "accel",
    "restored",
    "expires_at",
    "runner_image",
)
SECRET_OUTPUTS = ["endpoint_token"]


class QemuSandboxProvider(ResourceProvider):
    """CRUD of one unit guest. Stateless: everything it needs comes in the properties."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        from ale_iac.images import build_image, ensure_docker_image, ensure_qcow2_image
        from ale_iac.infra.cloud_common import expiry_for
        from ale_iac.substrates.qemu import runtime

        expiry = expiry_for(float(props.get("ttl_hours") or 24.0)).iso
        disk = ensure_qcow2_image(str(props["image_recipe"]))  # exported once per recipe hash
        runner = str(props.get("runner") or "host")
        runner_image = None
        if runner == "container":
            build_image(RUNNER_IMAGE)  # cached by recipe hash: built once
            runner_image = ensure_docker_image(RUNNER_IMAGE)
        spec = runtime.QemuSandboxSpec(
            sandbox_id=new_sandbox_id(str(props["name_prefix"])),
            disk=disk.disk,
            kernel=disk.kernel,
            initrd=disk.initrd,
            vcpus=int(props.get("vcpus") or DEFAULT_VCPUS),
            memory_mb=max(512, round(float(props.get("memory_gb") or DEFAULT_MEMORY_GB) * 1024)),
            screen_width=int(props.get("screen_width") or 1280),
            screen_height=int(props.get("screen_height") or 800),
            restore=bool(props.get("restore", True)),
            runner="container" if runner == "container" else "host",
            runner_image=runner_image,
            labels={str(k): str(v) for k, v in dict(props.get("labels") or {}).items()},
            expires_at=expiry,
        )
        state = runtime.start(spec)
        outs = {k: props[k] for k in INPUT_KEYS if k in props}
        outs.update(
            sandbox_id=state.sandbox_id,
            endpoint=state.endpoint,
            endpoint_token=state.token,
            host_port=state.host_port,
            unit_dir=str(state.unit_dir),
            accel=state.accel,
            restored=state.restored,
            expires_at=expiry,
            runner_image=runner_image,
        )
        return CreateResult(id_=state.sandbox_id, outs=outs)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        return replace_on_change(INPUT_KEYS, olds, news)

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        from ale_iac.substrates.qemu import runtime

        # Removed behind Pulumi's back: a refresh drops it. A stopped guest's folder stays for destroy.
        if runtime.inspect(id_, _home_of(props)) is None:
            return ReadResult(None, {})
        return ReadResult(id_, props)

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        from ale_iac.substrates.qemu import runtime

        runtime.stop(id_, _home_of(props))


def _home_of(props: dict[str, Any]) -> Path | None:
    return home_of(props, "unit_dir")


class QemuSandbox(Resource, module="ale", name="QemuSandbox"):
    """A unit guest (type token ``pulumi-python:dynamic/ale:QemuSandbox``)."""

    sandbox_id: pulumi.Output[str]
    endpoint: pulumi.Output[str]
    endpoint_token: pulumi.Output[str]
    host_port: pulumi.Output[int]
    unit_dir: pulumi.Output[str]
    accel: pulumi.Output[str]
    restored: pulumi.Output[bool]
    expires_at: pulumi.Output[str]

    def __init__(self, name: str, props: dict[str, Any], opts: pulumi.ResourceOptions | None = None) -> None:
        opts = sandbox_options("QemuSandbox", name, props, INPUT_KEYS, SECRET_OUTPUTS, opts)
        super().__init__(QemuSandboxProvider(), name, {**props, **dict.fromkeys(OUTPUT_KEYS)}, opts)


def declare_unit(unit: UnitSpec, snapshot: str, route: QemuRoute, ctx: DeclareContext) -> pulumi.Output[dict[str, Any]]:
    """Declare one unit guest for ``unit``; returns its ``UnitOutputs``-shaped handle."""
    image = require_image(route.image)
    shape = unit.shape.over(route.shape)
    labels = identity_labels(unit, ctx)
    props: dict[str, Any] = {
        "name_prefix": name_prefix(ctx.stack, unit.name),
        "image_recipe": route.image,
        "image": image.ref,
        "screen_width": route.screen_width,
        "screen_height": route.screen_height,
        "vcpus": shape.vcpus or DEFAULT_VCPUS,
        "memory_gb": shape.memory_gb or DEFAULT_MEMORY_GB,
        "restore": route.restore,
        "runner": route.runner,
        "ttl_hours": route.ttl_hours,
        "labels": labels,
    }
    sandbox = QemuSandbox(unit.name, props)

    def handle(values: list[Any]) -> dict[str, Any]:
        endpoint, token, sandbox_id, expires_at, urn = values
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
            transport="qemu",
            reset=route.reset,
            reset_urns=[str(urn)],
        ).to_output()

    result: pulumi.Output[dict[str, Any]] = pulumi.Output.all(
        sandbox.endpoint, sandbox.endpoint_token, sandbox.sandbox_id, sandbox.expires_at, sandbox.urn
    ).apply(handle)
    return result
