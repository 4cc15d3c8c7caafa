"""Units of ale-iac's own cloud disk (``guest_agent``) and image imports, checked under Pulumi mocks (no cloud and
no provider plugin here): each unit's endpoint token is a secret in the VM's metadata and in its handle, and an
``image_import`` declares the import chain once, which the VMs boot from."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pulumi
import pytest

from ale_iac.cloud_routes import GUEST_AGENT_PORT
from ale_iac.contract import LINUX_DESKTOP_PATHS, UnitOutputs, UnitSpec, forwarder_channel
from ale_iac.errors import ConfigError
from ale_iac.infra import aliyun
from ale_iac.infra.endpoint_token import TOKEN_KEY, TTL_KEY
from ale_iac.infra.mocks import RecordingMocks
from ale_iac.infra.plan import render_profile, shipped_plan_path
from ale_iac.infra.policy import check_resource
from ale_iac.substrates import registry
from ale_iac.substrates.authproxy import MODEL_PORT
from ale_iac.substrates.qemu import cloud
from tests.support.cloud import aliyun_route, aws_route, cloud_mocks, declare_units, gcloud_route, profile

TOKEN_TYPE = "pulumi-python:dynamic/ale:EndpointToken"
SECRET_SIG = {"4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270"}
IMPORT = {"bucket": "ale-images", "object": "desktop/disk.img"}


@pytest.fixture(autouse=True)
def mocks() -> Iterator[RecordingMocks]:
    with cloud_mocks("img-test") as recording:
        yield recording


def _units(route: dict[str, Any], count: int = 1) -> list[pulumi.Output[Any]]:
    specs = [UnitSpec(f"u{i}", "snap") for i in range(count)]
    handles = declare_units(profile({"snap": route}), specs, stack="img-test")
    return [handles[spec.name] for spec in specs]


def _secret_value(value: Any) -> Any:
    """The value inside a secret input as the mocks received it; fails when the input is not secret."""
    assert isinstance(value, dict) and {k: value.get(k) for k in SECRET_SIG} == SECRET_SIG, value
    return value["value"]


def _checked(handle: pulumi.Output[Any], check: Callable[[dict[str, Any], bool], None]) -> pulumi.Output[Any]:
    return pulumi.Output.all(handle, pulumi.Output.from_input(handle.is_secret())).apply(lambda v: check(v[0], v[1]))


@pulumi.runtime.test
def test_gce_unit_of_the_own_disk_gets_its_token_as_secret_metadata_under_mocks(
    mocks: RecordingMocks,
) -> pulumi.Output[Any]:
    def check(handle: dict[str, Any], secret: bool) -> None:
        token = mocks.one(TOKEN_TYPE, "u0-token")
        assert token.parent == "u0"
        metadata = mocks.one("gcp:compute/instance:Instance", "u0-vm").inputs["metadata"]
        # Pulumi marks the whole property secret when a value in it is (the state and the plan hide all of it).
        values = _secret_value(metadata)
        assert values[TOKEN_KEY] == "mock-token-u0-token-0123456789"
        assert values[TTL_KEY] == str(2 * 3600)
        assert "startup-script" not in values  # the disk's own guest starts the server
        assert handle["endpoint_token"] == "mock-token-u0-token-0123456789"
        assert handle["endpoint"].endswith(f":{GUEST_AGENT_PORT}")
        assert secret, "the handle carries the token: it must be a secret output"
        rule = mocks.one("gcp:compute/firewall:Firewall", "u0-server")
        assert rule.inputs["allows"] == [{"protocol": "tcp", "ports": [str(GUEST_AGENT_PORT)]}]

    [handle] = _units(gcloud_route(guest_agent=True, ttl_hours=2))
    return _checked(handle, check)


@pulumi.runtime.test
def test_a_unit_of_another_image_gets_no_token_and_its_startup_script_under_mocks(
    mocks: RecordingMocks,
) -> pulumi.Output[Any]:
    def check(handle: dict[str, Any], secret: bool) -> None:
        assert [r for r in mocks.resources if r.type == TOKEN_TYPE] == []
        metadata = mocks.one("gcp:compute/instance:Instance", "u0-vm").inputs["metadata"]
        assert TOKEN_KEY not in metadata and "startup-script" in metadata
        assert handle["endpoint_token"] is None and handle["endpoint"].endswith(":8000")
        assert not secret

    [handle] = _units(gcloud_route())
    return _checked(handle, check)


@pulumi.runtime.test
def test_ec2_unit_of_the_own_disk_reads_its_token_from_secret_user_data_under_mocks(
    mocks: RecordingMocks,
) -> pulumi.Output[Any]:
    def check(handle: dict[str, Any], secret: bool) -> None:
        vm = mocks.one("aws:ec2/instance:Instance", "u0-vm").inputs
        lines = _secret_value(vm["userData"]).splitlines()
        assert f"{TOKEN_KEY}=mock-token-u0-token-0123456789" in lines
        assert f"{TTL_KEY}={3 * 3600}" in lines
        assert vm["metadataOptions"]["httpTokens"] == "required"  # IMDSv2 only
        assert (
            mocks.one("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", "u0-server-0").inputs["fromPort"]
            == GUEST_AGENT_PORT
        )
        assert secret and handle["endpoint_token"] == "mock-token-u0-token-0123456789"

    [handle] = _units(aws_route(guest_agent=True, ttl_hours=3))
    return _checked(handle, check)


@pulumi.runtime.test
def test_ecs_unit_of_the_own_disk_reads_its_token_from_secret_user_data_under_mocks(
    mocks: RecordingMocks,
) -> pulumi.Output[Any]:
    def check(handle: dict[str, Any], secret: bool) -> None:
        vm = mocks.one("alicloud:ecs/instance:Instance", "u0-vm").inputs
        assert f"{TOKEN_KEY}=mock-token-u0-token-0123456789" in _secret_value(vm["userData"]).splitlines()
        assert vm["httpTokens"] == "required"  # hardened metadata mode: the agent asks for a session first
        assert secret and handle["endpoint"].endswith(f":{GUEST_AGENT_PORT}")

    [handle] = _units(aliyun_route(guest_agent=True))
    return _checked(handle, check)


@pulumi.runtime.test
def test_gce_image_import_is_declared_once_and_the_vms_boot_from_it_under_mocks(
    mocks: RecordingMocks,
) -> pulumi.Output[Any]:
    def check(_: list[Any]) -> None:
        image = mocks.one("gcp:compute/image:Image", "image-ale-desktop-1")
        assert image.inputs["name"] == "ale-desktop-1" and image.inputs["project"] == "proj-1"
        assert image.inputs["rawDisk"]["source"] == "https://storage.googleapis.com/ale-images/desktop/disk.img"
        upload = mocks.one("gcp:storage/bucketObject:BucketObject", "image-ale-desktop-1-disk")
        assert upload.inputs["bucket"] == "ale-images" and upload.inputs["name"] == "desktop/disk.img"
        for unit in ("u0", "u1"):
            disk = mocks.one("gcp:compute/instance:Instance", f"{unit}-vm").inputs["bootDisk"]
            assert disk["initializeParams"]["image"] == "projects/proj-1/global/images/ale-desktop-1"
        assert len([r for r in mocks.resources if r.type == "gcp:compute/image:Image"]) == 1

    route = gcloud_route(guest_agent=True, image="ale-desktop-1", image_import={**IMPORT, "source": "/tmp/gce.tar.gz"})
    return pulumi.Output.all(*_units(route, count=2)).apply(check)


@pulumi.runtime.test
def test_ec2_image_import_is_a_snapshot_import_and_an_ami_under_mocks(mocks: RecordingMocks) -> pulumi.Output[Any]:
    def check(_: list[Any]) -> None:
        snapshot = mocks.one("aws:ebs/snapshotImport:SnapshotImport", "image-ale-desktop-1-snapshot").inputs
        assert snapshot["diskContainer"] == {
            "format": "VMDK",
            "userBucket": {"s3Bucket": "ale-images", "s3Key": "desktop/disk.img"},
        }
        assert snapshot["roleName"] == "vmimport" and snapshot["encrypted"] is True
        ami = mocks.one("aws:ec2/ami:Ami", "image-ale-desktop-1").inputs
        assert ami["bootMode"] == "legacy-bios" and ami["enaSupport"] is True and ami["imdsSupport"] == "v2.0"
        assert ami["ebsBlockDevices"][0]["snapshotId"] == "image-ale-desktop-1-snapshot-id"
        assert mocks.one("aws:ec2/instance:Instance", "u0-vm").inputs["ami"] == "image-ale-desktop-1-id"
        assert [r for r in mocks.resources if r.type == "aws:s3/bucketObjectv2:BucketObjectv2"] == []

    return _units(aws_route(guest_agent=True, image="ale-desktop-1", image_import=IMPORT))[0].apply(check)


@pulumi.runtime.test
def test_ecs_image_import_names_the_oss_object_and_the_disk_size_under_mocks(
    mocks: RecordingMocks,
) -> pulumi.Output[Any]:
    def check(_: Any) -> None:
        imported = mocks.one("alicloud:ecs/imageImport:ImageImport", "image-ale-desktop-1").inputs
        [mapping] = imported["diskDeviceMappings"]
        assert mapping == {
            "ossBucket": "ale-images",
            "ossObject": "desktop/disk.img",
            "format": "qcow2",
            "diskImageSize": cloud.DISK_GB,
        }
        assert imported["bootMode"] == "BIOS" and imported["imageName"] == "ale-desktop-1"
        assert mocks.one("alicloud:ecs/instance:Instance", "u0-vm").inputs["imageId"] == "image-ale-desktop-1-id"

    assert aliyun.DISK_IMAGE_GB == cloud.DISK_GB
    return _units(aliyun_route(guest_agent=True, image="ale-desktop-1", image_import=IMPORT))[0].apply(check)


def test_a_gce_image_import_needs_a_gce_name_for_the_new_image() -> None:
    with pytest.raises(ConfigError, match=r"snapshots\.snap.*image_import, image is the new image's name"):
        profile({"snap": gcloud_route(image="projects/p/global/images/x", image_import=IMPORT)})


@pulumi.runtime.test
def test_the_policy_pack_sees_the_guest_agents_time_to_live_in_secret_user_data_under_mocks(
    mocks: RecordingMocks,
) -> pulumi.Output[Any]:
    def check(_: Any) -> None:
        vm = mocks.one("aws:ec2/instance:Instance", "u0-vm")
        assert check_resource(vm.type, vm.inputs) == []
        without_ttl = {**vm.inputs, "userData": {**vm.inputs["userData"], "value": f"{TOKEN_KEY}=x\n"}}
        assert [v.policy for v in check_resource(vm.type, without_ttl)] == ["ale-vm-ttl"]

    return _units(aws_route(guest_agent=True))[0].apply(check)


def test_the_shipped_plans_show_the_imports_and_tokens_but_no_token_value() -> None:
    for stack in ("gcloud", "aws", "aliyun"):
        text = shipped_plan_path(stack).read_text()
        assert "pulumi-python:dynamic/ale:EndpointToken" in text and "endpoint_token: '[secret]'" in text
        assert "<token>" not in text and "mock-token" not in text
    assert "gcp:compute/image:Image" in shipped_plan_path("gcloud").read_text()
    assert "aws:ebs/snapshotImport:SnapshotImport" in shipped_plan_path("aws").read_text()
    assert "alicloud:ecs/imageImport:ImageImport" in shipped_plan_path("aliyun").read_text()


ROUTES = {"gcloud": gcloud_route, "aws": aws_route, "aliyun": aliyun_route}


@pytest.mark.parametrize("cloud_kind", sorted(ROUTES))
@pulumi.runtime.test
def test_a_unit_of_the_own_disk_carries_the_forwarder_s_channel_and_the_disk_s_paths_under_mocks(
    cloud_kind: str,
) -> pulumi.Output[Any]:
    """Its endpoint is ale-iac's forwarder: the handle says so (``gateway_channel``, the model channel at the
    forwarder's port inside), the runner's check accepts it, and the paths the sandbox executor stages its runtime
    at are the desktop disk's (the image's python3, /root/.ale)."""

    def check(handles: list[dict[str, Any]]) -> None:
        own, other = (UnitOutputs.model_validate(h) for h in handles)
        assert own.gateway_channel == forwarder_channel()
        assert own.gateway_channel.sandbox_url == f"http://127.0.0.1:{MODEL_PORT}"
        assert registry.require_channel(own) == own.gateway_channel
        assert own.paths == LINUX_DESKTOP_PATHS and own.inner_endpoint == "http://127.0.0.1:8000"
        assert other.gateway_channel is None

    route = ROUTES[cloud_kind]
    routes = {"own": route(guest_agent=True), "other": route()}
    handles = declare_units(profile(routes), [UnitSpec("u0", "own"), UnitSpec("u1", "other")], stack="img-test")
    return pulumi.Output.all(handles["u0"], handles["u1"]).apply(check)


def test_the_own_disk_is_linux() -> None:
    with pytest.raises(ConfigError, match=r"snapshots\.snap\.guest_agent: guest_agent: true is ale-iac's own disk"):
        profile({"snap": gcloud_route(guest_agent=True, os="windows")})


@pytest.mark.parametrize("stack", ["gcloud", "aws", "aliyun"])
def test_each_cloud_profile_s_own_disk_units_carry_the_channel_in_the_plan(stack: str) -> None:
    text = render_profile(stack).text
    handles = text.count("endpoint_token: '[secret]'")  # the own disk's units: a token each
    assert handles and text.count(f"sandbox_url: http://127.0.0.1:{MODEL_PORT}") == handles


@pulumi.runtime.test
def test_a_static_route_of_forwarders_carries_the_channel_under_mocks(
    monkeypatch: pytest.MonkeyPatch,
) -> pulumi.Output[Any]:
    """``forwarder: true`` is the route's word that its endpoints are ale-iac forwarders (a VM of the disk booted
    elsewhere, say): their handles carry the channel; a plain static endpoint's do not."""
    monkeypatch.setenv("ALE_TEST_STATIC_TOKEN", "t0ken")
    endpoints = ["http://127.0.0.1:9", "http://127.0.0.1:11"]  # unit i of the stack takes endpoint i
    endpoint = {"provider": "static", "endpoints": endpoints, "endpoint_token_env": "ALE_TEST_STATIC_TOKEN"}
    routes = {"fw": {**endpoint, "forwarder": True}, "plain": endpoint}

    def check(handles: list[dict[str, Any]]) -> None:
        fw, plain = (UnitOutputs.model_validate(h) for h in handles)
        assert fw.gateway_channel == forwarder_channel() and fw.token() == "t0ken" and not fw.managed
        assert plain.gateway_channel is None

    handles = declare_units(profile(routes), [UnitSpec("u0", "fw"), UnitSpec("u1", "plain")], stack="img-test")
    return pulumi.Output.all(handles["u0"], handles["u1"]).apply(check)
