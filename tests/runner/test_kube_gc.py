"""``ale-iac gc`` on a real cluster: the pod, secret, config map and network policy of a unit whose stack is
gone (its backend record deleted behind ale-iac's back) are found by label and deleted; a live stack's are kept."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ale_iac.contract import Shape, UnitSpec
from ale_iac.engine import Engine
from ale_iac.provision import destroy_stack, new_stack_name, up_unit
from ale_iac.runner import gc
from ale_iac.sandbox.portforward import sweep_orphans
from tests.support.kube import KubeCluster, kube_profile, objects_of
from tests.support.tasks import make_preset, make_task

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.kubernetes,
    pytest.mark.engine,
    pytest.mark.xdist_group("kubernetes"),
    pytest.mark.timeout(3900),
]


def test_gc_deletes_the_objects_of_a_gone_stack_by_label_and_keeps_a_live_ones(kube_cluster: KubeCluster) -> None:
    engine = Engine()
    profile = kube_profile(kube_cluster, Shape(memory_gb=1))
    gone, kept = new_stack_name("pool", "gone"), new_stack_name("pool", "kept")
    up_unit(engine, profile, gone, UnitSpec(name="u0"))
    up_unit(engine, profile, kept, UnitSpec(name="u0"))
    try:
        assert len(objects_of(kube_cluster, gone)) == 4
        root = engine.state_root
        assert root is not None
        for record in (root / ".pulumi" / "stacks").rglob(f"{gone}.json*"):
            record.unlink()  # the stack is gone; its objects are not
        assert gone not in {s.name for s in engine.list_stacks()}

        dry = gc.collect(engine, dry_run=True)
        assert sum(gone in what for what in dry.sandboxes_stopped) == 4 and len(objects_of(kube_cluster, gone)) == 4
        report = gc.collect(engine)
        removed = [what for what in report.sandboxes_stopped if "kubernetes" in what]
        assert len(removed) == 4 and all(gone in what for what in removed), report
        assert report.errors == []
        assert len(objects_of(kube_cluster, kept)) == 4  # a live stack's unit is accounted for
        deadline = time.monotonic() + 60  # the pod was deleted without waiting: it terminates (grace 5 s)
        while objects_of(kube_cluster, gone):
            assert time.monotonic() < deadline, objects_of(kube_cluster, gone)
            time.sleep(0.5)
    finally:
        destroy_stack(engine, kept)
    assert objects_of(kube_cluster, kept) == []


def test_a_sigkilled_run_on_kubernetes_is_recovered_by_gc(kube_cluster: KubeCluster, tmp_path: Path) -> None:
    """``ale-iac evaluate`` on the kubernetes profile killed with SIGKILL while its agents run: its two stacks
    are left, with their pods and the run's port-forwards (kubectl runs in a session of its own); gc destroys the
    stacks (and so the pods) and kills the forwards."""
    make_task(tmp_path, "answer")
    make_preset(tmp_path, "sleepy", "SleepyAgent")
    spec = {
        "name": "t",
        "agents": ["sleepy.yaml"],
        "tasks": ["answer"],
        "profile": "kubernetes",
        "repeats": 2,
        "concurrency": 2,
        "unit_timeout_s": 600,
    }
    (tmp_path / "exp.yaml").write_text(json.dumps(spec))
    proc = subprocess.Popen(
        [sys.executable, "-m", "ale_iac", "evaluate", str(tmp_path / "exp.yaml")],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while len(list(tmp_path.glob("runs/*/*/agent/agent.log"))) < 2:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() < deadline, "agents never started"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    engine = Engine()
    stacks = [s.name for s in engine.list_stacks()]
    assert len(stacks) == 2 and all(len(objects_of(kube_cluster, s)) == 4 for s in stacks)
    assert len(sweep_orphans(dry_run=True)) >= 2  # the killed run's forwards, one per unit
    report = gc.collect(engine)
    assert sorted(report.destroyed) == sorted(stacks) and report.errors == [], report
    assert len(report.port_forwards_killed) >= 2 and sweep_orphans(dry_run=True) == []
    assert engine.list_stacks() == [] and all(objects_of(kube_cluster, s) == [] for s in stacks)
