"""`ale-iac plan` says what each route's units reach: everything (allow_outbound: true) or their egress policy."""

from __future__ import annotations

from pathlib import Path

from ale_iac.infra.plan import render
from ale_iac.profile import load_profile_file


def test_a_plan_names_every_route_that_reaches_a_network(tmp_path: Path) -> None:
    path = tmp_path / "Pulumi.eg.yaml"
    path.write_text(
        "config:\n  ale-iac:profile:\n    name: eg\n    snapshots:\n"
        "      open: {provider: docker, allow_outbound: true}\n"
        "      closed: {provider: local}\n"
        "      some: {provider: local, egress: {allow: [pypi.org, '*.pythonhosted.org'], deny: [10.0.0.0/8]}}\n"
    )
    text = render(load_profile_file(path)).text
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert header[-3:] == [
        "# egress (every other route: none):",
        "#   open (docker): everything (allow_outbound: true; no per-destination filter)",
        "#   some (local): proxy: allow pypi.org, *.pythonhosted.org; deny 10.0.0.0/8; ports 80, 443",
    ]


def test_a_plan_of_routes_without_network_says_nothing_of_egress(tmp_path: Path) -> None:
    path = tmp_path / "Pulumi.eg.yaml"
    path.write_text("config:\n  ale-iac:profile:\n    name: eg\n    snapshots:\n      closed: {provider: local}\n")
    assert "# egress" not in render(load_profile_file(path)).text
