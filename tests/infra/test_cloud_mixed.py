"""A mixed-provider profile (stacks/Pulumi.mixed.yaml) routes each snapshot to its provider, under mocks.

The local unit is declared by the real ``ale_iac.infra.local`` (its dynamic resource is recorded by
the mocks, not created), so the desktop image must be built, as the setup script does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pulumi
import pytest

from ale_iac.contract import UnitSpec
from ale_iac.errors import ConfigError
from ale_iac.infra.mocks import RecordingMocks
from ale_iac.profile import resolve_profile
from tests.support.cloud import cloud_mocks, declare_units


@pytest.fixture(autouse=True)
def mocks() -> Iterator[RecordingMocks]:
    with cloud_mocks("mixed") as recording:
        yield recording


@pytest.mark.image
@pulumi.runtime.test
def test_mixed_profile_routes_each_snapshot_to_its_provider_under_mocks(mocks: RecordingMocks) -> pulumi.Output[Any]:
    profile = resolve_profile("mixed").profile
    units = [
        UnitSpec("ubuntu-task", "cpu-free-ubuntu"),
        UnitSpec("gpu-task", "gpu-free"),
        UnitSpec("win-task", "cpu-free"),
        UnitSpec("no-snapshot-task"),  # the profile's default snapshot: cpu-free-ubuntu
    ]

    def check(handles: dict[str, Any]) -> None:
        local = [r for r in mocks.resources if r.type == "pulumi-python:dynamic/ale:LocalSandbox"]
        assert sorted(r.name for r in local) == ["no-snapshot-task", "ubuntu-task"]
        assert {r.inputs["screen_width"] for r in local} == {1280}
        assert handles["ubuntu-task"]["endpoint"].startswith("http://127.0.0.1:")
        assert {name: handle["provider"] for name, handle in handles.items()} == {
            "ubuntu-task": "local",
            "gpu-task": "gcloud",
            "win-task": "aws",
            "no-snapshot-task": "local",
        }
        gce = mocks.one("gcp:compute/instanceFromMachineImage:InstanceFromMachineImage", "gpu-task-vm")
        assert gce.parent == "gpu-task" and gce.inputs["guestAccelerators"] == [{"type": "nvidia-l4-vws", "count": 1}]
        ec2 = mocks.one("aws:ec2/instance:Instance", "win-task-vm")
        assert ec2.parent == "win-task" and ec2.inputs["userData"].startswith("<powershell>")
        assert {r.type for r in mocks.resources if r.custom} == {
            "gcp:compute/instanceFromMachineImage:InstanceFromMachineImage",
            "gcp:compute/firewall:Firewall",
            "aws:ec2/instance:Instance",
            "aws:ec2/securityGroup:SecurityGroup",
            "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
            "pulumi:providers:aws",
            "pulumi-python:dynamic/ale:LocalSandbox",
        }
        assert handles["gpu-task"]["snapshot"] == "gpu-free" and handles["win-task"]["os"] == "windows"

    return pulumi.Output.from_input(declare_units(profile, units, stack="mixed")).apply(check)


def test_mixed_profile_refuses_a_snapshot_it_does_not_route() -> None:
    profile = resolve_profile("mixed").profile
    with pytest.raises(ConfigError) as caught:
        profile.route("gpu-license")
    assert str(caught.value) == (
        "profile mixed: snapshots: no route for snapshot 'gpu-license' (routes: cpu-free, cpu-free-ubuntu, gpu-free)"
    )
