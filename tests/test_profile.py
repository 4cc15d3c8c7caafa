"""Profiles: strict parsing with errors that name the file and field, routing, shapes."""

from __future__ import annotations

from pathlib import Path

import pytest

from ale_iac.contract import Shape
from ale_iac.errors import ConfigError
from ale_iac.profile import load_profile_file, resolve_profile


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "Pulumi.t.yaml"
    path.write_text(body)
    return path


def test_shipped_local_profile_routes_its_default_snapshot() -> None:
    loaded = resolve_profile("local")
    snapshot, route = loaded.profile.route(None)
    assert snapshot == "cpu-free-ubuntu"
    assert route.provider == "local"
    assert loaded.pool is not None and loaded.pool.units == 2


def test_unknown_key_names_the_key_and_the_file(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "config:\n  ale-iac:profile:\n    name: t\n    snapshots:\n"
        "      s:\n        provider: local\n        imag: x\n",
    )
    with pytest.raises(ConfigError) as info:
        load_profile_file(path)
    assert str(info.value) == f"{path}: ale-iac:profile.snapshots.s.imag: unknown key (did you mean 'image'?)"


def test_every_problem_of_the_profile_and_its_pool_is_reported_at_once(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "config:\n  ale-iac:profile:\n    name: t\n    snapshots:\n"
        "      s:\n        provider: local\n        screen_widht: 800\n        shape: {vcpu: 2}\n"
        "  ale-iac:pool:\n    units: 2\n    snapshott: s\n",
    )
    with pytest.raises(ConfigError) as info:
        load_profile_file(path)
    assert str(info.value).splitlines() == [
        f"{path}: ale-iac:profile.snapshots.s.shape.vcpu: unknown key (did you mean 'vcpus'?)",
        f"{path}: ale-iac:profile.snapshots.s.screen_widht: unknown key (did you mean 'screen_width'?)",
        f"{path}: ale-iac:pool.snapshott: unknown key (did you mean 'snapshot'?)",
    ]
    first = info.value.problems[0]
    assert (first.source, first.field) == (str(path), "ale-iac:profile.snapshots.s.shape.vcpu")
    assert (info.value.source, info.value.field) == (first.source, first.field)


def test_a_pool_of_snapshots_the_profile_lacks_names_each(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "config:\n  ale-iac:profile:\n    name: t\n    snapshots:\n      s: {provider: local}\n"
        "  ale-iac:pool:\n    units: {a: 1, b: 1}\n",
    )
    with pytest.raises(ConfigError) as info:
        load_profile_file(path)
    assert [p.message for p in info.value.problems] == [
        "no route for snapshot 'a' (routes: s)",
        "no route for snapshot 'b' (routes: s)",
    ]


def test_an_unknown_config_key_gets_the_closest_known_one(tmp_path: Path) -> None:
    path = _write(tmp_path, "config:\n  ale-iac:profil: {}\n  ale-iac:zzz: 1\n")
    with pytest.raises(ConfigError) as info:
        load_profile_file(path)
    assert str(info.value).splitlines() == [
        f"{path}: config.ale-iac:profil: unknown key (did you mean 'ale-iac:profile'?)",
        f"{path}: config.ale-iac:zzz: unknown key (known: ale-iac:profile, ale-iac:pool)",
    ]


def test_no_such_profile_names_the_file_that_named_it(tmp_path: Path) -> None:
    experiment = tmp_path / "exp.yaml"
    with pytest.raises(ConfigError) as info:
        resolve_profile("loacl", named_in=experiment)
    assert str(info.value).startswith(f"{experiment}: profile: no such profile 'loacl' (did you mean 'local'?)")


