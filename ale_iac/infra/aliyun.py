"""Alibaba Cloud ECS: one instance per unit, with its own security group, tags and auto-release.

Per unit, a ``ale-iac:aliyun:Unit`` component parents:

* ``<unit>-sg``: a VPC security group (``inner_access_policy = "Drop"``);
* ``<unit>-server-<i>``: one ``alicloud.ecs.SecurityGroupRule`` per allowed source range, accepting
  TCP to the computer-server port; ``<unit>-ssh-<i>`` only when the route lists SSH ranges;
* ``<unit>-metadata``, ``<unit>-deny-egress`` and ``-deny-egress-v6`` unless the route sets ``allow_outbound``
  (ECS security groups allow all outbound traffic by default): an accept of the metadata service at priority 1,
  then a drop of everything else, IPv4 and IPv6, at priority 2. A route's ``egress`` policy changes nothing
  here: its proxy runs on the runner, reached through the endpoint;
* ``<unit>-vm``: a pay-as-you-go instance in the route's vSwitch; a public IP only when the route
  does not ``reach_privately`` (``internet_max_bandwidth_out = 0`` allocates none).

TTL: ``auto_release_time`` (UTC, ``yyyy-MM-ddTHH:mm:ssZ``): ECS releases the instance itself at
that time. ECS requires it at least 30 minutes ahead, hence the route's ``ttl_hours >= 0.5``; it
only applies to pay-as-you-go instances, hence ``instance_charge_type = "PostPaid"``.
Security group rules cannot carry tags; their description names the unit, stack and run.

On ale-iac's own disk (``guest_agent``), ``<unit>-token`` is the unit's endpoint token
(``infra/endpoint_token.py``): the user data is then no script but ``key=value`` lines that the guest agent
reads from the metadata service (hardened mode, a session token first) at boot; it is secret, like the handle.

With ``image_import``, the program also declares the image once (shared by its units): ``image-<name>-disk``
(the qcow2's upload to the region's OSS bucket, when the route names a local ``source``) and ``image-<name>``,
an ``alicloud.ecs.ImageImport`` of it (BIOS boot) the instances boot from.

The region comes from one explicit ``alicloud.Provider`` per region and program
(``alicloud-<region>``): ECS resources have no region argument. Credentials come from the
environment (``ALIBABA_CLOUD_ACCESS_KEY_ID``/``_SECRET``, profiles, RAM roles), never from config.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_alicloud as alicloud

from ale_iac.cloud_routes import AliyunRoute
from ale_iac.contract import UnitSpec
from ale_iac.infra import DeclareContext, endpoint_token
from ale_iac.infra.cloud_common import (
    LABEL_EXPIRY,
    LABEL_STACK,
    LABEL_UNIT,
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
from ale_iac.infra.shapes import ResolvedShape, preflight

load_lazy_submodules(alicloud.ecs, alicloud.oss)  # before any program runs: not thread-safe once programs do

UNIT_TYPE = "ale-iac:aliyun:Unit"
DISK_IMAGE_GB = 8
"""The size of ale-iac's cloud disk (``substrates/qemu/cloud.py`` ``DISK_GB``), which ECS's import must be told."""
SSH_PORT = 22
METADATA_ADDRESS = "100.100.100.200"
"""ECS's instance metadata service (user data, the hardened mode's session token)."""
METADATA_PRIORITY = 1
EGRESS_WALL_PRIORITY = 2
"""The egress drop rules' priority: right after the metadata accept (ECS evaluates 1 first, 100 last)."""
_EXPIRY_TAG = f'tags["{LABEL_EXPIRY}"]'
"""The expiry tag's path, in ``ignore_changes``: a later ``pulumi up`` of a pool does not push it forward."""


def region_provider(region: str) -> alicloud.Provider:
    """The program's provider for ``region`` (created once, shared by every unit in the region)."""
    return shared_resource(  # type: ignore[no-any-return]
        f"alicloud:{region}", lambda: alicloud.Provider(f"alicloud-{region}", region=region)
    )


def user_data(route: AliyunRoute) -> str:
    """ECS runs user data once, at first boot; Windows user data needs the ``[powershell]`` line."""
    script = startup_script(route)
    return f"[powershell]\n{script}" if route.os == "windows" else script


