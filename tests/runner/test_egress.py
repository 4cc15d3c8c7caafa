"""A unit's policy: its route's, narrowed by its task card's (a pool lease's from its unit's outputs); refused
when the card would widen it or has nothing to narrow; and what the unit's commands see with one.
(The runs themselves: tests/runner/test_egress_runs.py.)"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from ale_iac.egress_policy import EgressPolicy
from ale_iac.errors import AleIacError, ConfigError
from ale_iac.profile import parse_profile
from ale_iac.runner.egress import leased_policy, open_egress, policy_for
from ale_iac.runner.evaluation import run_experiment
from ale_iac.runner.experiment import load_experiment
from ale_iac.runner.tasks import TaskCard
from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.substrates.egress import IN_UNIT_PROXY
from tests.support.tasks import make_preset, make_task

PROFILE = parse_profile(
    {
        "name": "t",
        "default_snapshot": "some",
        "snapshots": {
            "some": {"provider": "docker", "egress": {"allow": ["pypi.org", "*.pythonhosted.org"]}},
            "closed": {"provider": "docker"},
        },
    },
    "Pulumi.t.yaml",
).profile


def _card(snapshot: str | None = None, egress: dict[str, object] | None = None) -> TaskCard:
    return TaskCard.model_validate({"id": "t", "instruction": "x", "snapshot": snapshot, "egress": egress})


def test_a_unit_gets_its_routes_policy_narrowed_by_its_card() -> None:
    assert policy_for(PROFILE, _card()) == EgressPolicy(allow=["pypi.org", "*.pythonhosted.org"])
    assert policy_for(PROFILE, _card("closed")) is None
    narrowed = policy_for(PROFILE, _card(egress={"allow": ["files.pythonhosted.org"], "ports": [443]}))
    assert narrowed == EgressPolicy(allow=["files.pythonhosted.org"], ports=[443])


def test_a_pool_unit_gets_the_policy_its_outputs_carry_narrowed_by_its_card() -> None:
    route = EgressPolicy(allow=["pypi.org", "*.pythonhosted.org"])
    unit = SandboxHandle.for_endpoint("http://127.0.0.1:1").with_egress(route.model_dump(mode="json"))
    assert leased_policy(unit, _card()) == route
    narrowed = leased_policy(unit, _card(egress={"allow": ["files.pythonhosted.org"], "ports": [443]}))
    assert narrowed == EgressPolicy(allow=["files.pythonhosted.org"], ports=[443])
    with pytest.raises(ValueError, match=r"not covered by the route: example\.com"):
        leased_policy(unit, _card(egress={"allow": ["example.com"]}))
    closed = SandboxHandle.for_endpoint("http://127.0.0.1:1")
    assert leased_policy(closed, _card()) is None
    with pytest.raises(ValueError, match="pool unit endpoint has none"):
        leased_policy(closed, _card(egress={"allow": ["pypi.org"]}))


def test_the_units_commands_see_the_proxy_variables_only_with_a_policy() -> None:
    closed = SandboxHandle.for_endpoint("http://127.0.0.1:1")
    assert closed.command_env() == {}
    opened = closed.with_egress(EgressPolicy(allow=["pypi.org"]).model_dump(mode="json"))
    assert opened.command_env() == {
        **dict.fromkeys(["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"], IN_UNIT_PROXY),
        **dict.fromkeys(["NO_PROXY", "no_proxy"], "127.0.0.1,localhost"),
    }
    assert opened.client().command_env == opened.command_env()
    windows = SandboxHandle.for_endpoint("http://127.0.0.1:1", os="windows")
    assert windows.with_egress({"allow": ["pypi.org"]}).command_env() == {}  # no POSIX shell to export in


def test_a_card_that_widens_or_has_nothing_to_narrow_is_refused() -> None:
    with pytest.raises(ValueError, match=r"not covered by the route: example\.com"):
        policy_for(PROFILE, _card(egress={"allow": ["example.com"]}))
    with pytest.raises(ValueError, match="its route has none"):
        policy_for(PROFILE, _card("closed", egress={"allow": ["pypi.org"]}))


def test_a_remote_route_s_policy_is_carried_as_a_host_route_s() -> None:
    """A cloud route of ale-iac's disk and a static route of forwarders: their units' endpoints serve the egress
    channel, so their policies are the units' (no longer refused when the experiment loads)."""
    route = {
        "provider": "gcloud",
        "project": "p",
        "zone": "us-central1-a",
        "image": "img",
        "guest_agent": True,
        "allowed_source_ranges": ["198.51.100.0/24"],
    }
    static = {"provider": "static", "endpoints": ["http://127.0.0.1:9"], "endpoint_token_env": "T", "forwarder": True}
    policy = {"allow": ["pypi.org"]}
    remote = parse_profile(
        {
            "name": "c",
            "snapshots": {"pypi": {**route, "egress": policy}, "closed": route, "fw": {**static, "egress": policy}},
        },
        "c.yaml",
    ).profile
    assert policy_for(remote, _card("pypi")) == EgressPolicy(allow=["pypi.org"])
    assert policy_for(remote, _card("fw")) == EgressPolicy(allow=["pypi.org"])
    assert policy_for(remote, _card("closed")) is None


def test_a_unit_whose_endpoint_is_no_forwarder_is_refused_its_egress_naming_it_and_what_it_lacks() -> None:
    handle = SandboxHandle.for_endpoint("http://127.0.0.1:9").model_copy(update={"unit": "u0", "provider": "static"})
    with pytest.raises(AleIacError) as refused:
        asyncio.run(open_egress(handle, EgressPolicy(allow=["pypi.org"])))
    message = str(refused.value)
    assert message.startswith("unit u0 runs on static, whose endpoint is no ale-iac forwarder"), message
    assert "static route's with forwarder: true" in message and message.endswith("unit u0 has an egress policy")


def test_a_card_that_widens_its_routes_policy_fails_the_run_before_any_unit(tmp_path: Path) -> None:
    make_task(tmp_path, "wide")
    card = tmp_path / "wide" / "task.yaml"
    card.write_text(card.read_text() + "egress: {allow: [example.com]}\n")
    make_preset(tmp_path, "writer", "WriterAgent")
    profile = tmp_path / "Pulumi.eg.yaml"
    profile.write_text(
        "config:\n  ale-iac:profile:\n    name: eg\n    snapshots:\n"
        "      s: {provider: local, egress: {allow: [pypi.org]}}\n"
    )
    spec = {"name": "t", "agents": ["writer.yaml"], "tasks": ["wide"], "profile": str(profile)}
    (tmp_path / "exp.yaml").write_text(json.dumps(spec))
    with pytest.raises(ConfigError) as info:
        run_experiment(load_experiment(tmp_path / "exp.yaml", {}))
    assert (info.value.source, info.value.field) == (str(card), "egress")
    assert "not covered by the route: example.com" in info.value.detail
