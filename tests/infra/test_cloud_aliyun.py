"""Alibaba Cloud ECS declarations, checked under Pulumi mocks (no cloud, no alicloud plugin here)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pulumi
import pytest

from ale_iac.contract import Shape, UnitOutputs, UnitSpec
from ale_iac.errors import ConfigError
from ale_iac.infra.mocks import RecordingMocks
from ale_iac.profile import parse_profile
from tests.support.cloud import RUNNER, RUNNER_V6, aliyun_route, cloud_mocks, declare_units, profile

INSTANCE = "alicloud:ecs/instance:Instance"
SG = "alicloud:ecs/securityGroup:SecurityGroup"
RULE = "alicloud:ecs/securityGroupRule:SecurityGroupRule"


@pytest.fixture(autouse=True)
def mocks() -> Iterator[RecordingMocks]:
    with cloud_mocks("ecs-test") as recording:
        yield recording


def one_unit(route: dict[str, Any], unit: UnitSpec | None = None) -> pulumi.Output[Any]:
    unit = unit or UnitSpec("u0", "snap")
    return declare_units(profile({"snap": route}), [unit], stack="ecs-test")[unit.name]


@pulumi.runtime.test
def test_aliyun_unit_declares_instance_with_auto_release_and_tags_under_mocks(
    mocks: RecordingMocks,
) -> pulumi.Output[Any]:
    def check(handle: dict[str, Any]) -> None:
        vm = mocks.one(INSTANCE, "u0-vm")
        assert vm.parent == "u0" and vm.provider == "alicloud-cn-shanghai"
        inputs = vm.inputs
        assert inputs["imageId"] == "m-desktop"
        assert inputs["instanceType"] == "ecs.g7.2xlarge"  # >= 8 vCPU, >= 32 GiB, cheapest
        # TTL: ECS releases the instance itself; only pay-as-you-go instances honour it.
        assert inputs["autoReleaseTime"] == "2026-11-30T21:41:00Z"
        assert inputs["instanceChargeType"] == "PostPaid"
        assert inputs["spotStrategy"] == "NoSpot"
        assert inputs["vswitchId"] == "vsw-1"
        assert inputs["securityGroups"] == ["u0-sg-id"]
        assert inputs["systemDiskSize"] == 80
        assert inputs["systemDiskCategory"] == "cloud_essd"
        assert inputs["internetMaxBandwidthOut"] == 10 and inputs["internetChargeType"] == "PayByTraffic"
        assert inputs["httpTokens"] == "required"
        assert "password" not in inputs and "kmsEncryptedPassword" not in inputs
        labels = {
            "ale-run": "ecs-test",
            "ale-unit": "u0",
            "ale-stack": "ecs-test",
            "ale-expiry": "20261130t2141z",
            "ale-profile": "test",
            "ale-snapshot": "snap",
            "ale-egress": "none",
            "managed-by": "ale-iac",
        }
        assert inputs["tags"] == labels and inputs["volumeTags"] == labels
        assert "-m computer_server --host 0.0.0.0 --port 8000" in inputs["userData"]
        assert "CONTAINER_NAME=" not in inputs["userData"]
        assert vm.ignore_changes == ("autoReleaseTime", 'tags["ale-expiry"]', 'volumeTags["ale-expiry"]')
        parsed = UnitOutputs.model_validate(handle)
        assert parsed.endpoint == f"http://{mocks.address('u0-vm', 'publicIp', public=True)}:8000"
        assert parsed.region == "cn-shanghai"
        assert parsed.expires_at == "2026-11-30T21:41:00Z"
        assert parsed.resource_id == "u0-vm-id"

    unit = UnitSpec("u0", "snap", Shape(vcpus=8, memory_gb=32, disk_gb=80))
    return one_unit(aliyun_route(ttl_hours=12), unit).apply(check)


@pulumi.runtime.test
def test_aliyun_security_group_rules_admit_only_the_route_ranges_under_mocks(
    mocks: RecordingMocks,
) -> pulumi.Output[Any]:
    def check(_: Any) -> None:
        sg = mocks.one(SG, "u0-sg").inputs
        assert sg["vpcId"] == "vpc-1"
        assert sg["innerAccessPolicy"] == "Drop"
        assert sg["tags"]["ale-unit"] == "u0"
        rules = {r.name: r.inputs for r in mocks.of_type(RULE)}
        assert sorted(rules) == ["u0-deny-egress", "u0-deny-egress-v6", "u0-metadata", "u0-server-0", "u0-server-1"]
        v4, v6 = rules["u0-server-0"], rules["u0-server-1"]
        assert (v4["cidrIp"], v6["ipv6CidrIp"]) == (RUNNER, RUNNER_V6)
        for rule in (v4, v6):
            assert rule["type"] == "ingress" and rule["policy"] == "accept"
            assert (rule["ipProtocol"], rule["portRange"]) == ("tcp", "8000/8000")
            assert rule["securityGroupId"] == "u0-sg-id"
            assert rule["nicType"] == "intranet"
        deny = rules["u0-deny-egress"]
        assert (deny["type"], deny["policy"], deny["ipProtocol"], deny["cidrIp"], deny["priority"]) == (
            "egress",
            "drop",
            "all",
            "0.0.0.0/0",
            2,
        )
        assert (rules["u0-deny-egress-v6"]["ipv6CidrIp"], rules["u0-deny-egress-v6"]["policy"]) == ("::/0", "drop")
        metadata = rules["u0-metadata"]  # the one accept, before the drops
        assert (metadata["type"], metadata["policy"], metadata["priority"]) == ("egress", "accept", 1)
        assert (metadata["cidrIp"], metadata["ipProtocol"], metadata["portRange"]) == (
            "100.100.100.200/32",
            "tcp",
            "80/80",
        )

    return one_unit(aliyun_route(allowed_source_ranges=[RUNNER, RUNNER_V6])).apply(check)


@pulumi.runtime.test
def test_aliyun_private_windows_route_has_no_public_ip_under_mocks(mocks: RecordingMocks) -> pulumi.Output[Any]:
    def check(handle: dict[str, Any]) -> None:
        vm = mocks.one(INSTANCE).inputs
        assert vm["internetMaxBandwidthOut"] == 0
        assert "internetChargeType" not in vm
        assert vm["userData"].startswith("[powershell]\n")
        assert handle["endpoint"] == f"http://{mocks.address('u0-vm', 'privateIp', public=False)}:8000"
        assert handle["endpoint"].startswith("http://10.")
        rules = sorted(r.name for r in mocks.of_type(RULE))
        assert rules == ["u0-server-0", "u0-ssh-0"]  # allow_outbound: no egress drop; SSH as asked
        assert mocks.one(RULE, "u0-ssh-0").inputs["portRange"] == "22/22"

    route = aliyun_route(os="windows", reach_privately=True, allow_outbound=True, ssh_source_ranges=["192.0.2.0/28"])
    return one_unit(route).apply(check)


def test_aliyun_route_refuses_a_ttl_below_what_ecs_accepts() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_profile({"name": "p", "snapshots": {"s": aliyun_route(ttl_hours=0.25)}}, "stacks/Pulumi.p.yaml")
    assert str(caught.value) == (
        "stacks/Pulumi.p.yaml: ale-iac:profile.snapshots.s.ttl_hours: Input should be greater than or equal to 0.5"
    )
