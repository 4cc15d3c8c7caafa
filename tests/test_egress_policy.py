"""Egress policies: strict entries (errors name the file and the field), matching with deny winning, narrowing."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import pytest

from ale_iac.egress_policy import EgressPolicy
from ale_iac.errors import ConfigError
from ale_iac.profile import egress_of, load_profile_file

POLICY = EgressPolicy(
    allow=["pypi.org", "*.pythonhosted.org", "198.18.5.0/24"], deny=["evil.pythonhosted.org", "198.18.9.0/24"]
)


def _at(address: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    return [ipaddress.ip_address(address)]


@pytest.mark.parametrize(
    ("host", "port", "address", "allowed", "reason"),
    [
        ("pypi.org", 443, "198.18.1.1", True, "allow pypi.org"),
        ("PyPI.org.", 80, "198.18.1.1", True, "allow pypi.org"),
        ("www.pypi.org", 443, "198.18.1.1", False, "no allow entry matches the name"),
        ("files.pythonhosted.org", 443, "198.18.1.1", True, "allow *.pythonhosted.org"),
        ("a.b.pythonhosted.org", 443, "198.18.1.1", True, "allow *.pythonhosted.org"),
        ("pythonhosted.org", 443, "198.18.1.1", False, "no allow entry matches the name"),
        ("xpythonhosted.org", 443, "198.18.1.1", False, "no allow entry matches the name"),
        ("evil.pythonhosted.org", 443, "198.18.1.1", False, "deny evil.pythonhosted.org"),
        ("pypi.org", 443, "198.18.9.7", False, "deny 198.18.9.0/24"),
        ("pypi.org", 22, "198.18.1.1", False, "port 22 is not in ports"),
        ("pypi.org", 443, "127.0.0.1", False, "127.0.0.1 is this host or a reserved address"),
        ("pypi.org", 443, "169.254.169.254", False, "169.254.169.254 is this host or a reserved address"),
        ("198.18.5.7", 80, "198.18.5.7", True, "allow 198.18.5.0/24"),
        ("198.18.6.7", 80, "198.18.6.7", False, "no allow entry matches the address"),
    ],
)
def test_a_verdict_names_the_rule_that_decided(host: str, port: int, address: str, allowed: bool, reason: str) -> None:
    verdict = POLICY.verdict(host, port, _at(address))
    assert (verdict.allowed, verdict.reason) == (allowed, reason)


def test_a_name_is_refused_when_any_address_is_denied_or_it_does_not_resolve() -> None:
    assert not POLICY.verdict("pypi.org", 443, [*_at("198.18.1.1"), *_at("198.18.9.1")]).allowed
    assert POLICY.verdict("pypi.org", 443, []).reason == "the name does not resolve"
    assert not POLICY.verdict("pypi.org", 443, _at("192.0.2.2"), frozenset({"192.0.2.2"})).allowed


def test_no_allow_entry_reaches_nothing() -> None:
    assert not EgressPolicy().verdict("pypi.org", 443, _at("198.18.1.1")).allowed


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ("1.2.3.4", "is an IP address where a domain is expected: write it as a CIDR (1.2.3.4/32)"),
        ("::1", "is an IP address where a domain is expected"),
        ("*", "would allow every name: use allow_outbound: true"),
        ("*.com", "is a wildcard over a top-level domain"),
        ("a*.test", "a wildcard is only '*.' at the start of a domain"),
        ("http://pypi.org", "is a URL"),
        ("pypi.org:443", "has a port"),
        ("198.18.0.1/24", "has host bits set"),
        ("localhost", "is neither a domain"),
        ("-bad.test", "is neither a domain"),
    ],
)
def test_a_bad_entry_names_the_file_and_the_field(tmp_path: Path, entry: str, fragment: str) -> None:
    path = tmp_path / "Pulumi.t.yaml"
    path.write_text(
        "config:\n  ale-iac:profile:\n    name: t\n    snapshots:\n      s:\n        provider: local\n"
        f"        egress:\n          allow: [pypi.org]\n          deny: ['{entry}']\n"
    )
    with pytest.raises(ConfigError) as info:
        load_profile_file(path)
    assert info.value.source == str(path)
    assert info.value.field == "ale-iac:profile.snapshots.s.egress.deny.0"
    assert fragment in info.value.detail


def test_a_route_gives_allow_outbound_or_a_policy_not_both(tmp_path: Path) -> None:
    path = tmp_path / "Pulumi.t.yaml"
    path.write_text(
        "config:\n  ale-iac:profile:\n    name: t\n    snapshots:\n      s:\n        provider: docker\n"
        "        allow_outbound: true\n        egress: {allow: [pypi.org]}\n"
    )
    with pytest.raises(ConfigError, match=r"either allow_outbound: true .* or an egress policy"):
        load_profile_file(path)


def test_plans_show_everything_nothing_or_the_policy(tmp_path: Path) -> None:
    path = tmp_path / "Pulumi.t.yaml"
    path.write_text(
        "config:\n  ale-iac:profile:\n    name: t\n    snapshots:\n"
        "      open: {provider: local, allow_outbound: true}\n"
        "      closed: {provider: local}\n"
        "      some: {provider: qemu, egress: {allow: [pypi.org, '*.pythonhosted.org'], deny: [10.0.0.0/8]}}\n"
    )
    snapshots = load_profile_file(path).profile.snapshots
    assert egress_of(snapshots["open"]).startswith("everything (allow_outbound: true")
    assert egress_of(snapshots["closed"]).startswith("none")
    assert egress_of(snapshots["some"]) == "proxy: allow pypi.org, *.pythonhosted.org; deny 10.0.0.0/8; ports 80, 443"


def test_a_task_may_narrow_a_policy_but_never_widen_it() -> None:
    narrowed = POLICY.narrowed_by(
        EgressPolicy(allow=["files.pythonhosted.org", "198.18.5.128/25"], deny=["x.test"], ports=[443])
    )
    assert narrowed.allow == ["files.pythonhosted.org", "198.18.5.128/25"]
    assert narrowed.deny == ["evil.pythonhosted.org", "198.18.9.0/24", "x.test"]
    assert narrowed.ports == [443]
    assert POLICY.narrowed_by(EgressPolicy(allow=["*.a.pythonhosted.org"])).allow == ["*.a.pythonhosted.org"]
    with pytest.raises(
        ValueError, match=re.escape("not covered by the route: www.pypi.org, 198.18.0.0/16, *.python.org, port 22")
    ):
        POLICY.narrowed_by(EgressPolicy(allow=["www.pypi.org", "198.18.0.0/16", "*.python.org"], ports=[22]))
