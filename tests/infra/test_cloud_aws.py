"""EC2 declarations, checked under Pulumi mocks (no cloud and no aws provider plugin here)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulumi
import pytest

from ale_iac.contract import Shape, UnitOutputs, UnitSpec
from ale_iac.infra.mocks import RecordingMocks
from tests.support.cloud import RUNNER, RUNNER_V6, aws_route, cloud_mocks, declare_units, profile

INSTANCE = "aws:ec2/instance:Instance"
SG = "aws:ec2/securityGroup:SecurityGroup"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
PROVIDER = "pulumi:providers:aws"


@pytest.fixture(autouse=True)
def mocks() -> Iterator[RecordingMocks]:
    with cloud_mocks("ec2-test") as recording:
        yield recording


def one_unit(route: dict[str, Any], unit: UnitSpec | None = None) -> pulumi.Output[Any]:
    unit = unit or UnitSpec("u0", "snap")
    return declare_units(profile({"snap": route}), [unit], stack="ec2-test")[unit.name]


@pulumi.runtime.test
def test_aws_unit_declares_instance_with_terminate_ttl_and_tags_under_mocks(
    mocks: RecordingMocks, tmp_path: Path
) -> pulumi.Output[Any]:
    def check(handle: dict[str, Any]) -> None:
        vm = mocks.one(INSTANCE, "u0-vm")
        assert vm.parent == "u0" and vm.provider == "aws-eu-central-1"
        inputs = vm.inputs
        assert inputs["ami"] == "ami-0abc"
        assert inputs["instanceType"] == "m6i.2xlarge"  # >= 8 vCPU and >= 24 GiB, cheapest
        # TTL, part 1: a guest shutdown terminates the instance.
        assert inputs["instanceInitiatedShutdownBehavior"] == "terminate"
        # TTL, part 2: the guest timer, fixed at first boot to ttl_hours and re-armed at every boot.
        user_data = inputs["userData"]
        assert "$(( $(date +%s) + 10800 ))" in user_data
        assert 'shutdown -h +"$left" "ale-iac time-to-live reached"' in user_data
        assert "systemctl enable ale-ttl.service" in user_data
        assert user_data.index("\n/usr/local/sbin/ale-ttl\n") < user_data.index("ale-computer-server.service")
        assert "-m computer_server --host 0.0.0.0 --port 8000" in user_data
        assert "CONTAINER_NAME=" not in user_data
        script = tmp_path / "user-data.sh"
        script.write_text(user_data)
        subprocess.run(["sh", "-n", str(script)], check=True)
        assert inputs["userDataReplaceOnChange"] is True
        assert inputs["metadataOptions"]["httpTokens"] == "required"
        root = inputs["rootBlockDevice"]
        assert root == {
            "volumeSize": 60,
            "volumeType": "gp3",
            "encrypted": True,
            "deleteOnTermination": True,
            "tags": inputs["tags"],
        }
        assert inputs["tags"] == {
            "Name": "ale-ec2-test-u0",
            "ale-run": "ec2-test",
            "ale-unit": "u0",
            "ale-stack": "ec2-test",
            "ale-expiry": "20261130t1241z",
            "ale-profile": "test",
            "ale-snapshot": "snap",
            "ale-egress": "none",
            "managed-by": "ale-iac",
        }
        assert inputs["associatePublicIpAddress"] is True
        assert inputs["vpcSecurityGroupIds"] == ["u0-sg-id"]
        assert mocks.one(INSTANCE).ignore_changes == ('tags["ale-expiry"]', 'rootBlockDevice.tags["ale-expiry"]')
        parsed = UnitOutputs.model_validate(handle)
        assert parsed.endpoint == f"http://{mocks.address('u0-vm', 'publicIp', public=True)}:8000"
        assert parsed.resource_id == "u0-vm-id"
        assert parsed.region == "eu-central-1"
        assert parsed.expires_at == "2026-11-30T12:41:00Z"

    unit = UnitSpec("u0", "snap", Shape(vcpus=8, memory_gb=24))
    return one_unit(aws_route(ttl_hours=3, disk_gb=60), unit).apply(check)


@pulumi.runtime.test
def test_aws_security_group_admits_only_the_route_ranges_under_mocks(mocks: RecordingMocks) -> pulumi.Output[Any]:
    def check(_: Any) -> None:
        sg = mocks.one(SG, "u0-sg")
        assert sg.parent == "u0"
        assert "ingress" not in sg.inputs  # ingress rules are resources of their own
        assert sg.inputs["egress"] == []  # declared empty: no default allow-all egress, now or after an update
        assert sg.inputs["vpcId"] == "vpc-9"
        assert sg.inputs["tags"]["ale-unit"] == "u0"
        rules = {r.name: r.inputs for r in mocks.of_type(INGRESS)}
        assert sorted(rules) == ["u0-server-0", "u0-server-1"]
        assert rules["u0-server-0"]["cidrIpv4"] == RUNNER and "cidrIpv6" not in rules["u0-server-0"]
        assert rules["u0-server-1"]["cidrIpv6"] == RUNNER_V6 and "cidrIpv4" not in rules["u0-server-1"]
        for rule in rules.values():
            assert (rule["ipProtocol"], rule["fromPort"], rule["toPort"]) == ("tcp", 8000, 8000)
            assert rule["securityGroupId"] == "u0-sg-id"
            assert rule["tags"]["ale-stack"] == "ec2-test"
        assert not mocks.of_type(EGRESS)  # no outbound network unless the route asks

    route = aws_route(allowed_source_ranges=[RUNNER, RUNNER_V6], vpc_id="vpc-9", subnet_id="subnet-9")
    return one_unit(route).apply(check)


@pulumi.runtime.test
def test_aws_private_windows_route_under_mocks(mocks: RecordingMocks) -> pulumi.Output[Any]:
    def check(handle: dict[str, Any]) -> None:
        vm = mocks.one(INSTANCE).inputs
        assert vm["associatePublicIpAddress"] is False
        assert vm["subnetId"] == "subnet-9"
        assert vm["keyName"] == "ops"
        user_data = vm["userData"]
        assert user_data.startswith("<powershell>\n") and user_data.endswith("</powershell>\n<persist>true</persist>\n")
        assert "shutdown.exe /s /t $left" in user_data and "AddSeconds(14400)" in user_data
        assert handle["endpoint"] == f"http://{mocks.address('u0-vm', 'privateIp', public=False)}:8000"
        assert handle["os"] == "windows"
        ssh = mocks.one(INGRESS, "u0-ssh-0").inputs
        assert (ssh["cidrIpv4"], ssh["fromPort"], ssh["toPort"]) == ("192.0.2.0/28", 22, 22)
        egress = mocks.one(EGRESS, "u0-egress").inputs
        assert (egress["ipProtocol"], egress["cidrIpv4"]) == ("-1", "0.0.0.0/0")
        assert "egress" not in mocks.one(SG, "u0-sg").inputs  # inline egress would fight the rule resource

    route = aws_route(
        os="windows",
        reach_privately=True,
        vpc_id="vpc-9",
        subnet_id="subnet-9",
        key_name="ops",
        ssh_source_ranges=["192.0.2.0/28"],
        allow_outbound=True,
        ttl_hours=4,
    )
    return one_unit(route).apply(check)


@pulumi.runtime.test
def test_aws_units_share_one_provider_per_region_under_mocks(mocks: RecordingMocks) -> pulumi.Output[Any]:
    def check(_: Any) -> None:
        providers = {r.name: r.inputs for r in mocks.of_type(PROVIDER)}
        assert sorted(providers) == ["aws-eu-central-1", "aws-us-west-2"]
        assert providers["aws-us-west-2"]["region"] == "us-west-2"
        assert {"accessKey", "secretKey", "token"}.isdisjoint(providers["aws-us-west-2"])  # env credentials only
        by_vm = {r.name: r.provider for r in mocks.of_type(INSTANCE)}
        assert by_vm == {"a-vm": "aws-eu-central-1", "b-vm": "aws-eu-central-1", "c-vm": "aws-us-west-2"}

    prof = profile({"eu": aws_route(), "us": aws_route(region="us-west-2")})
    handles = declare_units(prof, [UnitSpec("a", "eu"), UnitSpec("b", "eu"), UnitSpec("c", "us")], stack="ec2-test")
    return pulumi.Output.all(*handles.values()).apply(check)


@pulumi.runtime.test
def test_aws_gpu_hint_maps_through_the_shape_table_under_mocks(mocks: RecordingMocks) -> pulumi.Output[Any]:
    def check(_: Any) -> None:
        types = {r.name: r.inputs["instanceType"] for r in mocks.of_type(INSTANCE)}
        assert types == {"t4-vm": "g4dn.2xlarge", "l4-vm": "g6.xlarge", "route-gpu-vm": "g5.xlarge"}

    prof = profile({"cpu": aws_route(), "gpu": aws_route(gpu="nvidia-a10g")})
    units = [
        UnitSpec("t4", "cpu", Shape(gpu="nvidia-tesla-t4", memory_gb=20)),
        UnitSpec("l4", "cpu", Shape(gpu="L4")),
        UnitSpec("route-gpu", "gpu"),
    ]
    handles = declare_units(prof, units, stack="ec2-test")
    return pulumi.Output.all(*handles.values()).apply(check)