class AliyunUnit(pulumi.ComponentResource):
    """One sandbox instance on ECS and the security group that makes it reachable (and only that)."""

    handle: pulumi.Output[dict[str, Any]]

    def __init__(
        self,
        name: str,
        unit: UnitSpec,
        snapshot: str,
        route: AliyunRoute,
        ctx: DeclareContext,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        # Shape first: a unit that cannot be sized fails before anything is registered.
        shape = preflight("aliyun", unit, route)
        super().__init__(UNIT_TYPE, name, None, opts)
        provider = region_provider(route.region)
        child = pulumi.ResourceOptions(parent=self, provider=provider)
        expiry = expiry_for(route.ttl_hours)
        labels = unit_labels(unit, snapshot, ctx, expiry, route.outbound)
        description = identity_text(labels)
        display_name = label_value(f"ale-{labels[LABEL_STACK]}-{labels[LABEL_UNIT]}")
        sg = alicloud.ecs.SecurityGroup(
            f"{name}-sg",
            vpc_id=route.vpc_id,
            security_group_name=display_name,
            security_group_type="normal",
            inner_access_policy="Drop",
            description=f"{description}: computer-server access",
            tags=labels,
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(ignore_changes=[_EXPIRY_TAG])),
        )
        rules = security_group_rules(name, route, sg, description, child)
        public = not route.reach_privately
        token = (
            endpoint_token.EndpointToken(f"{name}-token", pulumi.ResourceOptions(parent=self))
            if route.guest_agent
            else None
        )
        boot = endpoint_token.user_data(token.value, expiry.ttl_seconds) if token else user_data(route)
        image = boot_image(route, provider)
        instance = _instance(
            name, route, (image, boot), shape, sg, public, expiry.iso, display_name, description, labels, child
        )
        self.instance = instance
        self.rules: list[pulumi.CustomResource] = [sg, *rules]
        self.handle = unit_handle(
            unit=unit,
            snapshot=snapshot,
            route=route,
            region=route.region,
            address=instance.public_ip if public else instance.private_ip,
            resource_id=instance.id,
            reset_urn=instance.urn,
            root_urn=self.urn,
            resource_labels=instance.tags,
            labels=labels,
            depends_on=self.rules,
            token=token.value if token else None,
        )
        self.register_outputs({"handle": self.handle})


def security_group_rules(
    name: str, route: AliyunRoute, sg: alicloud.ecs.SecurityGroup, description: str, opts: pulumi.ResourceOptions
) -> list[pulumi.CustomResource]:
    """The security group's rules: ingress to the computer-server (and SSH, when the route lists ranges for
    it) from each of the route's ranges; a lowest-priority drop of all outbound traffic unless allowed."""
    rules: list[pulumi.CustomResource] = []

    def ingress(suffix: str, ranges: list[str], port: int) -> None:
        v4, v6 = split_ranges(ranges)
        for index, cidr in enumerate(v4 + v6):
            rule = alicloud.ecs.SecurityGroupRule(
                f"{name}-{suffix}-{index}",
                security_group_id=sg.id,
                type="ingress",
                ip_protocol="tcp",
                port_range=f"{port}/{port}",
                cidr_ip=cidr if cidr in v4 else None,
                ipv6_cidr_ip=cidr if cidr in v6 else None,
                policy="accept",
                priority=1,
                nic_type="intranet",
                description=f"{description}: {suffix}",
                opts=opts,
            )
            rules.append(rule)

    ingress("server", route.allowed_source_ranges, route.endpoint_port)
    if route.ssh_source_ranges:
        ingress("ssh", route.ssh_source_ranges, SSH_PORT)
    if not route.allow_outbound:
        rules += egress_walls(name, route, sg, description, opts)
    return rules


def egress_walls(
    name: str, route: AliyunRoute, sg: alicloud.ecs.SecurityGroup, description: str, opts: pulumi.ResourceOptions
) -> list[pulumi.CustomResource]:
    """All egress dropped, IPv4 and IPv6, at priority 2, after one accept at priority 1 (ECS evaluates 1 first):
    the metadata service (``100.100.100.200:80``), which cloud-init and the guest agent read at boot. Whether ECS
    security groups filter it is not documented, so it is declared rather than assumed. The unit needs nothing
    else: its egress policy's proxy runs on the runner and is reached through the endpoint (an ingress
    connection, whose replies a stateful security group lets back)."""

    def rule(suffix: str, policy: str, priority: int, **target: Any) -> alicloud.ecs.SecurityGroupRule:
        return alicloud.ecs.SecurityGroupRule(
            f"{name}-{suffix}",
            security_group_id=sg.id,
            type="egress",
            policy=policy,
            priority=priority,
            nic_type="intranet",
            opts=opts,
            **target,
        )

    return [
        rule(
            "metadata",
            "accept",
            METADATA_PRIORITY,
            ip_protocol="tcp",
            port_range="80/80",
            cidr_ip=f"{METADATA_ADDRESS}/32",
            description=f"{description}: the instance metadata service",
        ),
        *(
            rule(
                f"deny-egress{family}",
                "drop",
                EGRESS_WALL_PRIORITY,
                ip_protocol="all",
                port_range="-1/-1",
                description=f"{description}: {wall_text(route)}",
                **{key: everything},
            )
            for family, key, everything in (("", "cidr_ip", "0.0.0.0/0"), ("-v6", "ipv6_cidr_ip", "::/0"))
        ),
    ]


