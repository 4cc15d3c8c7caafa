"""Egress of cloud units, under Pulumi mocks: a route's egress policy, the walls each cloud declares, the plan.

The policy's proxy runs on the runner, reached through the unit's endpoint (docs/clouds.md, Egress), so a unit
with a policy is walled exactly like one without: deny-all egress for IPv4 and IPv6 (GCE firewalls at priority
0; an EC2 security group that declares ``egress: []``; ECS drop rules after one accept of the metadata service).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulumi
import pytest

from ale_iac.contract import UnitSpec
from ale_iac.egress_policy import EgressPolicy
from ale_iac.errors import ConfigError
from ale_iac.infra.mocks import RecordingMocks
from ale_iac.infra.plan import render, render_profile
from ale_iac.infra.policy import StackResource, egress_wall_violations
from ale_iac.profile import load_profile_file
from tests.support.cloud import RUNNER, aliyun_route, aws_route, cloud_mocks, declare_units, gcloud_route, profile

GCE_FW = "gcp:compute/firewall:Firewall"
EC2_SG = "aws:ec2/securityGroup:SecurityGroup"
EC2_EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
ECS_RULE = "alicloud:ecs/securityGroupRule:SecurityGroupRule"
POLICY = {"allow": ["pypi.org", "*.pythonhosted.org"], "deny": ["10.0.0.0/8"], "ports": [443]}


@pytest.fixture(autouse=True)
def mocks() -> Iterator[RecordingMocks]:
    with cloud_mocks("egress-test") as recording:
        yield recording


def _declare(routes: dict[str, dict[str, Any]]) -> pulumi.Output[Any]:
    units = [UnitSpec(name, name) for name in routes]
    return pulumi.Output.all(*declare_units(profile(routes), units, stack="egress-test").values())


def _stack(mocks: RecordingMocks) -> list[StackResource]:
    return [StackResource(r.type, r.name, r.parent, copy.deepcopy(r.inputs)) for r in mocks.resources]


def _egress_rules(mocks: RecordingMocks, unit: str) -> dict[str, dict[str, Any]]:
    """Every rule of ``unit`` that concerns outbound traffic, by name."""
    rules = {}
    for r in mocks.children_of(unit):
        outbound = r.inputs.get("direction") == "EGRESS" or r.inputs.get("type") == "egress"
        if outbound or r.type == EC2_EGRESS:
            rules[r.name] = r.inputs
    return rules


@pulumi.runtime.test
def test_a_policy_unit_is_walled_like_a_closed_one_on_each_cloud_under_mocks(
    mocks: RecordingMocks,
) -> pulumi.Output[Any]:
    def check(handles: list[dict[str, Any]]) -> None:
        for unit in ("gce", "gce-closed"):
            walls = _egress_rules(mocks, unit)
            assert sorted(walls) == [f"{unit}-deny-egress", f"{unit}-deny-egress-v6"]
            for wall, everything in zip(sorted(walls), ("0.0.0.0/0", "::/0"), strict=True):
                inputs = walls[wall]
                assert (inputs["direction"], inputs["priority"], inputs["destinationRanges"]) == (
                    "EGRESS",
                    0,
                    [everything],
                )
                assert inputs["denies"] == [{"protocol": "all"}] and "allows" not in inputs
        assert "runner's proxy" in mocks.one(GCE_FW, "gce-deny-egress").inputs["description"]
        for unit in ("ec2", "ec2-closed"):
            assert _egress_rules(mocks, unit) == {}  # no egress rule at all ...
            assert mocks.one(EC2_SG, f"{unit}-sg").inputs["egress"] == []  # ... and none inline
        for unit in ("ecs", "ecs-closed"):
            rules = _egress_rules(mocks, unit)
            assert sorted(rules) == [f"{unit}-deny-egress", f"{unit}-deny-egress-v6", f"{unit}-metadata"]
            accepts = [r for r in rules.values() if r["policy"] == "accept"]
            assert accepts == [rules[f"{unit}-metadata"]]  # the one way out: the metadata service, port 80
            assert (accepts[0]["cidrIp"], accepts[0]["portRange"], accepts[0]["priority"]) == (
                "100.100.100.200/32",
                "80/80",
                1,
            )
            drops = [rules[f"{unit}-deny-egress"], rules[f"{unit}-deny-egress-v6"]]
            assert [(d["ipProtocol"], d["portRange"], d["priority"]) for d in drops] == [("all", "-1/-1", 2)] * 2
            assert (drops[0]["cidrIp"], drops[1]["ipv6CidrIp"]) == ("0.0.0.0/0", "::/0")
        labels = {
            r.name: (r.inputs.get("labels") or r.inputs.get("tags")) for r in mocks.resources if r.name.endswith("-vm")
        }
        assert {name: value["ale-egress"] for name, value in labels.items()} == {
            "gce-vm": "proxy",
            "gce-closed-vm": "none",
            "ec2-vm": "proxy",
            "ec2-closed-vm": "none",
            "ecs-vm": "proxy",
            "ecs-closed-vm": "none",
        }
        assert egress_wall_violations(_stack(mocks)) == []
        # The handles carry the policy (a pool lease's comes from there: runner/egress.leased_policy); the closed
        # units' export no egress key at all, as before the field existed.
        policies = {handle["unit"]: handle.get("egress", "absent") for handle in handles}
        expected = EgressPolicy.model_validate(POLICY).model_dump(mode="json")
        assert policies == {
            unit: (expected if "closed" not in unit else "absent")
            for unit in ("gce", "gce-closed", "ec2", "ec2-closed", "ecs", "ecs-closed")
        }

    return _declare(
        {
            "gce": gcloud_route(guest_agent=True, egress=POLICY),
            "gce-closed": gcloud_route(),
            "ec2": aws_route(guest_agent=True, egress=POLICY),
            "ec2-closed": aws_route(),
            "ecs": aliyun_route(guest_agent=True, egress=POLICY),
            "ecs-closed": aliyun_route(),
        }
    ).apply(check)


@pulumi.runtime.test
def test_allow_outbound_is_everything_and_gets_no_wall_under_mocks(mocks: RecordingMocks) -> pulumi.Output[Any]:
    def check(_: Any) -> None:
        assert _egress_rules(mocks, "gce") == {}  # GCE's implied allow-all egress applies
        assert list(_egress_rules(mocks, "ec2")) == ["ec2-egress"]
        assert "egress" not in mocks.one(EC2_SG, "ec2-sg").inputs
        assert _egress_rules(mocks, "ecs") == {}
        assert egress_wall_violations(_stack(mocks)) == []  # ale-egress=all: nothing to wall

    return _declare(
        {
            "gce": gcloud_route(allow_outbound=True),
            "ec2": aws_route(allow_outbound=True),
            "ecs": aliyun_route(allow_outbound=True),
        }
    ).apply(check)


@pulumi.runtime.test
def test_the_policy_pack_refuses_a_closed_unit_whose_egress_is_open_under_mocks(
    mocks: RecordingMocks,
) -> pulumi.Output[Any]:
    def check(_: Any) -> None:
        stack = _stack(mocks)

        def without(*names: str) -> list[str]:
            return [why for _, why in egress_wall_violations([r for r in stack if r.name not in names])]

        def changed(name: str, **props: Any) -> list[tuple[str, str]]:
            return egress_wall_violations(
                [StackResource(r.type, r.name, r.parent, {**r.props, **props}) if r.name == name else r for r in stack]
            )

        assert without("gce-deny-egress-v6") == ["no EGRESS firewall denies all to ::/0 (ale-egress=proxy)"]
        assert without("ecs-deny-egress") == ["no egress rule drops all to 0.0.0.0/0 (ale-egress=none)"]
        assert without("ec2-sg") == ["no security group of its own declares its egress (ale-egress=none)"]
        # An allow before the wall (main's walls were at 1000: a project rule at 900 got out), inline egress
        # rules (AWS's default), an accept before the drop: all refused.
        old_walls = [
            StackResource(r.type, r.name, r.parent, {**r.props, "priority": 1000}) if "deny-egress" in r.name else r
            for r in stack
        ]
        opened = StackResource(
            GCE_FW,
            "gce-open",
            "gce",
            {
                "direction": "EGRESS",
                "priority": 900,
                "allows": [{"protocol": "all"}],
                "destinationRanges": ["0.0.0.0/0"],
            },
        )
        assert egress_wall_violations([*old_walls, opened]) == [
            (
                "gce-vm",
                "an EGRESS firewall allows ['0.0.0.0/0'] at priority 900, before the deny-all (1000)"
                " (ale-egress=proxy)",
            )
        ]
        assert egress_wall_violations([*stack, opened]) == []  # at priority 0 the walls come first
        assert changed("ec2-sg", egress=[{"protocol": "-1", "cidrBlocks": ["0.0.0.0/0"]}]) == [
            ("ec2-vm", "security group ec2-sg has inline egress rules (ale-egress=none)")
        ]
        assert changed("ecs-metadata", cidrIp="0.0.0.0/0") == [
            ("ecs-vm", "an egress rule accepts 0.0.0.0/0 at priority 1, before the drop (2) (ale-egress=none)")
        ]
        # A VM without the label counts as closed: what its route says by default.
        gce_vm = next(r for r in stack if r.name == "gce-vm")
        unlabelled = {**gce_vm.props, "labels": {k: v for k, v in gce_vm.props["labels"].items() if k != "ale-egress"}}
        rest = [r for r in stack if r.parent != "gce" or r.name == "gce-deny-egress"]
        assert egress_wall_violations([*rest, StackResource(gce_vm.type, "gce-vm", "gce", unlabelled)]) == [
            ("gce-vm", "no EGRESS firewall denies all to ::/0 (ale-egress=none)")
        ]

    return _declare(
        {
            "gce": gcloud_route(guest_agent=True, egress=POLICY),
            "ec2": aws_route(),
            "ecs": aliyun_route(),
        }
    ).apply(check)


def _stack_file(tmp_path: Path, route: str) -> Path:
    path = tmp_path / "Pulumi.c.yaml"
    path.write_text(
        "config:\n  ale-iac:profile:\n    name: c\n    snapshots:\n      s:\n        provider: gcloud\n"
        "        project: p\n        zone: us-central1-a\n        image: img\n"
        f"        allowed_source_ranges: [{RUNNER}]\n" + route
    )
    return path


@pytest.mark.parametrize(
    ("route", "field", "fragment"),
    [
        (
            "        guest_agent: true\n        egress: {allow: [pypi.org, 1.2.3.4]}\n",
            "ale-iac:profile.snapshots.s.egress.allow.1",
            "is an IP address where a domain is expected: write it as a CIDR (1.2.3.4/32)",
        ),
        (
            "        guest_agent: true\n        egress: {allow: [pypi.org], deny: ['*.com']}\n",
            "ale-iac:profile.snapshots.s.egress.deny.0",
            "is a wildcard over a top-level domain",
        ),
        (
            "        guest_agent: true\n        egress: {allow: [pypi.org], ports: [0]}\n",
            "ale-iac:profile.snapshots.s.egress.ports.0",
            "port 0 is not between 1 and 65535",
        ),
        (
            "        guest_agent: true\n        egress: {allow: [pypi.org], proxy: x}\n",
            "ale-iac:profile.snapshots.s.egress.proxy",
            "",
        ),
        (
            "        guest_agent: true\n        allow_outbound: true\n        egress: {allow: [pypi.org]}\n",
            "ale-iac:profile.snapshots.s.egress",
            "give either allow_outbound: true (everything) or an egress policy, not both",
        ),
        (
            "        egress: {allow: [pypi.org]}\n",
            "ale-iac:profile.snapshots.s.egress",
            "an egress policy needs guest_agent: true",
        ),
    ],
)
def test_a_cloud_route_s_bad_policy_names_the_file_and_the_field(
    tmp_path: Path, route: str, field: str, fragment: str
) -> None:
    path = _stack_file(tmp_path, route)
    with pytest.raises(ConfigError) as info:
        load_profile_file(path)
    assert info.value.source == str(path)
    assert info.value.field == field
    assert fragment in info.value.detail


def test_a_cloud_plan_shows_the_policy_the_walls_and_no_secret(tmp_path: Path) -> None:
    path = _stack_file(tmp_path, "        guest_agent: true\n        egress: {allow: [pypi.org], ports: [443]}\n")
    text = render(load_profile_file(path)).text
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert header[-2:] == ["# egress (every other route: none):", "#   s (gcloud): proxy: allow pypi.org; ports 443"]
    assert "# policy pack: no violations" in header
    assert "name: s-000-deny-egress-v6" in text and "priority: 0" in text
    assert "mock-token" not in text and "<token>" not in text  # the endpoint token is shown as [secret] only
    assert "[secret]" in text
    shipped = render_profile("gcloud").text
    assert "#   ale-desktop-pypi (gcloud): proxy: allow pypi.org, files.pythonhosted.org; ports 443" in shipped
