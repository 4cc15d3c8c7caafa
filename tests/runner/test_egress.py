"""A unit's policy: its route's, narrowed by its task card's; refused when the card would widen it or has
nothing to narrow. (The runs themselves: tests/runner/test_egress_runs.py.)"""

from __future__ import annotations

import pytest

from ale_iac.egress_policy import EgressPolicy
from ale_iac.profile import parse_profile
from ale_iac.runner.egress import policy_for
from ale_iac.runner.tasks import TaskCard

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


def test_a_card_that_widens_or_has_nothing_to_narrow_is_refused() -> None:
    with pytest.raises(ValueError, match=r"not covered by the route: example\.com"):
        policy_for(PROFILE, _card(egress={"allow": ["example.com"]}))
    with pytest.raises(ValueError, match="its route has none"):
        policy_for(PROFILE, _card("closed", egress={"allow": ["pypi.org"]}))