def boot_image(route: AliyunRoute, provider: alicloud.Provider) -> pulumi.Input[str]:
    """The image the instances boot from: the route's, or the one the program imports (declared once)."""
    if route.image_import is None:
        return route.image
    image: alicloud.ecs.ImageImport = shared_resource(
        f"aliyun-image:{route.region}/{route.image}", lambda: _import(route, provider)
    )
    return image.id


def _import(route: AliyunRoute, provider: alicloud.Provider) -> alicloud.ecs.ImageImport:
    """The image from the OSS bucket's qcow2 (an ECS image import), uploaded first when the route names a file."""
    imported = route.image_import
    assert imported is not None
    opts = pulumi.ResourceOptions(provider=provider)
    if imported.source is not None:
        upload = alicloud.oss.BucketObject(
            f"image-{route.image}-disk", bucket=imported.bucket, key=imported.object, source=imported.source, opts=opts
        )
        opts = pulumi.ResourceOptions(provider=provider, depends_on=[upload])
    return alicloud.ecs.ImageImport(
        f"image-{route.image}",
        image_name=route.image,
        architecture="x86_64",
        os_type="linux",
        platform="Debian",
        boot_mode="BIOS",
        license_type="BYOL",
        description=f"ale-iac desktop disk, imported from oss://{imported.bucket}/{imported.object}",
        disk_device_mappings=[
            alicloud.ecs.ImageImportDiskDeviceMappingArgs(
                oss_bucket=imported.bucket, oss_object=imported.object, format="qcow2", disk_image_size=DISK_IMAGE_GB
            )
        ],
        opts=opts,
    )


def _instance(
    name: str,
    route: AliyunRoute,
    boot: tuple[pulumi.Input[str], pulumi.Input[str]],
    shape: ResolvedShape,
    sg: alicloud.ecs.SecurityGroup,
    public: bool,
    release_at: str,
    display_name: str,
    description: str,
    labels: dict[str, str],
    opts: pulumi.ResourceOptions,
) -> alicloud.ecs.Instance:
    """The pay-as-you-go instance ECS releases itself at ``release_at``, from ``boot`` (its image and user data);
    a public IP (and its bandwidth) only when the route reaches it publicly."""
    return alicloud.ecs.Instance(
        f"{name}-vm",
        image_id=boot[0],
        instance_type=shape.machine_type,
        instance_name=display_name,
        vswitch_id=route.vswitch_id,
        security_groups=[sg.id],
        instance_charge_type="PostPaid",
        spot_strategy="NoSpot",
        auto_release_time=release_at,
        internet_max_bandwidth_out=route.public_bandwidth_mbps if public else 0,
        internet_charge_type="PayByTraffic" if public else None,
        system_disk_category="cloud_essd",
        system_disk_size=shape.disk_gb,
        key_name=route.key_name,
        user_data=boot[1],
        http_tokens="required",
        deletion_protection=False,
        description=description,
        tags=labels,
        volume_tags=labels,
        opts=pulumi.ResourceOptions.merge(
            opts,
            pulumi.ResourceOptions(ignore_changes=["autoReleaseTime", _EXPIRY_TAG, f'volumeTags["{LABEL_EXPIRY}"]']),
        ),
    )


def declare_unit(
    unit: UnitSpec, snapshot: str, route: AliyunRoute, ctx: DeclareContext
) -> pulumi.Output[dict[str, Any]]:
    """Declare one unit on ECS and return its handle (the ``UnitOutputs`` dict, as an Output)."""
    return AliyunUnit(unit_slug(unit.name), unit, snapshot, route, ctx).handle
