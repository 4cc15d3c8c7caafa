"""The policy pack, run offline on the inputs the Pulumi mocks recorded (no cloud, no Pulumi CLI).

The compliant inputs come from the real declarations of each cloud module; each violation is the
same inputs with one guard rail removed, so every check is shown to both pass and fire.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import pulumi
import pytest
from google.protobuf import empty_pb2, struct_pb2
from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc
from pulumi_policy import (
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    StackValidationArgs,
)

from ale_iac.contract import UnitSpec
from ale_iac.infra.mocks import RecordedResource, RecordingMocks
from ale_iac.infra.policy import StackResource, check_resource, check_stack, resource_policies, stack_policies
from tests.support.cloud import RUNNER, aliyun_route, aws_route, cloud_mocks, declare_units, gcloud_route, profile

REPO = Path(__file__).resolve().parents[2]
GCE_VM = "gcp:compute/instance:Instance"
GCE_FW = "gcp:compute/firewall:Firewall"
EC2_VM = "aws:ec2/instance:Instance"
EC2_SG = "aws:ec2/securityGroup:SecurityGroup"
EC2_RULE = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
ECS_VM = "alicloud:ecs/instance:Instance"
ECS_RULE = "alicloud:ecs/securityGroupRule:SecurityGroupRule"


@pytest.fixture(autouse=True)
def mocks() -> Iterator[RecordingMocks]:
    with cloud_mocks("policy-test") as recording:
        yield recording


def validate(resource_type: str, props: Mapping[str, Any], config: Mapping[str, Any] | None = None) -> list[str]:
    """Run every pulumi-policy ResourceValidationPolicy of the pack on one resource, offline."""
    options = PolicyResourceOptions(
        protect=False,
        ignore_changes=[],
        delete_before_replace=None,
        aliases=[],
        custom_timeouts=PolicyCustomTimeouts(0, 0, 0),
        additional_secret_outputs=[],
    )
    found: list[str] = []
    for policy in resource_policies():
        args = ResourceValidationArgs(
            resource_type, props, f"urn:pulumi:s::p::{resource_type}::r", "r", options, None, config
        )
        policy.validate(args, lambda message, urn=None, name=policy.name: found.append(f"{name}: {message}"))
    return found


def declare_all_clouds() -> pulumi.Output[Any]:
    prof = profile(
        {
            "gce": gcloud_route(ssh_source_ranges=["192.0.2.0/28"]),
            "gce-mi": gcloud_route(image="projects/p/global/machineImages/w", os="windows"),
            "ec2": aws_route(allow_outbound=True),
            "ec2-win": aws_route(os="windows"),
            "ecs": aliyun_route(),
        }
    )
    units = [UnitSpec(name, name) for name in ("gce", "gce-mi", "ec2", "ec2-win", "ecs")]
    return pulumi.Output.all(*declare_units(prof, units, stack="policy-test").values())


def recorded(mocks: RecordingMocks, typ: str, name: str) -> dict[str, Any]:
    return copy.deepcopy(mocks.one(typ, name).inputs)


@pulumi.runtime.test
def test_policy_pack_passes_every_resource_the_cloud_modules_declare_under_mocks(
    mocks: RecordingMocks,
) -> pulumi.Output[Any]:
    def check(_: Any) -> None:
        kinds = {r.type for r in mocks.resources}
        assert {GCE_VM, GCE_FW, EC2_VM, EC2_SG, EC2_RULE, ECS_VM, ECS_RULE} <= kinds
        assert len(mocks.resources) >= 25
        for resource in mocks.resources:
            assert validate(resource.type, resource.inputs) == [], resource.name
            assert check_resource(resource.type, resource.inputs) == [], resource.name
        assert check_stack([StackResource(r.type, r.name, r.parent, r.inputs) for r in mocks.resources]) == []

    return declare_all_clouds().apply(check)


def _without(props: dict[str, Any], *path: str) -> dict[str, Any]:
    target = props
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return props


@pulumi.runtime.test
def test_policy_pack_rejects_vms_without_ttl_under_mocks(mocks: RecordingMocks) -> pulumi.Output[Any]:
    def check(_: Any) -> None:
        gce = _without(recorded(mocks, GCE_VM, "gce-vm"), "scheduling", "maxRunDuration")
        assert validate(GCE_VM, gce) == [
            "ale-vm-ttl: r: scheduling.maxRunDuration is not set (GCE would never delete the VM)"
        ]
        stop = recorded(mocks, GCE_VM, "gce-vm")
        stop["scheduling"]["instanceTerminationAction"] = "STOP"
        assert validate(GCE_VM, stop) == [
            'ale-vm-ttl: r: scheduling.instanceTerminationAction must be "DELETE" (STOP keeps billing the disk)'
        ]
        mi_type = "gcp:compute/instanceFromMachineImage:InstanceFromMachineImage"
        machine_image = _without(recorded(mocks, mi_type, "gce-mi-vm"), "scheduling")
        assert len(validate(mi_type, machine_image)) == 2
        ec2 = recorded(mocks, EC2_VM, "ec2-vm")
        ec2["instanceInitiatedShutdownBehavior"] = "stop"
        assert validate(EC2_VM, ec2) == [
            'ale-vm-ttl: r: instanceInitiatedShutdownBehavior must be "terminate" (a guest shutdown only stops it)'
        ]
        for name in ("ec2-vm", "ec2-win-vm"):
            no_timer = recorded(mocks, EC2_VM, name)
            no_timer["userData"] = no_timer["userData"].replace("ale-iac time-to-live reached", "bye")
            assert validate(EC2_VM, no_timer) == [
                "ale-vm-ttl: r: user data has no ale-iac guest shutdown timer (EC2 has no cloud-side TTL)"
            ]
        ecs = _without(recorded(mocks, ECS_VM, "ecs-vm"), "autoReleaseTime")
        assert validate(ECS_VM, ecs) == [
            "ale-vm-ttl: r: autoReleaseTime is not set (ECS would never release the instance)"
        ]
        prepaid = recorded(mocks, ECS_VM, "ecs-vm")
        prepaid["instanceChargeType"] = "PrePaid"
        assert validate(ECS_VM, prepaid) == ["ale-vm-ttl: r: autoReleaseTime only applies to PostPaid instances"]

    return declare_all_clouds().apply(check)


@pulumi.runtime.test
def test_policy_pack_rejects_vms_without_labels_under_mocks(mocks: RecordingMocks) -> pulumi.Output[Any]:
    def check(_: Any) -> None:
        gce = _without(recorded(mocks, GCE_VM, "gce-vm"), "labels", "ale-expiry")
        assert validate(GCE_VM, gce) == [
            "ale-vm-labels: r: labels lack ale-expiry (needed to find and reap the VM from cloud state)"
        ]
        ec2 = recorded(mocks, EC2_VM, "ec2-vm")
        ec2["tags"] = {"Name": "x"}
        assert validate(EC2_VM, ec2) == [
            "ale-vm-labels: r: tags lack ale-run, ale-unit, ale-stack, ale-expiry "
            "(needed to find and reap the VM from cloud state)"
        ]
        ecs = recorded(mocks, ECS_VM, "ecs-vm")
        ecs["tags"]["ale-expiry"] = "next tuesday"
        assert validate(ECS_VM, ecs) == [
            "ale-vm-labels: r: tags.ale-expiry='next tuesday' is not a time like 20261130t1200z"
        ]

    return declare_all_clouds().apply(check)


@pulumi.runtime.test
def test_policy_pack_rejects_world_open_ingress_to_the_server_port_under_mocks(
    mocks: RecordingMocks,
) -> pulumi.Output[Any]:
    def check(_: Any) -> None:
        world = ["ale-no-world-ingress: r: allows tcp port 8000 from 0.0.0.0/0"]
        fw = recorded(mocks, GCE_FW, "gce-server")
        fw["sourceRanges"] = [RUNNER, "0.0.0.0/0"]
        assert validate(GCE_FW, fw) == world
        all_ports = recorded(mocks, GCE_FW, "gce-server")
        all_ports.update(sourceRanges=["::/0"], allows=[{"protocol": "all"}])
        assert validate(GCE_FW, all_ports) == ["ale-no-world-ingress: r: allows all port 8000 from ::/0"]
        port_range = recorded(mocks, GCE_FW, "gce-server")
        port_range.update(sourceRanges=["0.0.0.0/0"], allows=[{"protocol": "tcp", "ports": ["7000-9000"]}])
        assert validate(GCE_FW, port_range) == world
        # Not violations: SSH from the world is not the server port; an egress deny is not ingress.
        ssh = recorded(mocks, GCE_FW, "gce-ssh")
        ssh["sourceRanges"] = ["0.0.0.0/0"]
        assert validate(GCE_FW, ssh) == []
        assert validate(GCE_FW, recorded(mocks, GCE_FW, "gce-deny-egress")) == []
        # ... unless the pack is configured to guard that port too.
        assert validate(GCE_FW, ssh, {"serverPorts": [8000, 22]}) == [
            "ale-no-world-ingress: r: allows tcp port 22 from 0.0.0.0/0"
        ]

        rule = recorded(mocks, EC2_RULE, "ec2-server-0")
        rule["cidrIpv4"] = "0.0.0.0/0"
        assert validate(EC2_RULE, rule) == ["ale-no-world-ingress: r: opens tcp port 8000 to 0.0.0.0/0"]
        sg = recorded(mocks, EC2_SG, "ec2-sg")
        sg["ingress"] = [{"protocol": "-1", "fromPort": 0, "toPort": 0, "ipv6CidrBlocks": ["::/0"]}]
        assert validate(EC2_SG, sg) == ["ale-no-world-ingress: r: opens -1 port 8000 to ::/0"]
        legacy = {"type": "ingress", "protocol": "tcp", "fromPort": 8000, "toPort": 8000, "cidrBlocks": ["0.0.0.0/0"]}
        assert validate("aws:ec2/securityGroupRule:SecurityGroupRule", legacy) == [
            "ale-no-world-ingress: r: opens tcp port 8000 to 0.0.0.0/0"
        ]
        egress = recorded(mocks, "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule", "ec2-egress")
        assert egress["cidrIpv4"] == "0.0.0.0/0"
        assert validate("aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule", egress) == []

        ecs_rule = recorded(mocks, ECS_RULE, "ecs-server-0")
        ecs_rule["cidrIp"] = "0.0.0.0/0"
        assert validate(ECS_RULE, ecs_rule) == ["ale-no-world-ingress: r: opens tcp port 8000 to 0.0.0.0/0"]
        all_rule = recorded(mocks, ECS_RULE, "ecs-server-0")
        all_rule.update(ipProtocol="all", portRange="-1/-1", cidrIp=None, ipv6CidrIp="::/0")
        assert validate(ECS_RULE, all_rule) == ["ale-no-world-ingress: r: opens all port 8000 to ::/0"]
        drop = recorded(mocks, ECS_RULE, "ecs-deny-egress")
        assert drop["cidrIp"] == "0.0.0.0/0" and validate(ECS_RULE, drop) == []

    return declare_all_clouds().apply(check)


def _validate_stack(resources: list[RecordedResource]) -> list[tuple[str, str | None]]:
    """Run the pack's stack policies on recorded resources as the analyzer hands them over (parents by URN)."""
    options = PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])
    made: dict[str, PolicyResource] = {}
    for r in resources:  # the mocks record parents before their children
        parent = made[r.parent] if r.parent else None
        urn = f"urn:pulumi:s::p::{r.type}::{r.name}"
        made[r.name] = PolicyResource(r.type, copy.deepcopy(r.inputs), urn, r.name, options, None, parent, [], {})
    found: list[tuple[str, str | None]] = []
    for policy in stack_policies():
        args = StackValidationArgs(list(made.values()))
        policy.validate(args, lambda message, urn=None: found.append((message, urn)))
    return found