@pytest.mark.parametrize(
    ("body", "field", "fragment"),
    [
        ("config: {}\n", "config.ale-iac:profile", "required key is missing"),
        ("config:\n  ale-iac:profil: {}\n", "config.ale-iac:profil", "unknown key"),
        ("config:\n  ale-iac:profile:\n    name: t\n    snapshots: {}\n", "snapshots", "at least 1"),
        (
            "config:\n  ale-iac:profile:\n    name: t\n    snapshots:\n      s: {provider: warp}\n",
            "snapshots.s",
            "does not match any of the expected tags",
        ),
        (
            "config:\n  ale-iac:profile:\n    name: t\n    default_snapshot: nope\n"
            "    snapshots:\n      s: {provider: local}\n",
            "ale-iac:profile",
            "default_snapshot 'nope' is not one of the snapshots",
        ),
        (
            "config:\n  ale-iac:profile:\n    name: t\n    snapshots:\n      s: {provider: local}\n"
            "  ale-iac:pool:\n    units: 0\n",
            "ale-iac:pool.units",
            "greater than or equal to 1",
        ),
        ("config: [1\n", "", "not valid YAML"),
    ],
)
def test_malformed_profiles_give_one_clear_error(tmp_path: Path, body: str, field: str, fragment: str) -> None:
    path = _write(tmp_path, body)
    with pytest.raises(ConfigError) as info:
        load_profile_file(path)
    message = str(info.value)
    assert message.startswith(str(path)) and field in message and fragment in message
    assert "\n" not in message


def test_unknown_snapshot_lists_the_routes() -> None:
    profile = resolve_profile("local").profile
    with pytest.raises(ConfigError, match=r"no route for snapshot 'gpu-free' \(routes: cpu-free-ubuntu\)"):
        profile.route("gpu-free")


def test_task_shape_overrides_route_defaults() -> None:
    base = Shape(vcpus=1, memory_gb=2)
    assert Shape(memory_gb=4, gpu="l4").over(base) == Shape(vcpus=1, memory_gb=4, gpu="l4")


def test_static_endpoints_must_be_base_urls(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "config:\n  ale-iac:profile:\n    name: t\n    snapshots:\n"
        "      s: {provider: static, endpoints: ['127.0.0.1:8000']}\n",
    )
    with pytest.raises(ConfigError, match="is not a base URL"):
        load_profile_file(path)


def test_reset_defaults_per_provider_kind(tmp_path: Path) -> None:
    """restore for the host substrates, recreate for the clouds, none for static endpoints."""
    cloud = "allowed_source_ranges: ['198.51.100.0/24'], image: img"
    path = _write(
        tmp_path,
        "config:\n  ale-iac:profile:\n    name: t\n    snapshots:\n"
        "      l: {provider: local}\n      d: {provider: docker}\n      q: {provider: qemu}\n"
        "      s: {provider: static, endpoints: ['http://127.0.0.1:8000']}\n"
        f"      g: {{provider: gcloud, project: p, zone: us-central1-a, {cloud}}}\n"
        f"      a: {{provider: aws, region: us-east-1, {cloud}}}\n"
        f"      y: {{provider: aliyun, region: cn-hangzhou, vpc_id: v, vswitch_id: w, {cloud}}}\n",
    )
    snapshots = load_profile_file(path).profile.snapshots
    resets = {name: getattr(route, "reset", None) for name, route in snapshots.items()}
    assert resets == {"l": "restore", "d": "restore", "q": "restore", "s": "none"} | dict.fromkeys("gay", "recreate")


