"""EC2: one instance per unit, with its own security group, tags and a time-to-live.

Per unit, a ``ale-iac:aws:Unit`` component parents:

* ``<unit>-sg``: a security group whose inline egress is declared empty (``egress: []``): the AWS provider
  removes the default allow-all egress rule at creation, and an empty list keeps it empty (a rule added out of
  band goes at the next update), so the instance has **no outbound network**, IPv4 or IPv6, unless the route
  sets ``allow_outbound`` (then no inline egress, and ``<unit>-egress`` allows it). A route's ``egress`` policy
  changes nothing here: its proxy runs on the runner, reached through the endpoint. Security groups never
  filter the instance metadata service (IMDSv2, which the guest agent reads);
* ``<unit>-server-<i>``: one ``aws.vpc.SecurityGroupIngressRule`` per allowed source range to the
  computer-server port (separate rule resources can be tagged, and each shows as its own plan line);
* ``<unit>-ssh-<i>`` only when the route lists ``ssh_source_ranges``;
* ``<unit>-vm``: the instance, with IMDSv2 required, an encrypted root volume deleted with it, and
  a public IP only when the route does not ``reach_privately``.

TTL: EC2 has no cloud-side "delete after" on an instance, so it is two pieces, as designed:
``instance_initiated_shutdown_behavior = "terminate"`` (a guest shutdown terminates the instance)
and a guest timer in the user data that shuts the guest down at the deadline (armed before the
computer-server starts, re-armed at every boot by a systemd unit / ``<persist>`` PowerShell).

On ale-iac's own disk (``guest_agent``), ``<unit>-token`` is the unit's endpoint token
(``infra/endpoint_token.py``): the user data is then no script but ``key=value`` lines (the token and the
guest's time-to-live) that the guest agent reads through IMDSv2 at boot; it is secret, like the handle.

With ``image_import``, the program also declares the image once (shared by its units): ``image-<name>-disk``
(the VMDK's upload, when the route names a local ``source``), ``image-<name>-snapshot`` (an EBS snapshot
import by VM Import, through the route's ``import_role``) and ``image-<name>``, the AMI (BIOS boot, ENA,
IMDSv2 only) the instances boot from.

The region comes from one explicit ``aws.Provider`` per region and program (``aws-<region>``),
shared by the units; credentials come from the environment (``AWS_*``, profiles, SSO), never from
stack config.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_aws as aws

from ale_iac.cloud_routes import AwsRoute
from ale_iac.contract import UnitSpec
from ale_iac.infra import DeclareContext, endpoint_token
from ale_iac.infra.cloud_common import (
    LABEL_EXPIRY,
    LABEL_MANAGED_BY,
    LABEL_STACK,
    LABEL_UNIT,
    MANAGED_BY,
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
)
from ale_iac.infra.shapes import ResolvedShape, preflight

load_lazy_submodules(aws.ebs, aws.ec2, aws.s3, aws.vpc)  # before any program runs: not thread-safe once programs do

UNIT_TYPE = "ale-iac:aws:Unit"
SSH_PORT = 22
_EXPIRY_TAG = f'tags["{LABEL_EXPIRY}"]'
"""The expiry tag's path, in ``ignore_changes``: a later ``pulumi up`` of a pool does not push it forward."""


def region_provider(region: str) -> aws.Provider:
    """The program's provider for ``region`` (created once, shared by every unit in the region)."""
    return shared_resource(f"aws:{region}", lambda: aws.Provider(f"aws-{region}", region=region))  # type: ignore[no-any-return]


def user_data(route: AwsRoute, ttl_seconds: int) -> str:
    """Boot script plus guest TTL. Windows: EC2Launch runs ``<powershell>`` and, with
    ``<persist>true</persist>``, runs it again at every boot (the TTL re-arms)."""
    script = startup_script(route, guest_ttl_seconds=ttl_seconds)
    if route.os == "windows":
        return f"<powershell>\n{script}</powershell>\n<persist>true</persist>\n"
    return script


