"""Guard rails as policy-as-code: checked by ``pulumi preview --policy-pack policy`` and offline.

Four mandatory policies, each a pure function over engine-named inputs (``props``, exactly what the policy
analyzer and the mocks both see): three over one resource's type and inputs, wrapped for pulumi-policy by
:func:`resource_policies`, and one over the whole stack (a VM and its siblings), by :func:`stack_policies`:

``ale-vm-ttl``
    Every VM has a cloud-side time-to-live: GCE ``scheduling.maxRunDuration`` with
    ``instanceTerminationAction = DELETE``; EC2 ``instanceInitiatedShutdownBehavior = terminate``
    plus the ale-iac guest shutdown timer in its user data; ECS ``autoReleaseTime`` on a
    pay-as-you-go instance.
``ale-vm-labels``
    Every VM carries the ``ale-run``, ``ale-unit``, ``ale-stack`` and ``ale-expiry`` labels/tags,
    and the expiry is a readable time (what ``ale-iac gc`` needs to reap it from cloud state).
``ale-no-world-ingress``
    No ingress rule opens the computer-server port to ``0.0.0.0/0`` or ``::/0``: GCE firewalls,
    EC2 security groups (inline rules, ``SecurityGroupRule``, ``SecurityGroupIngressRule``) and ECS
    security group rules. The port list is the policy's ``serverPorts`` config (default 8000),
    because the pack also guards programs that are not ale-iac's.
``ale-egress-walled`` (stack)
    A VM whose route allows no outbound (label ``ale-egress`` ``none`` or ``proxy``; a VM without the label
    counts as ``none``) has its egress walled by its unit's own rules: GCE deny-all EGRESS firewalls for
    ``0.0.0.0/0`` and ``::/0`` with no allow before them; an EC2 security group that declares ``egress: []``
    and no egress rule; ECS drop-all egress rules for both families with no accept before them but the metadata
    service's. A unit's rules are the siblings of its VM (the unit's component parents them all).

This module imports ``pulumi_policy`` only inside :func:`resource_policies` and :func:`serve`, so
the checks run (in ``ale-iac plan`` and tests) without the policy SDK.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import ipaddress
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ale_iac.infra.cloud_common import LABEL_EGRESS, LABEL_EXPIRY, LABEL_KEYS, parse_expiry_label

if TYPE_CHECKING:
    from pulumi_policy import ResourceValidationPolicy, StackValidationPolicy

PACK_NAME = "ale-iac-guardrails"
DEFAULT_SERVER_PORTS = (8000,)
GUEST_TTL_MARKER = "ale-iac time-to-live reached"
"""Text of the guest shutdown timer in EC2 user data (see ale_iac.infra.cloud_common)."""
GUEST_AGENT_TTL = "\nale-ttl-seconds="
"""The guest agent's time-to-live line in the user data of ale-iac's own disk (ale_iac.infra.endpoint_token)."""
_SECRET = ("4dabf18193072939515e22adb298388d", "1b47061264138c4ac30d75fd1eb44270")


def _plain(value: Any) -> Any:
    """A value without Pulumi's secret wrapper (as the mocks record a secret input)."""
    if isinstance(value, Mapping) and value.get(_SECRET[0]) == _SECRET[1]:
        return value.get("value")
    return value


GCE_VM_TYPES = frozenset(
    {"gcp:compute/instance:Instance", "gcp:compute/instanceFromMachineImage:InstanceFromMachineImage"}
)
EC2_VM_TYPE = "aws:ec2/instance:Instance"
ECS_VM_TYPE = "alicloud:ecs/instance:Instance"
VM_TYPES = GCE_VM_TYPES | {EC2_VM_TYPE, ECS_VM_TYPE}


@dataclass(frozen=True)
class Violation:
    policy: str
    message: str


# ------------------------------------------------------------------------------------------ helpers


