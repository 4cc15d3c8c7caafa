"""The ``kubernetes`` provider kind under Pulumi mocks: the route model's errors, and what a unit declares (the
pod's walls, its secret, its deny-egress policy, its labels and expiry, the handle's port-forward and secret
token). The same program against a real cluster: tests/infra/test_kubernetes_cluster.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulumi
import pytest

from ale_iac.cloud_routes import KubernetesRoute
from ale_iac.contract import Shape, UnitOutputs, UnitSpec
from ale_iac.errors import ConfigError
from ale_iac.infra import DeclareContext, kubernetes
from ale_iac.infra.kubernetes import declare_unit, provider_for
from ale_iac.infra.mocks import RecordingMocks, install
from ale_iac.profile import parse_profile, resolve_profile

POD = "kubernetes:core/v1:Pod"
SECRET = "kubernetes:core/v1:Secret"
POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
SECRET_SIG = {"4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270"}


@pytest.fixture
def mocks() -> Iterator[RecordingMocks]:
    yield install(RecordingMocks())


def route(**extra: Any) -> KubernetesRoute:
    return KubernetesRoute.model_validate({"provider": "kubernetes", "kubeconfig": "/nonexistent/kubeconfig", **extra})


def test_the_shipped_kubernetes_profile_routes_to_the_private_cluster() -> None:
    loaded = resolve_profile("kubernetes")
    snapshot, shipped = loaded.profile.route(None)
    assert isinstance(shipped, KubernetesRoute) and snapshot == "cpu-free-ubuntu"
    assert shipped.kubeconfig == "/run/ale-iac-kube/admin.kubeconfig" and shipped.seccomp_localhost
    assert loaded.pool is not None and loaded.pool.units == 2


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"namespace": "Not_A_Label"}, "ale-iac:profile.snapshots.s.namespace: 'Not_A_Label' is not"),
        ({"allow_outbound": True, "egress": {"allow": ["example.com"]}}, "snapshots.s: give either allow_outbound"),
        ({"kubeconfig_file": "/x"}, "kubeconfig_file"),
    ],
)
def test_bad_route_fields_are_named_with_the_file(fields: dict[str, Any], needle: str) -> None:
    data = {"name": "k", "snapshots": {"s": {"provider": "kubernetes", "kubeconfig": "/k", **fields}}}
    with pytest.raises(ConfigError) as raised:
        parse_profile(data, "stacks/Pulumi.k.yaml")
    text = str(raised.value)
    assert "stacks/Pulumi.k.yaml" in text
    assert needle in text


def test_a_missing_kubeconfig_is_named_outside_mocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kubernetes, "_under_mocks", lambda: False)  # another test's mocks may be installed
    missing = tmp_path / "absent.kubeconfig"
    with pytest.raises(ConfigError, match=r"kubeconfig.*absent\.kubeconfig.*is no file"):
        provider_for(route(kubeconfig=str(missing)))


@pulumi.runtime.test  # type: ignore[untyped-decorator]
def test_a_unit_is_a_walled_pod_with_its_token_as_a_secret(mocks: RecordingMocks) -> pulumi.Output[Any]:
    shaped = route(runtime_class="gvisor", seccomp_localhost="ale-iac/sandbox.json", shape=Shape(vcpus=2, memory_gb=3))
    unit = UnitSpec(name="unit0", shape=Shape(memory_gb=4, disk_gb=8), labels={"run": "r1"})
    handle = declare_unit(unit, "cpu-free-ubuntu", shaped, DeclareContext("pytest", "kube", 0, 1))

    def check(value: dict[str, Any]) -> None:
        pod = mocks.one(POD).inputs
        spec = pod["spec"]
        assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
        assert spec["runtimeClassName"] == "gvisor" and spec["restartPolicy"] == "Never"
        assert spec["securityContext"]["seccompProfile"] == {
            "type": "Localhost",
            "localhostProfile": "ale-iac/sandbox.json",
        }
        [container] = spec["containers"]
        assert container["imagePullPolicy"] == "Never" and container["image"].startswith("ale-iac.local/desktop:")
        walls = container["securityContext"]
        assert walls["privileged"] is False and walls["allowPrivilegeEscalation"] is False
        assert walls["readOnlyRootFilesystem"] is True and walls["capabilities"]["drop"] == ["ALL"]
        expected = {"cpu": "2", "memory": "4096Mi", "ephemeral-storage": "8Gi"}
        assert container["resources"] == {"requests": expected, "limits": expected}
        assert "--listen 127.0.0.1:8443" in container["command"][2]  # the pod's loopback: no pod-network exposure
        labels = pod["metadata"]["labels"]
        assert labels["managed-by"] == "ale-iac" and labels["ale-run"] == "r1" and labels["ale-unit"] == "unit0"
        assert pod["metadata"]["annotations"]["ale-iac/expires-at"] and labels["ale-expiry"]
        policy = mocks.one(POLICY).inputs["spec"]
        assert policy["policyTypes"] == ["Egress", "Ingress"] and policy["egress"] == [] and policy["ingress"] == []
        assert policy["podSelector"]["matchLabels"] == {"ale-unit-id": labels["ale-unit-id"]}
        # Pulumi marks the whole property secret when a value in it is (the state and the plan hide all of it).
        data = mocks.one(SECRET).inputs["stringData"]
        assert {k: data.get(k) for k in SECRET_SIG} == SECRET_SIG, data
        token = data["value"]["token"]
        parsed = UnitOutputs.model_validate(value)
        assert parsed.provider == "kubernetes" and parsed.port_forward is not None
        assert parsed.port_forward.port == 8443 and parsed.port_forward.kubeconfig == "/nonexistent/kubeconfig"
        assert parsed.endpoint.startswith("kubernetes://default/") and parsed.gateway_channel is not None
        assert parsed.token() == token and token.startswith("mock-token-") and parsed.reset == "recreate"
        assert parsed.labels["ale-seccomp"] == "localhost" and parsed.labels["ale-network-policy"] == "not-enforced"
        assert len(parsed.reset_urns) == 1 and parsed.reset_urns[0].endswith("unit0-pod")

    return handle.apply(check)


@pulumi.runtime.test  # type: ignore[untyped-decorator]
def test_a_registry_route_pulls_and_default_seccomp_is_runtime_default(mocks: RecordingMocks) -> pulumi.Output[Any]:
    handle = declare_unit(
        UnitSpec(name="u"),
        "s",
        route(registry="registry.example:5000", allow_outbound=True, network_policy_enforced=True),
        DeclareContext("pytest", "kube", 0, 1),
    )

    def check(value: dict[str, Any]) -> None:
        [container] = mocks.one(POD).inputs["spec"]["containers"]
        assert container["image"].startswith("registry.example:5000/ale-iac/desktop:")
        assert container["imagePullPolicy"] == "IfNotPresent" and "resources" not in container
        assert mocks.one(POD).inputs["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert mocks.of_type(POLICY) == []  # allow_outbound: no deny-egress policy
        parsed = UnitOutputs.model_validate(value)
        assert parsed.labels["ale-seccomp"] == "runtimedefault" and parsed.labels["ale-network-policy"] == "none"

    return handle.apply(check)


def test_the_plan_shows_the_pod_walls_and_hides_the_token() -> None:
    from ale_iac.infra.plan import render_profile

    text = render_profile("kubernetes").text
    assert "kubernetes:core/v1:Pod" in text and "automountServiceAccountToken: false" in text
    assert "kubernetes:networking.k8s.io/v1:NetworkPolicy" in text and "stringData: '[secret]'" in text
    assert "type: Localhost" in text and "imagePullPolicy: Never" in text
