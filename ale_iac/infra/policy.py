"""Guard rails as policy-as-code: checked by ``pulumi preview --policy-pack policy`` and offline.

Three mandatory policies, each a pure function over a resource's type and engine-named inputs
(``props``, exactly what the policy analyzer and the mocks both see), wrapped for pulumi-policy by
:func:`resource_policies`:

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

from ale_iac.infra.cloud_common import LABEL_EXPIRY, LABEL_KEYS, parse_expiry_label

if TYPE_CHECKING:
    from pulumi_policy import ResourceValidationPolicy

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


def serve() -> None:
    """Run the policy pack (what ``policy/__main__.py`` does when the Pulumi CLI starts it)."""
    from pulumi_policy import EnforcementLevel, PolicyPack

    PolicyPack(
        name=PACK_NAME,
        enforcement_level=EnforcementLevel.MANDATORY,
        policies=list(resource_policies()),
        description="ale-iac guard rails: VM time-to-live, labels, no internet-open computer-server port.",
    )
