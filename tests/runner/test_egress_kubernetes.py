"""An egress policy on a ``kubernetes`` unit, end to end: the pod itself reaches nothing (no route off its
bridge here, its deny-all policy on a cluster that enforces it); a task's setup in it reaches an allowed host
through the unit's proxy, over the egress channel that the runner carries through the port-forward; a refused
host fails the setup naming what was refused; every attempt is in the record (as tests/runner/test_egress_runs.py
checks it on local units)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ale_iac.paths import ale_home
from ale_iac.runner.evaluation import run_experiment
from ale_iac.runner.experiment import load_experiment
from ale_iac.runner.status import UnitStatus
from tests.runner.test_egress_runs import PROXY_VARS, _task, internet
from tests.support.fake_internet import FakeInternet
from tests.support.kube import KubeCluster
from tests.support.tasks import make_preset

pytestmark = [
    pytest.mark.kubernetes,
    pytest.mark.engine,
    pytest.mark.xdist_group("kubernetes"),
    pytest.mark.timeout(3900),
]
__all__ = ["internet"]  # the fake internet's fixture, shared with the local units' egress tests


def test_a_kubernetes_unit_reaches_only_what_its_policy_allows_through_its_port_forward(
    kube_cluster: KubeCluster, tmp_path: Path, internet: FakeInternet
) -> None:
    _task(tmp_path, "fetch-ok", "http://allowed.test/", expected=PROXY_VARS)
    _task(tmp_path, "fetch-refused", "http://other.test/")
    make_preset(tmp_path, "writer", "WriterAgent")
    profile = tmp_path / "Pulumi.kube-egress.yaml"
    profile.write_text(
        "config:\n  ale-iac:profile:\n    name: kube-egress\n    default_snapshot: s\n    snapshots:\n"
        f"      s: {{provider: kubernetes, kubeconfig: {kube_cluster.kubeconfig}, shape: {{memory_gb: 1}},\n"
        f"          egress: {{allow: [allowed.test], resolver: {internet.dns}}}}}\n"
    )
    spec = {"name": "t", "agents": ["writer.yaml"], "tasks": ["fetch-ok", "fetch-refused"], "profile": str(profile)}
    (tmp_path / "exp.yaml").write_text(json.dumps(spec))
    summary = run_experiment(load_experiment(tmp_path / "exp.yaml", {}))
    by_task = {o.task: o for o in summary.outcomes}
    assert by_task["fetch-ok"].status is UnitStatus.SUCCEEDED, by_task["fetch-ok"]
    refused = by_task["fetch-refused"]
    assert refused.status is UnitStatus.SETUP_FAILED, refused
    assert "the egress policy refused other.test:80 (no allow entry matches the name)" in (refused.error or "")
    for outcome, allowed, denied in ((by_task["fetch-ok"], 1, 0), (refused, 0, 1)):
        run = json.loads((summary.run_dir / outcome.unit_id / "run.json").read_text())
        assert run["egress"]["allowed"] == allowed and run["egress"]["refused"] == denied, run["egress"]
    assert not list((ale_home() / "egress").glob("*")), "an egress proxy was left behind"
