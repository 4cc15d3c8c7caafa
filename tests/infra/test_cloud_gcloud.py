"""GCE declarations, checked under Pulumi mocks (no cloud and no gcp provider plugin here)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pulumi
import pytest

from ale_iac.contract import LINUX_DESKTOP_PATHS, WINDOWS_DESKTOP_PATHS, Shape, UnitOutputs, UnitSpec
from ale_iac.infra.cloud_common import LABEL_KEYS
from ale_iac.infra.mocks import RecordingMocks
from ale_iac.infra.shapes import ShapeError
from tests.support.cloud import RUNNER, RUNNER_V6, cloud_mocks, declare_units, gcloud_route, profile

INSTANCE = "gcp:compute/instance:Instance"
FROM_MACHINE_IMAGE = "gcp:compute/instanceFromMachineImage:InstanceFromMachineImage"
FIREWALL = "gcp:compute/firewall:Firewall"


@pytest.fixture(autouse=True)
def mocks() -> Iterator[RecordingMocks]:
    with cloud_mocks("gce-test") as recording:
        yield recording


def one_unit(route: dict[str, Any], unit: UnitSpec | None = None) -> pulumi.Output[Any]:
    unit = unit or UnitSpec("u0", "snap")
    return declare_units(profile({"snap": route}), [unit], stack="gce-test")[unit.name]


@pulumi.runtime.test
def test_gcloud_unit_declares_instance_with_ttl_labels_and_startup_script_under_mocks(
    mocks: RecordingMocks,
) -> pulumi.Output[Any]:
    def check(handle: dict[str, Any]) -> None:
        component = mocks.one("ale-iac:gcloud:Unit", "u0")
        assert component.parent is None
        vm = mocks.one(INSTANCE, "u0-vm")
        assert vm.parent == "u0"
        inputs = vm.inputs
        assert inputs["project"] == "proj-1"
        assert inputs["zone"] == "europe-west4-b"
        assert inputs["machineType"] == "n2-standard-4"  # cloud default: no hints anywhere
        disk = inputs["bootDisk"]
        assert disk["autoDelete"] is True
        assert disk["initializeParams"]["image"] == "projects/proj-1/global/images/family/ale-desktop"
        assert disk["initializeParams"]["size"] == 40
        assert disk["initializeParams"]["type"] == "pd-balanced"
        # TTL: GCE deletes the VM itself after ttl_hours.
        assert inputs["scheduling"]["maxRunDuration"]["seconds"] == 2 * 3600
        assert inputs["scheduling"]["instanceTerminationAction"] == "DELETE"
        assert inputs["scheduling"]["provisioningModel"] == "STANDARD"
        # Labels on the VM and its disk: run, unit, stack, expiry (+ profile, snapshot, managed-by).
        expected = {
            "ale-run": "gce-test",
            "ale-unit": "u0",
            "ale-stack": "gce-test",
            "ale-expiry": "20261130t1141z",
            "ale-profile": "test",
            "ale-snapshot": "snap",
            "ale-egress": "none",
            "managed-by": "ale-iac",
        }
        assert inputs["labels"] == expected
        assert disk["initializeParams"]["labels"] == expected
        # Startup script: the server on the route's port, never with CONTAINER_NAME set.
        script = inputs["metadata"]["startup-script"]
        assert "-m computer_server --host 0.0.0.0 --port 8000" in script
        assert "unset CONTAINER_NAME" in script and "UnsetEnvironment=CONTAINER_NAME" in script
        assert "CONTAINER_NAME=" not in script
        assert inputs["metadata"]["enable-oslogin"] == "TRUE"
        assert "serviceAccount" not in inputs  # no cloud credentials inside the sandbox
        # Public by default: one ephemeral external IP.
        assert inputs["networkInterfaces"] == [{"network": "default", "accessConfigs": [{}]}]
        assert handle["endpoint"] == f"http://{mocks.address('u0-vm', 'natIP', public=True)}:8000"

    return one_unit(gcloud_route(disk_gb=40, ttl_hours=2)).apply(check)


@pulumi.runtime.test
def test_gcloud_firewall_admits_only_the_route_ranges_to_the_server_port_under_mocks(
    mocks: RecordingMocks,
) -> pulumi.Output[Any]:
    def check(_: Any) -> None:
        tags = mocks.one(INSTANCE, "u0-vm").inputs["tags"]
        assert len(tags) == 1 and tags[0].startswith("ale-u0-")
        server = mocks.one(FIREWALL, "u0-server").inputs
        assert server["direction"] == "INGRESS"
        assert server["sourceRanges"] == [RUNNER]
        assert server["allows"] == [{"protocol": "tcp", "ports": ["8000"]}]
        assert server["targetTags"] == tags
        assert server["project"] == "proj-1" and server["network"] == "default"
        assert "u0" in server["description"] and "gce-test" in server["description"]
        # GCE firewalls take one address family each.
        server6 = mocks.one(FIREWALL, "u0-server-v6").inputs
        assert server6["sourceRanges"] == [RUNNER_V6]
        assert server6["allows"] == [{"protocol": "tcp", "ports": ["8000"]}]
        # SSH stays closed; egress is denied.
        names = sorted(r.name for r in mocks.of_type(FIREWALL))
        assert names == ["u0-deny-egress", "u0-deny-egress-v6", "u0-server", "u0-server-v6"]
        for name, everything in (("u0-deny-egress", "0.0.0.0/0"), ("u0-deny-egress-v6", "::/0")):
            deny = mocks.one(FIREWALL, name).inputs
            assert deny["direction"] == "EGRESS" and deny["priority"] == 0  # before any allow of the VPC
            assert deny["denies"] == [{"protocol": "all"}] and "allows" not in deny
            assert deny["destinationRanges"] == [everything]
            assert deny["targetTags"] == tags

    return one_unit(gcloud_route(allowed_source_ranges=[RUNNER, RUNNER_V6])).apply(check)


@pulumi.runtime.test
def test_gcloud_ssh_opens_only_when_the_route_asks_under_mocks(mocks: RecordingMocks) -> pulumi.Output[Any]:
    def check(_: Any) -> None:
        ssh = mocks.one(FIREWALL, "u0-ssh").inputs
        assert ssh["sourceRanges"] == ["192.0.2.0/28"]
        assert ssh["allows"] == [{"protocol": "tcp", "ports": ["22"]}]
        assert mocks.one(FIREWALL, "u0-server").inputs["sourceRanges"] == [RUNNER]
        assert not [r for r in mocks.of_type(FIREWALL) if "deny-egress" in r.name]  # allow_outbound

    return one_unit(gcloud_route(ssh_source_ranges=["192.0.2.0/28"], allow_outbound=True)).apply(check)


@pulumi.runtime.test
def test_gcloud_private_route_gets_no_public_ip_under_mocks(mocks: RecordingMocks) -> pulumi.Output[Any]:
    def check(handle: dict[str, Any]) -> None:
        nic = mocks.one(INSTANCE, "u0-vm").inputs["networkInterfaces"][0]
        assert nic.get("accessConfigs", []) == []
        assert nic["network"] == "runners" and nic["subnetwork"] == "runners-eu"
        assert handle["endpoint"] == f"http://{mocks.address('u0-vm', 'networkIP', public=False)}:8000"
        assert handle["endpoint"].startswith("http://10.")

    route = gcloud_route(reach_privately=True, network="runners", subnetwork="runners-eu")
    return one_unit(route).apply(check)


@pulumi.runtime.test
def test_gcloud_machine_image_route_uses_instance_from_machine_image_under_mocks(
    mocks: RecordingMocks,
) -> pulumi.Output[Any]:
    def check(handle: dict[str, Any]) -> None:
        assert not mocks.of_type(INSTANCE)
        vm = mocks.one(FROM_MACHINE_IMAGE, "u0-vm").inputs
        assert vm["sourceMachineImage"] == "projects/proj-1/global/machineImages/ale-win10"
        assert "bootDisk" not in vm  # a machine image fixes its disks
        assert vm["machineType"] == "g2-standard-8"  # 6 vCPUs asked: the smallest L4 vWS type with >= 6
        assert vm["guestAccelerators"] == [{"type": "nvidia-l4-vws", "count": 1}]
        assert vm["scheduling"]["onHostMaintenance"] == "TERMINATE"  # GPUs cannot live-migrate
        assert vm["scheduling"]["maxRunDuration"]["seconds"] == 6 * 3600
        assert vm["scheduling"]["instanceTerminationAction"] == "DELETE"
        assert vm["enableDisplay"] is True
        script = vm["metadata"]["windows-startup-script-ps1"]
        assert "--port 8000" in script and '"CONTAINER_NAME", $null' in script
        assert set(LABEL_KEYS) <= set(vm["labels"])
        assert handle["os"] == "windows"
        assert handle["paths"] == WINDOWS_DESKTOP_PATHS.model_dump()

    route = gcloud_route(image="projects/proj-1/global/machineImages/ale-win10", os="windows", gpu="nvidia-l4-vws")
    return one_unit(route, UnitSpec("u0", "snap", Shape(vcpus=6))).apply(check)


@pulumi.runtime.test
def test_gcloud_handle_follows_the_unit_outputs_contract_under_mocks(mocks: RecordingMocks) -> pulumi.Output[Any]:
    def check(handle: dict[str, Any]) -> None:
        parsed = UnitOutputs.model_validate(handle)
        assert parsed.unit == "agent_a/task 1"
        assert parsed.provider == "gcloud"
        assert parsed.snapshot == "snap"
        assert parsed.resource_id == f"{mocks.of_type(INSTANCE)[0].name}-id"
        assert parsed.region == "europe-west4-b"
        assert parsed.expires_at == "2026-11-30T15:41:00Z"
        assert parsed.managed is True
        assert parsed.os == "linux"
        assert parsed.paths == LINUX_DESKTOP_PATHS
        assert parsed.endpoint.endswith(":9001")
        assert parsed.labels["ale-run"] == "run-20261130"
        assert parsed.labels["ale-unit"] == "agent_a-task-1"  # cleaned to the GCE label charset
        assert parsed.labels["team"] == "evals"

    unit = UnitSpec("agent_a/task 1", "snap", labels={"run": "Run-20261130", "Team": "Evals"})
    return one_unit(gcloud_route(server_port=9001), unit).apply(check)


@pulumi.runtime.test
def test_gcloud_task_hints_pick_machine_type_and_disk_under_mocks(mocks: RecordingMocks) -> pulumi.Output[Any]:
    def check(_: Any) -> None:
        vms = {r.name: r.inputs for r in mocks.of_type(INSTANCE)}
        assert vms["hinted-vm"]["machineType"] == "n2-highmem-8"  # >= 8 vCPU and >= 40 GiB, cheapest
        assert vms["hinted-vm"]["bootDisk"]["initializeParams"]["size"] == 120  # task disk beats the route's
        assert vms["override-vm"]["machineType"] == "c4-standard-8"  # explicit override wins
        assert vms["override-vm"]["bootDisk"]["initializeParams"]["type"] == "hyperdisk-balanced"
        assert vms["plain-vm"]["machineType"] == "e2-standard-4"  # the route's default
        assert vms["plain-vm"]["bootDisk"]["initializeParams"]["size"] == 30

    prof = profile({"snap": gcloud_route(machine_type="e2-standard-4", disk_gb=30)})
    units = [
        UnitSpec("hinted", "snap", Shape(vcpus=8, memory_gb=40, disk_gb=120)),
        UnitSpec("override", "snap", Shape(vcpus=64, machine_type="c4-standard-8")),
        UnitSpec("plain", "snap"),
    ]
    handles = declare_units(prof, units, stack="gce-test")
    return pulumi.Output.all(*handles.values()).apply(check)


@pulumi.runtime.test
def test_gcloud_expiry_is_not_pushed_forward_by_a_later_up_under_mocks(mocks: RecordingMocks) -> pulumi.Output[Any]:
    def check(_: Any) -> None:
        assert mocks.one(INSTANCE, "u0-vm").ignore_changes == (
            'labels["ale-expiry"]',
            'bootDisk.initializeParams.labels["ale-expiry"]',
        )

    return one_unit(gcloud_route()).apply(check)


def test_gcloud_unit_that_cannot_be_sized_registers_nothing_under_mocks(mocks: RecordingMocks) -> None:
    prof = profile({"snap": gcloud_route()})

    @pulumi.runtime.test  # waits for every registration the program started before re-raising
    def attempt() -> pulumi.Output[Any]:
        return declare_units(prof, [UnitSpec("big", "snap", Shape(vcpus=512))], stack="gce-test")["big"]

    with pytest.raises(ShapeError, match="unit 'big': no gcloud type in the shape table fits vcpus>=512"):
        attempt()
    assert mocks.resources == []