def _get(props: Mapping[str, Any], *path: str) -> Any:
    value: Any = props
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _is_world(cidr: Any) -> bool:
    try:
        return ipaddress.ip_network(str(cidr), strict=False).prefixlen == 0
    except ValueError:
        return False


def _covers(low: int, high: int, ports: Sequence[int]) -> list[int]:
    return [p for p in ports if low <= p <= high]


def _as_int(value: Any, default: int) -> int:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return default


# ---------------------------------------------------------------------------------------- ale-vm-ttl


def vm_ttl_violations(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    """Why this VM has no cloud-side time-to-live (empty when it has one or is not a VM)."""
    if resource_type in GCE_VM_TYPES:
        problems = []
        seconds = _get(props, "scheduling", "maxRunDuration", "seconds")
        if _as_int(seconds, 0) <= 0:
            problems.append("scheduling.maxRunDuration is not set (GCE would never delete the VM)")
        if _get(props, "scheduling", "instanceTerminationAction") != "DELETE":
            problems.append('scheduling.instanceTerminationAction must be "DELETE" (STOP keeps billing the disk)')
        return problems
    if resource_type == EC2_VM_TYPE:
        problems = []
        if props.get("instanceInitiatedShutdownBehavior") != "terminate":
            problems.append('instanceInitiatedShutdownBehavior must be "terminate" (a guest shutdown only stops it)')
        text = str(_plain(props.get("userData")) or "")
        encoded = props.get("userDataBase64")
        if encoded:
            with contextlib.suppress(binascii.Error, ValueError):
                text += base64.b64decode(str(encoded)).decode(errors="replace")
        if GUEST_TTL_MARKER not in text and GUEST_AGENT_TTL not in text:
            problems.append("user data has no ale-iac guest shutdown timer (EC2 has no cloud-side TTL)")
        return problems
    if resource_type == ECS_VM_TYPE:
        problems = []
        if not props.get("autoReleaseTime"):
            problems.append("autoReleaseTime is not set (ECS would never release the instance)")
        if props.get("instanceChargeType", "PostPaid") != "PostPaid":
            problems.append("autoReleaseTime only applies to PostPaid instances")
        return problems
    return []


# ------------------------------------------------------------------------------------- ale-vm-labels


def vm_label_violations(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    """Which required labels/tags this VM lacks (empty when complete or not a VM)."""
    if resource_type not in VM_TYPES:
        return []
    field = "labels" if resource_type in GCE_VM_TYPES else "tags"
    labels = props.get(field) or {}
    if not isinstance(labels, Mapping):
        return [f"{field} is not a mapping"]
    problems = []
    missing = [key for key in LABEL_KEYS if not labels.get(key)]
    if missing:
        problems.append(f"{field} lack {', '.join(missing)} (needed to find and reap the VM from cloud state)")
    expiry = labels.get(LABEL_EXPIRY)
    if expiry and parse_expiry_label(str(expiry)) is None:
        problems.append(f"{field}.{LABEL_EXPIRY}={expiry!r} is not a time like 20261130t1200z")
    return problems


# ------------------------------------------------------------------------------ ale-no-world-ingress


def _gce_firewall(props: Mapping[str, Any], ports: Sequence[int]) -> list[str]:
    if (props.get("direction") or "INGRESS") != "INGRESS" or props.get("disabled"):
        return []
    world = [r for r in props.get("sourceRanges") or [] if _is_world(r)]
    if not world:
        return []
    problems = []
    for allow in props.get("allows") or []:
        protocol = str(allow.get("protocol", "")).lower()
        if protocol not in ("tcp", "all", "6"):
            continue
        specs = allow.get("ports") or []
        hit: list[int] = list(ports) if not specs or protocol == "all" else []
        for spec in specs:
            low, _, high = str(spec).partition("-")
            hit += _covers(_as_int(low, -1), _as_int(high or low, -1), ports)
        if hit:
            problems.append(f"allows {protocol} port {sorted(set(hit))[0]} from {world[0]}")
    return problems


def _aws_rule(protocol: Any, from_port: Any, to_port: Any, cidrs: Sequence[Any], ports: Sequence[int]) -> list[str]:
    world = [c for c in cidrs if c and _is_world(c)]
    if not world:
        return []
    proto = str(protocol).lower()
    if proto in ("-1", "all"):
        hit = list(ports)
    elif proto in ("tcp", "6"):
        hit = _covers(_as_int(from_port, -1), _as_int(to_port, -1), ports)
    else:
        hit = []
    return [f"opens {proto} port {hit[0]} to {world[0]}"] if hit else []


def open_ingress_violations(
    resource_type: str, props: Mapping[str, Any], server_ports: Sequence[int] = DEFAULT_SERVER_PORTS
) -> list[str]:
    """Ingress rules that open a computer-server port to the whole internet."""
    ports = list(server_ports)
    if resource_type == "gcp:compute/firewall:Firewall":
        return _gce_firewall(props, ports)
    if resource_type == "aws:ec2/securityGroup:SecurityGroup":
        problems = []
        for rule in props.get("ingress") or []:
            cidrs = list(rule.get("cidrBlocks") or []) + list(rule.get("ipv6CidrBlocks") or [])
            problems += _aws_rule(rule.get("protocol"), rule.get("fromPort"), rule.get("toPort"), cidrs, ports)
        return problems
    if resource_type == "aws:ec2/securityGroupRule:SecurityGroupRule":
        if props.get("type") != "ingress":
            return []
        cidrs = list(props.get("cidrBlocks") or []) + list(props.get("ipv6CidrBlocks") or [])
        return _aws_rule(props.get("protocol"), props.get("fromPort"), props.get("toPort"), cidrs, ports)
    if resource_type == "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule":
        cidrs = [props.get("cidrIpv4"), props.get("cidrIpv6")]
        return _aws_rule(props.get("ipProtocol"), props.get("fromPort"), props.get("toPort"), cidrs, ports)
    if resource_type == "alicloud:ecs/securityGroupRule:SecurityGroupRule":
        if props.get("type") != "ingress" or props.get("policy", "accept") != "accept":
            return []
        world = [c for c in (props.get("cidrIp"), props.get("ipv6CidrIp")) if c and _is_world(c)]
        protocol = str(props.get("ipProtocol", "")).lower()
        if not world or protocol not in ("tcp", "all"):
            return []
        low, _, high = str(props.get("portRange") or "-1/-1").partition("/")
        hit = ports if protocol == "all" or low == "-1" else _covers(_as_int(low, -1), _as_int(high, -1), ports)
        return [f"opens {protocol} port {hit[0]} to {world[0]}"] if hit else []
    return []


# ------------------------------------------------------------------------------------ ale-egress-walled

ECS_METADATA = "100.100.100.200/32"
"""The one destination an ECS unit's walls may accept before their drop (the instance metadata service)."""
_WORLD = ("0.0.0.0/0", "::/0")


@dataclass(frozen=True)
class StackResource:
    """One resource as a stack policy sees it: its siblings are the resources of the same parent (a unit's
    component parents its VM and every rule of it). ``parent`` is the parent's URN in the pack, its name in
    the mocks: only equality matters."""

    type: str
    name: str
    parent: str | None
    props: Mapping[str, Any]


def _outbound(vm: StackResource) -> str:
    labels = vm.props.get("labels" if vm.type in GCE_VM_TYPES else "tags") or {}
    return str(labels.get(LABEL_EGRESS, "none")) if isinstance(labels, Mapping) else "none"


def _gce_walls(vm: StackResource, siblings: Sequence[StackResource]) -> list[str]:
    tags = set(vm.props.get("tags") or [])
    rules = [
        r.props
        for r in siblings
        if r.type == "gcp:compute/firewall:Firewall"
        and r.props.get("direction") == "EGRESS"
        and not r.props.get("disabled")
        and (not r.props.get("targetTags") or tags & set(r.props.get("targetTags") or []))
    ]
    denies = [r for r in rules if any(str(d.get("protocol")).lower() == "all" for d in r.get("denies") or [])]
    problems = [
        f"no EGRESS firewall denies all to {world}"
        for world in _WORLD
        if not any(world in (r.get("destinationRanges") or []) for r in denies)
    ]
    first_deny = min((_as_int(r.get("priority"), 1000) for r in denies), default=65536)
    problems += [
        f"an EGRESS firewall allows {r.get('destinationRanges')} at priority {_as_int(r.get('priority'), 1000)}, "
        f"before the deny-all ({first_deny})"
        for r in rules
        if r.get("allows") and _as_int(r.get("priority"), 1000) < first_deny
    ]
    return problems


def _ec2_walls(siblings: Sequence[StackResource]) -> list[str]:
    groups = [r for r in siblings if r.type == "aws:ec2/securityGroup:SecurityGroup"]
    if not groups:
        return ["no security group of its own declares its egress"]
    problems = [
        f"security group {g.name} does not declare egress: [] (AWS's default allows all)"
        for g in groups
        if "egress" not in g.props
    ]
    problems += [f"security group {g.name} has inline egress rules" for g in groups if g.props.get("egress")]
    problems += [
        f"{r.name} allows egress"
        for r in siblings
        if r.type == "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
        or (r.type == "aws:ec2/securityGroupRule:SecurityGroupRule" and r.props.get("type") == "egress")
    ]
    return problems


def _ecs_walls(siblings: Sequence[StackResource]) -> list[str]:
    rules = [r for r in siblings if r.type == "alicloud:ecs/securityGroupRule:SecurityGroupRule"]
    egress = [r.props for r in rules if r.props.get("type") == "egress"]
    drops = [r for r in egress if r.get("policy") == "drop" and str(r.get("ipProtocol")).lower() == "all"]
    problems = [
        f"no egress rule drops all to {world}"
        for world in _WORLD
        if not any(world in (r.get("cidrIp"), r.get("ipv6CidrIp")) for r in drops)
    ]
    first_drop = min((_as_int(r.get("priority"), 1) for r in drops), default=101)
    problems += [
        f"an egress rule accepts {r.get('cidrIp') or r.get('ipv6CidrIp')} at priority {_as_int(r.get('priority'), 1)}, "
        f"before the drop ({first_drop})"
        for r in egress
        if r.get("policy", "accept") == "accept"
        and _as_int(r.get("priority"), 1) < first_drop
        and (r.get("cidrIp"), r.get("ipv6CidrIp")) != (ECS_METADATA, None)
    ]
    return problems


def egress_wall_violations(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    """``(vm name, why)`` for each VM whose route allows no outbound (label ``ale-egress`` other than ``all``;
    none counts as ``none``) but whose own rules leave egress open: GCE, no deny-all EGRESS firewall for IPv4
    and IPv6 targeting it, or an allow before it; EC2, a security group of its unit without ``egress: []``, or
    an egress rule; ECS, no drop-all egress rule for IPv4 and IPv6, or an accept before it other than the
    metadata service's."""
    found: list[tuple[str, str]] = []
    for vm in resources:
        if vm.type not in VM_TYPES or _outbound(vm) == "all":
            continue
        siblings = [r for r in resources if r.parent == vm.parent and r is not vm]
        if vm.type in GCE_VM_TYPES:
            problems = _gce_walls(vm, siblings)
        elif vm.type == EC2_VM_TYPE:
            problems = _ec2_walls(siblings)
        else:
            problems = _ecs_walls(siblings)
        found += [(vm.name, f"{problem} ({LABEL_EGRESS}={_outbound(vm)})") for problem in problems]
    return found


STACK_POLICIES: dict[str, str] = {
    "ale-egress-walled": "A sandbox VM whose route allows no outbound (ale-egress none or proxy) has its egress "
    "walled: deny-all rules for IPv4 and IPv6, nothing allowed before them but the metadata service.",
}


def check_stack(resources: Sequence[StackResource]) -> list[tuple[str, Violation]]:
    """Every stack policy's violations, as ``(resource name, violation)``."""
    return [(name, Violation("ale-egress-walled", message)) for name, message in egress_wall_violations(resources)]


# ------------------------------------------------------------------------------------ all together

PolicyCheck = Callable[[str, Mapping[str, Any], Sequence[int]], list[str]]

POLICIES: dict[str, tuple[str, PolicyCheck]] = {
    "ale-vm-ttl": (
        "Every sandbox VM has a cloud-side time-to-live, so a crashed runner leaks nothing for long.",
        lambda t, p, _ports: vm_ttl_violations(t, p),
    ),
    "ale-vm-labels": (
        "Every sandbox VM carries the ale-run, ale-unit, ale-stack and ale-expiry labels.",
        lambda t, p, _ports: vm_label_violations(t, p),
    ),
    "ale-no-world-ingress": (
        "No ingress rule opens the computer-server port (which has no auth) to 0.0.0.0/0 or ::/0.",
        open_ingress_violations,
    ),
}


def check_resource(
    resource_type: str, props: Mapping[str, Any], server_ports: Sequence[int] = DEFAULT_SERVER_PORTS
) -> list[Violation]:
    """Every policy's violations for one resource."""
    return [
        Violation(name, message)
        for name, (_, check) in POLICIES.items()
        for message in check(resource_type, props, server_ports)
    ]


def resource_policies() -> list[ResourceValidationPolicy]:
    """The policies as pulumi-policy objects (mandatory), for the pack and for offline tests."""
    from pulumi_policy import EnforcementLevel, PolicyConfigSchema, ResourceValidationPolicy

    def make(name: str, description: str, check: PolicyCheck) -> ResourceValidationPolicy:
        def validate(args: Any, report_violation: Callable[..., None]) -> None:
            ports = args.get_config().get("serverPorts") or DEFAULT_SERVER_PORTS
            for message in check(args.resource_type, args.props, [int(p) for p in ports]):
                report_violation(f"{args.name}: {message}")

        return ResourceValidationPolicy(
            name=name,
            description=description,
            validate=validate,
            enforcement_level=EnforcementLevel.MANDATORY,
            config_schema=PolicyConfigSchema(
                properties={
                    "serverPorts": {
                        "type": "array",
                        "items": {"type": "integer"},
                        "default": list(DEFAULT_SERVER_PORTS),
                    }
                }
            ),
        )

    return [make(name, description, check) for name, (description, check) in POLICIES.items()]


def stack_policies() -> list[StackValidationPolicy]:
    """The stack policies as pulumi-policy objects (mandatory): they see every resource with its parent."""
    from pulumi_policy import EnforcementLevel, StackValidationPolicy

    def validate(args: Any, report_violation: Callable[..., None]) -> None:
        resources = [
            StackResource(r.resource_type, r.name, r.parent.urn if r.parent else None, r.props) for r in args.resources
        ]
        by_name = {r.name: r for r in args.resources}
        for name, violation in check_stack(resources):
            resource = by_name.get(name)
            report_violation(f"{name}: {violation.message}", resource.urn if resource else None)

    return [
        StackValidationPolicy(
            name=name, description=description, validate=validate, enforcement_level=EnforcementLevel.MANDATORY
        )
        for name, description in STACK_POLICIES.items()
    ]


def serve() -> None:
    """Run the policy pack (what ``policy/__main__.py`` does when the Pulumi CLI starts it)."""
    from pulumi_policy import EnforcementLevel, PolicyPack

    PolicyPack(
        name=PACK_NAME,
        enforcement_level=EnforcementLevel.MANDATORY,
        policies=[*resource_policies(), *stack_policies()],
        description="ale-iac guard rails: VM time-to-live, labels, no internet-open computer-server port, "
        "walled egress.",
    )
