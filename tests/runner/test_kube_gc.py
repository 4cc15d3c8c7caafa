"""``ale-iac gc`` on a real cluster: the pod, secret, config map and network policy of a unit whose stack is
gone (its backend record deleted behind ale-iac's back) are found by label and deleted; a live stack's are kept."""

from __future__ import annotations

import time

import pytest

from ale_iac.contract import Shape, UnitSpec
from ale_iac.engine import Engine
from ale_iac.provision import destroy_stack, new_stack_name, up_unit
from ale_iac.runner import gc
from tests.infra.test_kubernetes_cluster import kube_profile, objects_of
from tests.support.kube import KubeCluster

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
