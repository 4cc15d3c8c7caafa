"""GCE: one VM per unit, with its own firewall rules, labels and a cloud-side time-to-live.

Per unit, a ``ale-iac:gcloud:Unit`` component parents:

* the VM: ``gcp.compute.Instance`` from an image, or ``gcp.compute.InstanceFromMachineImage`` when
  the route's image is a machine image (``.../global/machineImages/X``: ALE publishes its desktops
  that way; a machine image fixes the disks, so ``disk_gb`` cannot apply and is reported as a
  warning);
* ``<unit>-server`` (and ``-server-v6``): ingress to the computer-server port from the route's
  ``allowed_source_ranges`` only, targeted at a network tag unique to the unit;
* ``<unit>-ssh`` only when the route lists ``ssh_source_ranges``;
* ``<unit>-deny-egress`` and ``-deny-egress-v6`` (all egress denied at priority 0, before any allow of the
  VPC) unless the route sets ``allow_outbound``; with an ``egress`` policy too, whose proxy runs on the runner
  (the metadata server stays reachable: GCE firewalls never apply to it);
* ``<unit>-token`` when the route's image is ale-iac's own disk (``guest_agent``): the unit's endpoint token
  (``infra/endpoint_token.py``), given to the VM as the secret instance attribute ``ale-endpoint-token``,
  which the guest agent reads from the metadata server at boot; the firewall then opens the forwarder's
  port, and the handle carries the token (a secret output).

With ``image_import``, the program also declares the image once (shared by its units): ``image-<name>``, a
``gcp.compute.Image`` from the bucket's ``disk.raw`` ``.tar.gz`` (and ``image-<name>-disk``, the object's
upload, when the route names a local ``source``); the VMs boot from that resource.

TTL: ``scheduling.max_run_duration`` = the route's ``ttl_hours`` with
``instance_termination_action = "DELETE"``: GCE deletes the VM itself, even if the runner is gone.
GCE firewall rules cannot carry labels, so their description names the unit, stack and run.
The VM gets no service account (no cloud API access from inside the sandbox) and OS Login for SSH.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_gcp as gcp

from ale_iac.cloud_routes import GcloudRoute
from ale_iac.contract import UnitSpec
from ale_iac.infra import DeclareContext
from ale_iac.infra.cloud_common import (
    LABEL_EXPIRY,
    LABEL_MANAGED_BY,
    LABEL_STACK,
    MANAGED_BY,
    digest,
    expiry_for,
    identity_text,
    label_value,
    load_lazy_submodules,
    shared_resource,
    split_ranges,
    startup_script,
    unit_handle,
    unit_labels,
    unit_slug,
    wall_text,
)
from ale_iac.infra.endpoint_token import TOKEN_KEY, TTL_KEY, EndpointToken
from ale_iac.infra.shapes import ResolvedShape, preflight

load_lazy_submodules(gcp.compute, gcp.storage)  # before any program runs: not thread-safe once programs do

UNIT_TYPE = "ale-iac:gcloud:Unit"
SSH_PORT = 22
EGRESS_WALL_PRIORITY = 0
"""The deny-all egress rules' priority: the first GCE evaluates (see :func:`egress_walls`)."""
_HYPERDISK_FAMILIES = ("c4-", "c4a-", "c4d-", "n4-", "m4-", "x4-", "a4-")
_EXPIRY_LABEL = f'labels["{LABEL_EXPIRY}"]'
"""The expiry label's path, in ``ignore_changes``: a later ``pulumi up`` of a pool does not push it forward."""


def network_tag(unit: UnitSpec, ctx: DeclareContext) -> str:
    """A network tag unique to the unit across stacks and projects (firewalls target it)."""
    scope = f"{pulumi.get_project()}/{ctx.stack}/{unit.name}"
    return label_value(f"ale-{unit_slug(unit.name)[:40]}-{digest(scope, 10)}")