@pytest.mark.parametrize(
    ("route", "fragment"),
    [
        ("{provider: local, reset: reboot}", "'restore', 'recreate' or 'none'"),
        ("{provider: docker, reset: true}", "'restore', 'recreate' or 'none'"),
        ("{provider: static, endpoints: ['http://127.0.0.1:8000'], reset: recreate}", "'none'"),
        (
            "{provider: gcloud, project: p, zone: us-central1-a, image: i, allowed_source_ranges: ['10.0.0.0/8'], "
            "reset: restore}",
            "'recreate' or 'none'",
        ),
    ],
)
def test_a_bad_reset_names_the_field_and_the_file(tmp_path: Path, route: str, fragment: str) -> None:
    path = _write(tmp_path, f"config:\n  ale-iac:profile:\n    name: t\n    snapshots:\n      s: {route}\n")
    with pytest.raises(ConfigError) as info:
        load_profile_file(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ale-iac:profile.snapshots.s.") and ".reset" in message, message
    assert fragment in message and "\n" not in message


@pytest.mark.parametrize(
    ("route", "fragment"),
    [
        ("{provider: local, allow_outbound: true, checkpoint: true}", "cannot go with allow_outbound: true"),
        ("{provider: local, reset: none, checkpoint: true}", "it needs reset: restore, not 'none'"),
    ],
)
def test_a_checkpoint_the_route_cannot_have_names_the_field_and_the_file(
    tmp_path: Path, route: str, fragment: str
) -> None:
    path = _write(tmp_path, f"config:\n  ale-iac:profile:\n    name: t\n    snapshots:\n      s: {route}\n")
    with pytest.raises(ConfigError) as info:
        load_profile_file(path)
    assert (info.value.source, info.value.field) == (str(path), "ale-iac:profile.snapshots.s.checkpoint")
    assert fragment in info.value.detail
    fine = _write(
        tmp_path,
        "config:\n  ale-iac:profile:\n    name: t\n    snapshots:\n      s: {provider: local, checkpoint: true}\n",
    )
    assert getattr(load_profile_file(fine).profile.snapshots["s"], "checkpoint", None) is True


def test_a_static_routes_token_comes_from_the_environment_variable_it_names(monkeypatch: pytest.MonkeyPatch) -> None:
    from ale_iac.errors import AleIacError
    from ale_iac.profile import StaticRoute

    route = StaticRoute(provider="static", endpoints=["http://127.0.0.1:9"], endpoint_token_env="ALE_TEST_TOKEN")
    monkeypatch.delenv("ALE_TEST_TOKEN", raising=False)
    with pytest.raises(AleIacError, match="endpoint_token_env: the environment variable ALE_TEST_TOKEN is not set"):
        route.endpoint_token()
    monkeypatch.setenv("ALE_TEST_TOKEN", "t0ken")
    assert route.endpoint_token() == "t0ken"
    assert StaticRoute(provider="static", endpoints=["http://127.0.0.1:9"]).endpoint_token() is None


@pytest.mark.parametrize(
    ("route", "field", "fragment"),
    [
        (
            "{provider: static, endpoints: ['http://127.0.0.1:9'], forwarder: true}",
            "forwarder",
            "forwarder: true needs endpoint_token_env",
        ),
        (
            "{provider: static, endpoints: ['http://127.0.0.1:9'], endpoint_token_env: T, egress: {allow: [pypi.org]}}",
            "egress",
            "an egress policy needs forwarder: true",
        ),
        (
            "{provider: static, endpoints: ['http://127.0.0.1:9'], endpoint_token_env: T, forwarder: yes please}",
            "forwarder",
            "valid boolean",
        ),
    ],
)
def test_a_static_route_s_forwarder_and_egress_are_validated_at_their_field(
    tmp_path: Path, route: str, field: str, fragment: str
) -> None:
    path = _write(tmp_path, f"config:\n  ale-iac:profile:\n    name: t\n    snapshots:\n      s: {route}\n")
    with pytest.raises(ConfigError) as info:
        load_profile_file(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ale-iac:profile.snapshots.s.{field}: "), message
    assert fragment in message and "\n" not in message


def test_a_static_route_of_forwarders_may_carry_an_egress_policy(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "config:\n  ale-iac:profile:\n    name: t\n    snapshots:\n      s: {provider: static, endpoints: "
        "['http://127.0.0.1:9'], endpoint_token_env: T, forwarder: true, egress: {allow: [pypi.org], ports: [443]}}\n",
    )
    route = load_profile_file(path).profile.snapshots["s"]
    assert getattr(route, "forwarder", None) is True
    assert getattr(route, "egress", None) is not None and route.egress.allow == ["pypi.org"]  # type: ignore[union-attr]
