"""`ale-iac plan` refusing a profile, through the real command line: every rule the route checks refuse is named."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.support.cli import ale_iac
from tests.support.cloud import gcloud_route


def test_every_refused_rule_of_a_profile_is_named_on_a_line_of_its_own(tmp_path: Path) -> None:
    route = gcloud_route(allowed_source_ranges=["0.0.0.0/0"], ssh_source_ranges=["::/0"], zone="europe")
    path = tmp_path / "Pulumi.open.yaml"
    path.write_text(yaml.safe_dump({"config": {"ale-iac:profile": {"name": "open", "snapshots": {"gpu": route}}}}))
    result = ale_iac("plan", "--profile", str(path), timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    field = f"error: {path}: ale-iac:profile.snapshots.gpu"
    assert sorted(result.stderr.splitlines()) == [
        f"{field}.allowed_source_ranges: '0.0.0.0/0' opens the port to the whole internet; name the runner's ranges",
        f"{field}.ssh_source_ranges: '::/0' opens the port to the whole internet; name the runner's ranges",
        f"{field}.zone: 'europe' is not a GCE zone like us-central1-a",
    ]
    assert "more problem" not in result.stderr and result.stdout == ""
