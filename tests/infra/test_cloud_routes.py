"""Cloud route models, the shipped stack files, labels, expiry and startup scripts (no Pulumi)."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from ale_iac.cloud_routes import AwsRoute, GcloudRoute, find_clear_credentials
from ale_iac.errors import ConfigError
from ale_iac.infra.cloud_common import (
    Expiry,
    expiry_for,
    expiry_label_to_iso,
    is_expired,
    label_key,
    label_value,
    startup_script,
    unit_slug,
    use_clock,
)
from ale_iac.profile import load_profile_file, stacks_dir
from tests.support.cloud import aliyun_route, aws_route, gcloud_route

CLOUD_STACKS = ("gcloud", "aws", "aliyun", "pool-gcloud", "mixed")
GCE_LABEL = re.compile(r"^[a-z0-9_-]{0,63}$")


def write_stack(tmp_path: Path, route: dict[str, object]) -> Path:
    path = tmp_path / "Pulumi.cloudy.yaml"
    path.write_text(yaml.safe_dump({"config": {"ale-iac:profile": {"name": "cloudy", "snapshots": {"gpu": route}}}}))
    return path


@pytest.mark.parametrize("route", [gcloud_route(), aws_route(), aliyun_route()], ids=["gcloud", "aws", "aliyun"])
def test_cloud_route_without_allowed_source_ranges_is_refused_naming_file_and_field(
    tmp_path: Path, route: dict[str, object]
) -> None:
    route = {k: v for k, v in route.items() if k != "allowed_source_ranges"}
    path = write_stack(tmp_path, route)
    with pytest.raises(ConfigError) as caught:
        load_profile_file(path)
    message = str(caught.value)
    assert message == (
        f"{path}: ale-iac:profile.snapshots.gpu.allowed_source_ranges: required: list the runner's CIDR ranges "
        "(there is no default and no 0.0.0.0/0, because the computer-server has no authentication)"
    )
    assert "\n" not in message


@pytest.mark.parametrize(
    ("ranges", "field", "problem"),
    [
        ([], "allowed_source_ranges", "required: list the runner's CIDR ranges"),
        (["0.0.0.0/0"], "allowed_source_ranges", "'0.0.0.0/0' opens the port to the whole internet"),
        (["10.0.0.0/8", "::/0"], "allowed_source_ranges", "'::/0' opens the port to the whole internet"),
        (["0.0.0.0/1"], "allowed_source_ranges", "'0.0.0.0/1' is wider than /8"),
        (["2000::/3"], "allowed_source_ranges", "'2000::/3' is wider than /32"),
        (["my-office"], "allowed_source_ranges", "'my-office' is not a CIDR range"),
    ],
)
def test_world_open_and_malformed_ranges_are_refused(
    tmp_path: Path, ranges: list[str], field: str, problem: str
) -> None:
    path = write_stack(tmp_path, gcloud_route(allowed_source_ranges=ranges))
    with pytest.raises(ConfigError) as caught:
        load_profile_file(path)
    assert f"snapshots.gpu.{field}: {problem}" in str(caught.value)


def test_ssh_ranges_obey_the_same_rules_and_default_to_closed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_profile_file(write_stack(tmp_path, aws_route(ssh_source_ranges=["0.0.0.0/0"])))
    assert "snapshots.gpu.ssh_source_ranges: '0.0.0.0/0' opens the port" in str(caught.value)
    route = AwsRoute.model_validate(aws_route())
    assert route.ssh_source_ranges == []


def test_route_knobs_cannot_carry_secrets(tmp_path: Path) -> None:
    for knob in ("password", "access_key", "secret_key", "credentials"):
        with pytest.raises(ConfigError) as caught:
            load_profile_file(write_stack(tmp_path, aliyun_route(**{knob: "hunter2"})))
        assert str(caught.value).endswith(f"snapshots.gpu.{knob}: unknown key")


def test_aws_subnet_requires_its_vpc(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_profile_file(write_stack(tmp_path, aws_route(subnet_id="subnet-1")))
    assert str(caught.value).endswith(
        "snapshots.gpu: subnet_id needs vpc_id too (the security group must be in the subnet's VPC)"
    )


def test_gcloud_machine_image_detection() -> None:
    assert GcloudRoute.model_validate(gcloud_route(image="projects/p/global/machineImages/w")).uses_machine_image
    assert not GcloudRoute.model_validate(gcloud_route(image="projects/p/global/images/family/f")).uses_machine_image


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_shipped_cloud_stacks_load_and_hold_no_clear_credentials(stack: str) -> None:
    path = stacks_dir() / f"Pulumi.{stack}.yaml"
    loaded = load_profile_file(path)
    for route in loaded.profile.snapshots.values():
        ranges = getattr(route, "allowed_source_ranges", None)
        assert ranges is None or (ranges and "0.0.0.0/0" not in ranges)
    assert find_clear_credentials(yaml.safe_load(path.read_text())["config"]) == []


def test_find_clear_credentials_flags_provider_keys_unless_secure() -> None:
    config = {
        "aws:region": "us-east-1",
        "aws:secretKey": "wJalrXUtnFEMI/K7MDENG",
        "alicloud:accessKey": {"secure": "v1:abc"},
        "gcp:credentials": "{...json...}",
        "myapp:dbPassword": "pw",
        "ale-iac:profile": {"name": "x"},
    }
    assert find_clear_credentials(config) == ["aws:secretKey", "gcp:credentials", "myapp:dbPassword"]


@pytest.mark.parametrize(
    "text",
    ["Agent_A/Task 1", "x" * 200, "aliyun-box", "run:2026-11-30T12:00:00Z", "ÜBER-task", "", "acs:thing"],
)
def test_label_values_and_keys_fit_every_cloud(text: str) -> None:
    value = label_value(text)
    assert GCE_LABEL.match(value), value
    assert not value.startswith(("aliyun", "acs:"))
    key = label_key(text or "k")
    assert GCE_LABEL.match(key) and key[0].isalpha() and not key.startswith(("aliyun", "acs"))
    if len(text) > 63:
        assert label_value(text) != label_value(text[:-1] + "y")  # shortened values stay distinct


def test_unit_slug_is_a_valid_gce_name_prefix_and_keeps_names_apart() -> None:
    assert unit_slug("u0") == "u0"
    assert unit_slug("cpu-free-ubuntu-000") == "cpu-free-ubuntu-000"
    slugs = {unit_slug(n) for n in ("a_b", "a-b", "A B", "0lead", "x" * 80)}
    assert len(slugs) == 5
    for slug in slugs:
        assert re.match(r"^[a-z]([-a-z0-9]*[a-z0-9])?$", slug) and len(slug) <= 40, slug


def test_expiry_is_deploy_time_plus_ttl_in_label_and_iso_forms() -> None:
    with use_clock(lambda: datetime(2026, 2, 28, 23, 30, 59, tzinfo=UTC)):
        expiry = expiry_for(1.5)
    assert expiry == Expiry(at=datetime(2026, 3, 1, 1, 0, tzinfo=UTC), ttl_seconds=5400)
    assert expiry.label == "20260301t0100z" and GCE_LABEL.match(expiry.label)
    assert expiry.iso == "2026-03-01T01:00:00Z"
    assert expiry_label_to_iso(expiry.label) == expiry.iso
    assert expiry_label_to_iso("soon") is None


def test_is_expired_reads_the_expiry_label_for_gc() -> None:
    at = datetime(2026, 3, 1, 1, 0, tzinfo=UTC)
    assert is_expired({"ale-expiry": "20260301t0059z"}, at)
    assert is_expired({"ale-expiry": "20260301t0100z"}, at)
    assert not is_expired({"ale-expiry": "20260301t0101z"}, at)
    assert not is_expired({"ale-expiry": "garbage"}, at)
    assert not is_expired({}, at)


@pytest.mark.parametrize("guest_ttl", [None, 3600])
def test_linux_startup_script_is_valid_sh_and_never_sets_container_name(tmp_path: Path, guest_ttl: int | None) -> None:
    route = AwsRoute.model_validate(aws_route(server_port=8123))
    script = startup_script(route, guest_ttl_seconds=guest_ttl)
    path = tmp_path / "startup.sh"
    path.write_text(script)
    subprocess.run(["sh", "-n", str(path)], check=True)
    assert script.startswith("#!/bin/sh\n")
    assert "exec /usr/bin/python3 -m computer_server --host 0.0.0.0 --port 8123" in script
    assert "unset CONTAINER_NAME" in script
    assert not re.search(r"CONTAINER_NAME=\S", script)
    assert ("ale-ttl" in script) is (guest_ttl is not None)


def test_import_profile_does_not_import_cloud_sdks() -> None:
    code = (
        "import sys, ale_iac.profile, ale_iac.cloud_routes, ale_iac.infra, ale_iac.infra.shapes, "
        "ale_iac.infra.cloud_common, ale_iac.infra.policy; "
        "print(sorted(m for m in sys.modules if m.startswith(('pulumi_gcp', 'pulumi_aws', 'pulumi_alicloud'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"