@pulumi.runtime.test
def test_the_pack_s_stack_policy_refuses_a_closed_unit_without_its_walls_under_mocks(
    mocks: RecordingMocks,
) -> pulumi.Output[Any]:
    def check(_: Any) -> None:
        assert _validate_stack(mocks.resources) == []
        walls = ("gce-deny-egress-v6", "ecs-deny-egress")
        # In the order the program registered the units' resources, which its concurrent outputs do not fix.
        assert sorted(_validate_stack([r for r in mocks.resources if r.name not in walls])) == [
            ("ecs-vm: no egress rule drops all to 0.0.0.0/0 (ale-egress=none)", f"urn:pulumi:s::p::{ECS_VM}::ecs-vm"),
            ("gce-vm: no EGRESS firewall denies all to ::/0 (ale-egress=none)", f"urn:pulumi:s::p::{GCE_VM}::gce-vm"),
        ]

    return declare_all_clouds().apply(check)


def test_policy_pack_serves_over_grpc_as_the_pulumi_cli_runs_it() -> None:
    """``policy/__main__.py`` as ``pulumi preview --policy-pack policy`` starts it: it prints its port,
    then answers the analyzer protocol. This is the real pack, only driven by us instead of the CLI."""
    process = subprocess.Popen(
        [sys.executable, str(REPO / "policy" / "__main__.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = analyzer_pb2_grpc.AnalyzerStub(channel)
            info = stub.GetAnalyzerInfo(empty_pb2.Empty(), timeout=30)
            assert info.name == "ale-iac-guardrails"
            assert {(p.name, p.enforcementLevel) for p in info.policies} == {
                ("ale-vm-ttl", analyzer_pb2.MANDATORY),
                ("ale-vm-labels", analyzer_pb2.MANDATORY),
                ("ale-no-world-ingress", analyzer_pb2.MANDATORY),
                ("ale-egress-walled", analyzer_pb2.MANDATORY),
            }
            props = struct_pb2.Struct()
            props.update({"sourceRanges": ["0.0.0.0/0"], "allows": [{"protocol": "tcp", "ports": ["8000"]}]})
            request = analyzer_pb2.AnalyzeRequest(
                type=GCE_FW, properties=props, urn=f"urn:pulumi:s::p::{GCE_FW}::open", name="open"
            )
            diagnostics = stub.Analyze(request, timeout=30).diagnostics
            assert [(d.policyName, d.message.splitlines()[-1]) for d in diagnostics] == [
                ("ale-no-world-ingress", "open: allows tcp port 8000 from 0.0.0.0/0")
            ]
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_recorded_resource_is_what_the_policies_consume() -> None:
    # Guards the offline path itself: a recorded resource's inputs are engine-named props.
    resource = RecordedResource(type=GCE_FW, name="x", inputs={"sourceRanges": ["0.0.0.0/0"]}, custom=True)
    assert check_resource(resource.type, {**resource.inputs, "allows": [{"protocol": "tcp"}]})[0].policy == (
        "ale-no-world-ingress"
    )
