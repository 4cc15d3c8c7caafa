"""``ale-iac plan``: rendered under Pulumi mocks (no cloud, no plugin), stable, and committed current.

Each render installs its own recording mocks (``ale_iac.infra.mocks.run_program``), so these tests
need no fixture for them; they never share mocks with another test.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

import ale_iac.infra.policy
from ale_iac.cli import plan as plan_cli
from ale_iac.errors import ConfigError
from ale_iac.infra.plan import (
    SHIPPED_PLAN_STACKS,
    render,
    render_profile,
    shipped_plan_path,
    stack_units,
)
from ale_iac.profile import load_profile_file, resolve_profile


def cli() -> typer.Typer:
    app = typer.Typer()
    plan_cli.register(app)

    @app.callback()
    def root() -> None:
        """ale-iac (test harness with only the plan command)."""

    return app


@pytest.mark.parametrize("stack", SHIPPED_PLAN_STACKS)
def test_committed_plan_is_current_under_mocks(stack: str) -> None:
    committed = shipped_plan_path(stack)
    rendered = render_profile(stack).text
    current = committed.read_text() if committed.exists() else ""
    if rendered != current:
        diff = "".join(
            list(difflib.unified_diff(current.splitlines(True), rendered.splitlines(True), "committed", "rendered"))[
                :40
            ]
        )
        pytest.fail(
            f"plan for {stack} changed; run `ale-iac plan --profile {stack} --out stacks/plans/{stack}.txt`\n{diff}",
            pytrace=False,
        )


def test_plan_shows_the_reviewer_facts_of_each_cloud_under_mocks() -> None:
    gcloud = render_profile("gcloud").text
    assert "maxRunDuration:\n        seconds: 21600" in gcloud
    assert "instanceTerminationAction: DELETE" in gcloud
    assert "sourceRanges:\n    - 198.51.100.0/24" in gcloud
    assert "ale-expiry: <deploy+6h>" in gcloud and "expires_at: <deploy+4h>" in gcloud
    assert "# policy pack: no violations" in gcloud
    aws = render_profile("aws").text
    assert "instanceInitiatedShutdownBehavior: terminate" in aws
    assert "cidrIpv4: 10.20.0.0/16" in aws and "associatePublicIpAddress: false" in aws
    assert "endpoint: http://<privateIp>:8000" in aws and "endpoint: http://<publicIp>:8000" in aws
    aliyun = render_profile("aliyun").text
    assert "autoReleaseTime: <deploy+6h>" in aliyun
    assert "portRange: 8000/8000" in aliyun
    for text in (gcloud, aws, aliyun):
        assert not re.search(r"20\d\d-\d\d-\d\dT|20\d{6}t\d{4}z", text), "a real time leaked into a plan"
        assert "# policy pack: no violations" in text


def test_plan_does_not_depend_on_who_renders_it_under_mocks(monkeypatch: pytest.MonkeyPatch) -> None:
    before = render_profile("aliyun").text + render_profile("aws").text
    monkeypatch.setenv("ALICLOUD_PROFILE", "someones-profile")
    monkeypatch.setenv("ALICLOUD_ECS_ROLE_NAME", "someones-role")
    monkeypatch.setenv("AWS_REGION", "ap-south-1")
    after = render_profile("aliyun").text + render_profile("aws").text
    assert after == before
    assert "someones" not in after
    import os

    assert os.environ["ALICLOUD_PROFILE"] == "someones-profile"  # restored after rendering


def test_plan_units_option_sizes_a_pool_like_the_pulumi_program_under_mocks() -> None:
    loaded = resolve_profile("pool-gcloud")
    assert [u.name for u in stack_units(loaded)] == ["u0", "u1", "u2"]
    plan = render(loaded, units=5)
    assert (plan.unit_count, plan.resource_count) == (5, 25)
    assert "# units: 5, resources: 25" in plan.text
    assert [u.name for u in stack_units(resolve_profile("gcloud"), 2)] == [
        "ale-desktop-000",
        "ale-desktop-001",
        "ale-desktop-pypi-000",
        "ale-desktop-pypi-001",
        "cpu-free-ubuntu-000",
        "cpu-free-ubuntu-001",
        "gpu-free-000",
        "gpu-free-001",
    ]


def test_plan_cli_writes_the_file_and_prints_a_summary_under_mocks(tmp_path: Path) -> None:
    out = tmp_path / "plans" / "aliyun.txt"
    result = CliRunner().invoke(cli(), ["plan", "--profile", "aliyun", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text() == shipped_plan_path("aliyun").read_text()
    assert f"wrote {out}: 2 unit(s), 17 resource(s), 0 policy violation(s)" in result.output
    stdout = CliRunner().invoke(cli(), ["plan", "-p", "aliyun"])
    assert stdout.exit_code == 0 and stdout.output == out.read_text()


def test_plan_cli_fails_when_the_policy_pack_finds_a_violation_under_mocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ale_iac.infra.policy, "GUEST_TTL_MARKER", "a timer ale-iac does not write")
    out = tmp_path / "aws.txt"
    result = CliRunner().invoke(cli(), ["plan", "--profile", "aws", "--out", str(out)])
    assert result.exit_code == 1
    assert "2 policy violation(s)" in result.output
    assert "#   cpu-free-000-vm: ale-vm-ttl: user data has no ale-iac guest shutdown timer" in out.read_text()


def test_plan_refuses_a_stack_file_with_clear_credentials(tmp_path: Path) -> None:
    doc = yaml.safe_load((shipped_plan_path("aws").parent.parent / "Pulumi.aws.yaml").read_text())
    doc["config"]["aws:secretKey"] = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    path = tmp_path / "Pulumi.leaky.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as caught:
        render(load_profile_file(path))
    assert str(caught.value) == (
        f"{path}: config.aws:secretKey: a credential in clear text; remove it (providers read credentials "
        "from the environment) or set it with `pulumi config set --secret`"
    )


def test_plan_of_a_profile_without_allowed_ranges_is_one_clear_error(tmp_path: Path) -> None:
    doc = yaml.safe_load((shipped_plan_path("gcloud").parent.parent / "Pulumi.gcloud.yaml").read_text())
    del doc["config"]["ale-iac:profile"]["snapshots"]["gpu-free"]["allowed_source_ranges"]
    path = tmp_path / "Pulumi.open.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(cli(), ["plan", "--profile", str(path)])
    assert isinstance(result.exception, ConfigError)
    assert str(result.exception) == (
        f"{path}: ale-iac:profile.snapshots.gpu-free.allowed_source_ranges: required: list the runner's CIDR "
        "ranges (there is no default and no 0.0.0.0/0, because the computer-server has no authentication)"
    )
