"""A run's shared stack on a real cluster (the ``kubernetes`` profile, ``reset: recreate``): the pods of the run's
one stack serve its units in turn, a pod is replaced for a unit still to come and removed once none is, and the
run's engine calls are one ``up``, targeted updates and one ``destroy``; nothing is left on the cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ale_iac.engine import Engine
from ale_iac.runner.evaluation import run_experiment
from ale_iac.runner.experiment import load_experiment
from ale_iac.runner.shared_slots import RECREATED, REMOVED
from tests.support.kube import KubeCluster, objects_of
from tests.support.tasks import make_clean_slate_task, make_preset

pytestmark = [
    pytest.mark.kubernetes,
    pytest.mark.engine,
    pytest.mark.xdist_group("kubernetes"),
    pytest.mark.timeout(3900),
]


def test_a_shared_stack_on_kubernetes_replaces_a_pod_for_the_next_unit(
    kube_cluster: KubeCluster, tmp_path: Path
) -> None:
    make_clean_slate_task(tmp_path, "clean-slate")
    make_preset(tmp_path, "writer", "WriterAgent")
    spec = {
        "name": "t",
        "agents": ["writer.yaml"],
        "tasks": ["clean-slate"],
        "profile": "kubernetes",
        "repeats": 3,
        "concurrency": 2,
        "shared_stack": True,
    }
    (tmp_path / "exp.yaml").write_text(json.dumps(spec))
    summary = run_experiment(load_experiment(tmp_path / "exp.yaml"))
    assert [(o.status, o.score) for o in summary.outcomes] == [("succeeded", 1.0)] * 3, summary.outcomes
    # The first to end: one unit still to come, its pod replaced; the other two: none to come, removed.
    assert sorted(o.cleanup for o in summary.outcomes) == [REMOVED, REMOVED, RECREATED]
    engine = Engine()
    [log] = sorted((engine.home / "logs" / "stacks").glob("*.log"))
    operations = [" ".join(line.split()[2:-2]) for line in log.read_text().splitlines() if line.startswith("====")]
    assert operations[0] == "up" and operations[-1] == "destroy", operations
    assert 2 <= len(operations[1:-1]) <= 3 and set(operations[1:-1]) == {"up --target"}, operations
    pods = [
        json.loads((summary.run_dir / o.unit_id / "run.json").read_text())["handle"]["resource_id"]
        for o in summary.outcomes
    ]
    assert len(set(pods)) == 3, pods  # the third unit's pod is a new one
    assert engine.list_stacks() == [] and objects_of(kube_cluster, log.stem) == []