class AwsUnit(pulumi.ComponentResource):
    """One sandbox instance on EC2 and the security group that makes it reachable (and only that)."""

    handle: pulumi.Output[dict[str, Any]]

    def __init__(
        self,
        name: str,
        unit: UnitSpec,
        snapshot: str,
        route: AwsRoute,
        ctx: DeclareContext,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        # Shape first: a unit that cannot be sized fails before anything is registered.
        shape = preflight("aws", unit, route)
        super().__init__(UNIT_TYPE, name, None, opts)
        provider = region_provider(route.region)
        expiry = expiry_for(route.ttl_hours)
        labels = unit_labels(unit, snapshot, ctx, expiry, route.outbound)
        tags = {**labels, "Name": f"ale-{labels[LABEL_STACK]}-{labels[LABEL_UNIT]}"}
        child = pulumi.ResourceOptions(parent=self, provider=provider)
        tagged = pulumi.ResourceOptions(parent=self, provider=provider, ignore_changes=[_EXPIRY_TAG])
        description = identity_text(labels)
        sg = aws.ec2.SecurityGroup(
            f"{name}-sg",
            description=f"{description}: computer-server access",
            vpc_id=route.vpc_id,
            # No outbound: declared empty, so the engine keeps it empty (AWS's default allow-all egress rule is
            # removed at creation and any rule added out of band by the next update); allow_outbound has its rule.
            egress=None if route.allow_outbound else [],
            revoke_rules_on_delete=True,
            tags=tags,
            opts=tagged,
        )
        rules = security_group_rules(name, route, sg, tags, description, tagged)
        public = not route.reach_privately
        token = (
            endpoint_token.EndpointToken(f"{name}-token", pulumi.ResourceOptions(parent=self))
            if route.guest_agent
            else None
        )
        boot = (
            endpoint_token.user_data(token.value, expiry.ttl_seconds) if token else user_data(route, expiry.ttl_seconds)
        )
        image = boot_image(route, ctx, provider)
        instance = _instance(name, route, image, shape, sg, public, boot, tags, child)
        self.instance = instance
        self.rules: list[pulumi.CustomResource] = [sg, *rules]
        self.handle = unit_handle(
            unit=unit,
            snapshot=snapshot,
            route=route,
            region=route.availability_zone or route.region,
            address=instance.public_ip if public else instance.private_ip,
            resource_id=instance.id,
            reset_urn=instance.urn,
            root_urn=self.urn,
            resource_labels=instance.tags,
            labels=tags,
            depends_on=self.rules,
            token=token.value if token else None,
        )
        self.register_outputs({"handle": self.handle})


def security_group_rules(
    name: str,
    route: AwsRoute,
    sg: aws.ec2.SecurityGroup,
    tags: dict[str, str],
    description: str,
    opts: pulumi.ResourceOptions,
) -> list[pulumi.CustomResource]:
    """The security group's rules, one resource each (so each can be tagged, and shows as its own plan line):
    ingress to the computer-server (and SSH, when the route lists ranges for it) from each of the route's
    ranges; outbound traffic only when the route allows it."""
    rules: list[pulumi.CustomResource] = []

    def ingress(suffix: str, ranges: list[str], port: int) -> None:
        v4, v6 = split_ranges(ranges)
        for index, cidr in enumerate(v4 + v6):
            rule = aws.vpc.SecurityGroupIngressRule(
                f"{name}-{suffix}-{index}",
                security_group_id=sg.id,
                ip_protocol="tcp",
                from_port=port,
                to_port=port,
                cidr_ipv4=cidr if cidr in v4 else None,
                cidr_ipv6=cidr if cidr in v6 else None,
                description=f"{description}: {suffix}",
                tags=tags,
                opts=opts,
            )
            rules.append(rule)

    ingress("server", route.allowed_source_ranges, route.endpoint_port)
    if route.ssh_source_ranges:
        ingress("ssh", route.ssh_source_ranges, SSH_PORT)
    if route.allow_outbound:
        egress = aws.vpc.SecurityGroupEgressRule(
            f"{name}-egress",
            security_group_id=sg.id,
            ip_protocol="-1",
            cidr_ipv4="0.0.0.0/0",
            description=f"{description}: outbound (allow_outbound)",
            tags=tags,
            opts=opts,
        )
        rules.append(egress)
    return rules


def boot_image(route: AwsRoute, ctx: DeclareContext, provider: aws.Provider) -> pulumi.Input[str]:
    """The AMI the instances boot from: the route's, or the one the program imports (declared once)."""
    if route.image_import is None:
        return route.image
    ami: aws.ec2.Ami = shared_resource(f"aws-image:{route.region}/{route.image}", lambda: _import(route, ctx, provider))
    return ami.id


def _import(route: AwsRoute, ctx: DeclareContext, provider: aws.Provider) -> aws.ec2.Ami:
    """The AMI from the bucket's VMDK: an EBS snapshot import (VM Import), then the AMI on that snapshot."""
    imported = route.image_import
    assert imported is not None
    opts = pulumi.ResourceOptions(provider=provider)
    tags = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_STACK: label_value(ctx.stack), "Name": route.image}
    key: pulumi.Input[str] = imported.object
    if imported.source is not None:
        upload = aws.s3.BucketObjectv2(
            f"image-{route.image}-disk",
            bucket=imported.bucket,
            key=imported.object,
            source=pulumi.FileAsset(imported.source),
            tags=tags,
            opts=opts,
        )
        key = upload.key
    snapshot = aws.ebs.SnapshotImport(
        f"image-{route.image}-snapshot",
        disk_container=aws.ebs.SnapshotImportDiskContainerArgs(
            format="VMDK",
            user_bucket=aws.ebs.SnapshotImportDiskContainerUserBucketArgs(s3_bucket=imported.bucket, s3_key=key),
        ),
        role_name=route.import_role,
        description=f"ale-iac desktop disk from s3://{imported.bucket}/{imported.object}",
        encrypted=True,
        tags=tags,
        opts=opts,
    )
    return aws.ec2.Ami(
        f"image-{route.image}",
        name=route.image,
        virtualization_type="hvm",
        boot_mode="legacy-bios",
        ena_support=True,
        imds_support="v2.0",
        root_device_name="/dev/xvda",
        ebs_block_devices=[
            aws.ec2.AmiEbsBlockDeviceArgs(
                device_name="/dev/xvda", snapshot_id=snapshot.id, volume_type="gp3", delete_on_termination=True
            )
        ],
        tags=tags,
        opts=opts,
    )


