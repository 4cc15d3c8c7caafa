"""EC2: one instance per unit, with its own security group, tags and a time-to-live.

Per unit, a ``ale-iac:aws:Unit`` component parents:

* ``<unit>-sg``: a security group with no inline rules. On creation the AWS provider removes the
  default allow-all egress rule, so the instance has **no outbound network** unless the route sets
  ``allow_outbound`` (then ``<unit>-egress`` allows it);
* ``<unit>-server-<i>``: one ``aws.vpc.SecurityGroupIngressRule`` per allowed source range to the
  computer-server port (separate rule resources can be tagged, and each shows as its own plan line);
* ``<unit>-ssh-<i>`` only when the route lists ``ssh_source_ranges``;
* ``<unit>-vm``: the instance, with IMDSv2 required, an encrypted root volume deleted with it, and
  a public IP only when the route does not ``reach_privately``.

TTL: EC2 has no cloud-side "delete after" on an instance, so it is two pieces, as designed:
``instance_initiated_shutdown_behavior = "terminate"`` (a guest shutdown terminates the instance)
and a guest timer in the user data that shuts the guest down at the deadline (armed before the
computer-server starts, re-armed at every boot by a systemd unit / ``<persist>`` PowerShell).

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
from ale_iac.infra import DeclareContext
from ale_iac.infra.cloud_common import (
    LABEL_EXPIRY,
    LABEL_STACK,
    LABEL_UNIT,
    expiry_for,
    identity_text,
    shared_resource,
    split_ranges,
    startup_script,
    unit_handle,
    unit_labels,
    unit_slug,
)
from ale_iac.infra.shapes import ResolvedShape, preflight

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
        labels = unit_labels(unit, snapshot, ctx, expiry)
        tags = {**labels, "Name": f"ale-{labels[LABEL_STACK]}-{labels[LABEL_UNIT]}"}
        child = pulumi.ResourceOptions(parent=self, provider=provider)
        tagged = pulumi.ResourceOptions(parent=self, provider=provider, ignore_changes=[_EXPIRY_TAG])
        description = identity_text(labels)
        sg = aws.ec2.SecurityGroup(
            f"{name}-sg",
            description=f"{description}: computer-server access",
            vpc_id=route.vpc_id,
            revoke_rules_on_delete=True,
            tags=tags,
            opts=tagged,
        )
        rules = security_group_rules(name, route, sg, tags, description, tagged)
        public = not route.reach_privately
        instance = _instance(name, route, shape, sg, public, user_data(route, expiry.ttl_seconds), tags, child)
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
            resource_labels=instance.tags,
            labels=tags,
            depends_on=self.rules,
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

    ingress("server", route.allowed_source_ranges, route.server_port)
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


def _instance(
    name: str,
    route: AwsRoute,
    shape: ResolvedShape,
    sg: aws.ec2.SecurityGroup,
    public: bool,
    boot: str,
    tags: dict[str, str],
    opts: pulumi.ResourceOptions,
) -> aws.ec2.Instance:
    """The instance: IMDSv2 only, an encrypted root volume that goes with it, terminated by a guest shutdown
    (the guest TTL in its user data ``boot``), a public IP only when the route reaches it publicly."""
    return aws.ec2.Instance(
        f"{name}-vm",
        ami=route.image,
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