def boot_disk_type(machine_type: str) -> str:
    """C4/N4/... machines only take Hyperdisk; the others get balanced persistent disk."""
    return "hyperdisk-balanced" if machine_type.startswith(_HYPERDISK_FAMILIES) else "pd-balanced"


class GcloudUnit(pulumi.ComponentResource):
    """One sandbox VM on GCE and the firewall rules that make it reachable (and only that)."""

    handle: pulumi.Output[dict[str, Any]]

    def __init__(
        self,
        name: str,
        unit: UnitSpec,
        snapshot: str,
        route: GcloudRoute,
        ctx: DeclareContext,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        # Shape first: a unit that cannot be sized fails before anything is registered.
        shape = preflight("gcloud", unit, route)
        super().__init__(UNIT_TYPE, name, None, opts)
        expiry = expiry_for(route.ttl_hours)
        labels = unit_labels(unit, snapshot, ctx, expiry, route.outbound)
        tag = network_tag(unit, ctx)
        description = identity_text(labels)
        self.rules: list[pulumi.CustomResource] = firewall_rules(
            name, route, tag, description, pulumi.ResourceOptions(parent=self)
        )
        token = EndpointToken(f"{name}-token", pulumi.ResourceOptions(parent=self)) if route.guest_agent else None
        metadata = instance_metadata(route, token.value if token else None, expiry.ttl_seconds)
        settings = instance_settings(route, shape, labels, tag, description, metadata)
        public = not route.reach_privately
        instance: gcp.compute.Instance | gcp.compute.InstanceFromMachineImage
        if route.uses_machine_image:
            if shape.disk_gb is not None:
                pulumi.log.warn(
                    f"unit {unit.name}: disk_gb={shape.disk_gb} is not applied; the machine image "
                    f"{route.image} fixes the disk size"
                )
            instance = _machine_image_vm(name, route, shape, expiry.ttl_seconds, public, settings, self)
        else:
            image = boot_image(route, ctx)
            instance = _image_vm(name, image, route, shape, expiry.ttl_seconds, public, labels, settings, self)
        nic = instance.network_interfaces[0]
        self.instance = instance
        self.handle = unit_handle(
            unit=unit,
            snapshot=snapshot,
            route=route,
            region=route.zone,
            address=nic.access_configs[0].nat_ip if public else nic.network_ip,
            resource_id=instance.id,
            reset_urn=instance.urn,
            root_urn=self.urn,
            resource_labels=instance.labels,
            labels=labels,
            depends_on=self.rules,
            token=token.value if token else None,
        )
        self.register_outputs({"handle": self.handle})


def firewall_rules(
    name: str, route: GcloudRoute, tag: str, description: str, opts: pulumi.ResourceOptions
) -> list[pulumi.CustomResource]:
    """The unit's firewall rules, all targeted at its network tag: ingress to the computer-server (and SSH,
    when the route lists ranges for it) from the route's ranges only; all egress denied unless allowed."""
    rules: list[pulumi.CustomResource] = []

    def ingress(suffix: str, ranges: list[str], port: int) -> None:
        for family, family_ranges in zip(("", "-v6"), split_ranges(ranges), strict=True):
            if family_ranges:
                firewall = gcp.compute.Firewall(
                    f"{name}-{suffix}{family}",
                    project=route.project,
                    network=route.network,
                    direction="INGRESS",
                    priority=1000,
                    source_ranges=family_ranges,
                    target_tags=[tag],
                    allows=[gcp.compute.FirewallAllowArgs(protocol="tcp", ports=[str(port)])],
                    description=description,
                    opts=opts,
                )
                rules.append(firewall)

    ingress("server", route.allowed_source_ranges, route.endpoint_port)
    if route.ssh_source_ranges:
        ingress("ssh", route.ssh_source_ranges, SSH_PORT)
    if not route.allow_outbound:
        rules += egress_walls(name, route, tag, description, opts)
    return rules


def egress_walls(
    name: str, route: GcloudRoute, tag: str, description: str, opts: pulumi.ResourceOptions
) -> list[pulumi.CustomResource]:
    """All egress denied, IPv4 and IPv6, at priority 0: GCE evaluates the lowest number first and a deny wins a
    tie, so no allow rule of the VPC (a project-wide one included) lets the VM out. The unit needs no outbound:
    its egress policy's proxy runs on the runner and is reached through the endpoint (an ingress connection,
    whose replies a stateful firewall lets back). The metadata server is never subject to firewalls."""
    walls: list[pulumi.CustomResource] = []
    for family, everything in (("", "0.0.0.0/0"), ("-v6", "::/0")):
        wall = gcp.compute.Firewall(
            f"{name}-deny-egress{family}",
            project=route.project,
            network=route.network,
            direction="EGRESS",
            priority=EGRESS_WALL_PRIORITY,
            destination_ranges=[everything],
            target_tags=[tag],
            denies=[gcp.compute.FirewallDenyArgs(protocol="all")],
            description=f"{description}: {wall_text(route)}",
            opts=opts,
        )
        walls.append(wall)
    return walls


def instance_metadata(
    route: GcloudRoute, token: pulumi.Output[str] | None = None, ttl_seconds: int | None = None
) -> dict[str, pulumi.Input[str]]:
    """The VM's metadata: the startup script (PowerShell on Windows); on Linux, SSH through OS Login only. On
    ale-iac's own disk, the unit's token (a secret) and the guest's time-to-live instead of a startup script."""
    if token is not None:
        ttl = {TTL_KEY: str(ttl_seconds)} if ttl_seconds else {}
        return {TOKEN_KEY: token, **ttl, "enable-oslogin": "TRUE", "block-project-ssh-keys": "TRUE"}
    script = startup_script(route)
    if route.os == "windows":
        return {"windows-startup-script-ps1": script}
    return {"startup-script": script, "enable-oslogin": "TRUE", "block-project-ssh-keys": "TRUE"}


def boot_image(route: GcloudRoute, ctx: DeclareContext) -> pulumi.Input[str]:
    """What the boot disk is made from: the route's image, or the image the program imports (declared once)."""
    if route.image_import is None:
        return route.image
    image: gcp.compute.Image = shared_resource(f"gce-image:{route.project}/{route.image}", lambda: _import(route, ctx))
    return image.self_link


def _import(route: GcloudRoute, ctx: DeclareContext) -> gcp.compute.Image:
    """The image from the bucket's ``disk.raw`` archive, uploaded first when the route names a local file."""
    imported = route.image_import
    assert imported is not None
    source: pulumi.Input[str] = f"https://storage.googleapis.com/{imported.bucket}/{imported.object}"
    if imported.source is not None:
        upload = gcp.storage.BucketObject(
            f"image-{route.image}-disk",
            bucket=imported.bucket,
            name=imported.object,
            source=pulumi.FileAsset(imported.source),
            content_type="application/gzip",
        )
        source = pulumi.Output.concat("https://storage.googleapis.com/", upload.bucket, "/", upload.name)
    return gcp.compute.Image(
        f"image-{route.image}",
        name=route.image,
        project=route.project,
        raw_disk=gcp.compute.ImageRawDiskArgs(source=source),
        guest_os_features=[gcp.compute.ImageGuestOsFeatureArgs(type="VIRTIO_SCSI_MULTIQUEUE")],
        labels={LABEL_MANAGED_BY: MANAGED_BY, LABEL_STACK: label_value(ctx.stack)},
        description=f"ale-iac desktop disk, imported from gs://{imported.bucket}/{imported.object}",
    )


def instance_settings(
    route: GcloudRoute,
    shape: ResolvedShape,
    labels: dict[str, str],
    tag: str,
    description: str,
    metadata: dict[str, pulumi.Input[str]],
) -> dict[str, Any]:
    """The arguments both kinds of VM take alike (from an image or from a machine image)."""
    return {
        "project": route.project,
        "zone": route.zone,
        "machine_type": shape.machine_type,
        "labels": labels,
        "tags": [tag],
        "metadata": metadata,
        "deletion_protection": False,
        "allow_stopping_for_update": True,
        "enable_display": route.os == "windows",
        "description": description,
    }


def _machine_image_vm(
    name: str,
    route: GcloudRoute,
    shape: ResolvedShape,
    ttl_seconds: int,
    public: bool,
    settings: dict[str, Any],
    parent: pulumi.Resource,
) -> gcp.compute.InstanceFromMachineImage:
    """The VM from a machine image (its disks come from the image: no boot disk arguments)."""
    return gcp.compute.InstanceFromMachineImage(
        f"{name}-vm",
        source_machine_image=route.image,
        network_interfaces=[
            gcp.compute.InstanceFromMachineImageNetworkInterfaceArgs(
                network=route.network,
                subnetwork=route.subnetwork,
                access_configs=[gcp.compute.InstanceFromMachineImageNetworkInterfaceAccessConfigArgs()]
                if public
                else [],
            )
        ],
        scheduling=gcp.compute.InstanceFromMachineImageSchedulingArgs(
            provisioning_model="STANDARD",
            on_host_maintenance="TERMINATE" if shape.gpu else "MIGRATE",
            max_run_duration=gcp.compute.InstanceFromMachineImageSchedulingMaxRunDurationArgs(seconds=ttl_seconds),
            instance_termination_action="DELETE",
        ),
        guest_accelerators=[gcp.compute.InstanceFromMachineImageGuestAcceleratorArgs(type=shape.accelerator, count=1)]
        if shape.accelerator
        else None,
        opts=pulumi.ResourceOptions(parent=parent, ignore_changes=[_EXPIRY_LABEL]),
        **settings,
    )


def _image_vm(
    name: str,
    image: pulumi.Input[str],
    route: GcloudRoute,
    shape: ResolvedShape,
    ttl_seconds: int,
    public: bool,
    labels: dict[str, str],
    settings: dict[str, Any],
    parent: pulumi.Resource,
) -> gcp.compute.Instance:
    """The VM from an image, with a boot disk of the shape's size and type, labelled like the VM."""
    return gcp.compute.Instance(
        f"{name}-vm",
        boot_disk=gcp.compute.InstanceBootDiskArgs(
            auto_delete=True,
            initialize_params=gcp.compute.InstanceBootDiskInitializeParamsArgs(
                image=image,
                size=shape.disk_gb,
                type=boot_disk_type(shape.machine_type),
                labels=labels,
            ),
        ),
        network_interfaces=[
            gcp.compute.InstanceNetworkInterfaceArgs(
                network=route.network,
                subnetwork=route.subnetwork,
                access_configs=[gcp.compute.InstanceNetworkInterfaceAccessConfigArgs()] if public else [],
            )
        ],
        scheduling=gcp.compute.InstanceSchedulingArgs(
            provisioning_model="STANDARD",
            on_host_maintenance="TERMINATE" if shape.gpu else "MIGRATE",
            max_run_duration=gcp.compute.InstanceSchedulingMaxRunDurationArgs(seconds=ttl_seconds),
            instance_termination_action="DELETE",
        ),
        guest_accelerators=[gcp.compute.InstanceGuestAcceleratorArgs(type=shape.accelerator, count=1)]
        if shape.accelerator
        else None,
        opts=pulumi.ResourceOptions(
            parent=parent, ignore_changes=[_EXPIRY_LABEL, f"bootDisk.initializeParams.{_EXPIRY_LABEL}"]
        ),
        **settings,
    )


def declare_unit(
    unit: UnitSpec, snapshot: str, route: GcloudRoute, ctx: DeclareContext
) -> pulumi.Output[dict[str, Any]]:
    """Declare one unit on GCE and return its handle (the ``UnitOutputs`` dict, as an Output)."""
    return GcloudUnit(unit_slug(unit.name), unit, snapshot, route, ctx).handle
