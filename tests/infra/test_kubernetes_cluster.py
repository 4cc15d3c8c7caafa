"""The ``kubernetes`` provider kind for real: the real Pulumi engine (file backend), the real provider plugin
built from the Go module proxy, a real single-node cluster on this host (tests/support/kube.py). A unit comes up
as a walled pod, answers through the API server's port-forward only (behind its token), and goes away with its
stack, leaving nothing of its own on the cluster."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from ale_iac.contract import Shape, UnitSpec
from ale_iac.engine import Engine
from ale_iac.provision import destroy_stack, new_stack_name, up_unit
from ale_iac.sandbox.readiness import wait_ready
from tests.support.kube import KubeCluster, kube_profile, objects_of

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.kubernetes,
    pytest.mark.engine,
    pytest.mark.xdist_group("kubernetes"),
    pytest.mark.timeout(3900),  # a cold cache builds the cluster first (~23 min on 2 cores)
]


def test_a_unit_is_a_walled_pod_reached_only_through_its_port_forward(
    kube_cluster: KubeCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    machine_tmp = tmp_path / "tmp"  # the temp dir of every process this test starts
    machine_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(machine_tmp))
    engine = Engine()
    stack = new_stack_name("run", "kube")
    started = time.monotonic()
    handle = up_unit(engine, kube_profile(kube_cluster), stack, UnitSpec(name="u0"))
    try:
        up_s = time.monotonic() - started
        report = asyncio.run(wait_ready(handle, 180))
        ready_s = time.monotonic() - started
        assert handle.endpoint.startswith("http://127.0.0.1:") and handle.port_forward is not None
        namespace, pod = handle.resource_id.split("/")
        spec = json.loads(kube_cluster.kubectl("get", "pod", pod, "-n", namespace, "-o", "json").stdout)["spec"]
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["seccompProfile"]["type"] == "Localhost"
        [container] = spec["containers"]
        assert container["securityContext"]["privileged"] is False and "ports" not in container
        assert container["resources"]["limits"]["cpu"] == "1"
        assert container["resources"]["limits"]["memory"] in {"2Gi", "2048Mi"}
        # The token is in the Secret's data only: in no annotation, and nowhere in the pod.
        token = handle.token()
        assert token and len(token) >= 32
        secrets = kube_cluster.kubectl("get", "secrets", "-n", namespace, "-o", "json").stdout
        assert all(token not in json.dumps(s["metadata"]) for s in json.loads(secrets)["items"]), (
            "the token is in a secret's metadata"
        )
        assert token not in kube_cluster.kubectl("get", "pod", pod, "-n", namespace, "-o", "json").stdout
        # Without the unit's token the forward leads nowhere: the forwarder refuses.
        assert httpx.get(f"{handle.endpoint}/status", timeout=10).status_code == 401

        async def inside() -> tuple[str, str]:
            async with handle.client() as client:
                tokens = await client.run_command("ls /var/run/secrets/kubernetes.io 2>&1; echo $?")
                # the pod's routes: its bridge's /24 only, no default route (the pod reaches nothing beyond it)
                routes = await client.run_command("awk '$2 == \"00000000\"' /proc/net/route | wc -l; id -u")
                return tokens.stdout, routes.stdout

        tokens, routes = asyncio.run(inside())
        assert tokens.strip().endswith("2"), tokens  # no service-account token mounted
        assert routes.split() == ["0", "0"], routes  # no default route; root in the pod (no user namespace)
        # The recorded walls: seccomp and the network policy, as the cluster can (not) enforce it.
        assert handle.labels["ale-seccomp"] == "localhost" and handle.labels["ale-network-policy"] == "not-enforced"
        assert sorted(o.split("/")[0] for o in objects_of(kube_cluster, stack)) == [
            "ConfigMap",
            "NetworkPolicy",
            "Pod",
            "Secret",
        ]
    finally:
        torn = time.monotonic()
        destroy_stack(engine, stack)
        teardown_s = time.monotonic() - torn
    assert objects_of(kube_cluster, stack) == []
    # The provider plugin copies the kubeconfig into a temp file on every call and never removes it: those went
    # with each operation's folder.
    assert list(machine_tmp.iterdir()) == []
    print(
        f"\n[measure] kubernetes unit: pulumi up {up_s:.1f} s, ready (first answer) {ready_s:.1f} s after create "
        f"(readiness poll {report.seconds:.1f} s), teardown {teardown_s:.1f} s",
        file=sys.stderr,
    )


def test_the_demo_experiment_on_the_kubernetes_profile_scores_one(kube_cluster: KubeCluster, tmp_path: Path) -> None:
    """``ale-iac evaluate examples/demo.yaml --profile kubernetes``: the scripted agent on every demo task, each
    unit a pod reached through its port-forward, graded, destroyed."""
    from ale_iac.runner.evaluation import run_experiment
    from ale_iac.runner.experiment import load_experiment

    assert str(kube_cluster.kubeconfig) == "/run/ale-iac-kube/admin.kubeconfig"  # what the shipped profile names
    experiment = load_experiment(
        REPO / "examples" / "demo.yaml", {"profile": "kubernetes", "output_root": str(tmp_path), "concurrency": 2}
    )
    forwards_before = port_forwards_of_this_process()
    summary = run_experiment(experiment)
    # Each unit's port-forward closed with the unit (kubectl's outlives the pod it leads to).
    assert port_forwards_of_this_process() <= forwards_before
    assert {o.task for o in summary.outcomes} >= {"cli-log-stats", "gui-notepad", "mixed-clipboard-total"}
    assert all(o.status == "succeeded" and o.score == 1.0 for o in summary.outcomes), summary.outcomes
    for outcome in summary.outcomes:
        record = json.loads((summary.run_dir / outcome.unit_id / "run.json").read_text())
        assert record["cleanup"] == {"mode": "destroy", "outcome": "destroyed"}
    assert Engine().list_stacks() == []
    assert "kubernetes" in (summary.run_dir / "experiment.json").read_text()
    assert objects_of_all(kube_cluster) == []


def port_forwards_of_this_process() -> set[int]:
    """The pids of the ``kubectl port-forward`` processes this process started that still run."""
    return {
        child.pid
        for child in psutil.Process().children(recursive=True)
        if child.status() != psutil.STATUS_ZOMBIE and "port-forward" in child.cmdline()
    }


def objects_of_all(cluster: KubeCluster) -> list[str]:
    """Every object of ale-iac on the cluster but pods still terminating (deleted, within their grace period)."""
    listing = json.loads(
        cluster.kubectl(
            "get", "pods,secrets,configmaps,networkpolicies", "-A", "-o", "json", "-l", "managed-by=ale-iac"
        ).stdout
    )
    return [
        f"{i['kind']}/{i['metadata']['name']}" for i in listing["items"] if not i["metadata"].get("deletionTimestamp")
    ]


def test_twenty_units_at_once_on_the_single_node(kube_cluster: KubeCluster) -> None:
    """One stack of 20 units (no CPU requests: the node has 2 cores), every one ready through its own
    port-forward at once, then destroyed, leaving nothing."""
    from ale_iac.contract import parse_units
    from ale_iac.infra.program import inline_program, pool_units
    from ale_iac.profile import PoolSpec
    from ale_iac.sandbox.handle import SandboxHandle

    stack = "pool-twenty"
    profile = kube_profile(kube_cluster, Shape(memory_gb=0.5))
    engine = Engine()
    resolved: list[dict[str, object]] = []
    handles: list[SandboxHandle] = []
    started = time.monotonic()
    engine.up(stack, inline_program(profile, pool_units(PoolSpec(units=20), stack), stack, on_units=resolved.append))
    try:
        units = parse_units(resolved[-1])
        assert len(units) == 20

        async def ready(name: str) -> str:
            handle = await asyncio.to_thread(SandboxHandle.from_outputs, stack, units[name])
            handles.append(handle)
            await wait_ready(handle, 600)
            return handle.endpoint

        async def every() -> list[str]:
            return list(await asyncio.gather(*(ready(name) for name in units)))

        endpoints = asyncio.run(every())
        all_ready_s = time.monotonic() - started
        assert len(set(endpoints)) == 20  # a forward of its own each
    finally:
        for handle in handles:
            handle.close_port_forward()
        engine.destroy(stack)
    assert objects_of(kube_cluster, stack) == []
    print(f"\n[measure] 20 kubernetes units: all ready {all_ready_s:.1f} s after the up began", file=sys.stderr)