def _instance(
    name: str,
    route: AwsRoute,
    image: pulumi.Input[str],
    shape: ResolvedShape,
    sg: aws.ec2.SecurityGroup,
    public: bool,
    boot: pulumi.Input[str],
    tags: dict[str, str],
    opts: pulumi.ResourceOptions,
) -> aws.ec2.Instance:
    """The instance: IMDSv2 only, an encrypted root volume that goes with it, terminated by a guest shutdown
    (the guest TTL in its user data ``boot``), a public IP only when the route reaches it publicly."""
    return aws.ec2.Instance(
        f"{name}-vm",
        ami=image,
        instance_type=shape.machine_type,
        availability_zone=route.availability_zone,
        subnet_id=route.subnet_id,
        vpc_security_group_ids=[sg.id],
        associate_public_ip_address=public,
        key_name=route.key_name,
        user_data=boot,
        user_data_replace_on_change=True,
        instance_initiated_shutdown_behavior="terminate",
        disable_api_termination=False,
        metadata_options=aws.ec2.InstanceMetadataOptionsArgs(
            http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=1
        ),
        root_block_device=aws.ec2.InstanceRootBlockDeviceArgs(
            volume_size=shape.disk_gb,
            volume_type="gp3",
            encrypted=True,
            delete_on_termination=True,
            tags=tags,
        ),
        tags=tags,
        opts=pulumi.ResourceOptions.merge(
            opts, pulumi.ResourceOptions(ignore_changes=[_EXPIRY_TAG, f"rootBlockDevice.{_EXPIRY_TAG}"])
        ),
    )


def declare_unit(unit: UnitSpec, snapshot: str, route: AwsRoute, ctx: DeclareContext) -> pulumi.Output[dict[str, Any]]:
    """Declare one unit on EC2 and return its handle (the ``UnitOutputs`` dict, as an Output)."""
    return AwsUnit(unit_slug(unit.name), unit, snapshot, route, ctx).handle
