"""``sandbox.portforward`` without a cluster: the kubectl command (no secret in it), the clusters a home
remembers for gc, and which forwards gc counts as orphans (their owner gone). The forward itself, on a real
cluster: tests/infra/test_kubernetes_cluster.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ale_iac.contract import PortForward
from ale_iac.sandbox import portforward


def target(**extra: object) -> PortForward:
    return PortForward.model_validate(
        {"kubeconfig": "/k/config", "namespace": "ns", "pod": "p-1", "port": 8443, **extra}
    )


def test_the_command_binds_loopback_and_names_the_kubeconfig_by_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(portforward, "find_kubectl", lambda: Path("/bin/kubectl"))
    argv = portforward.command(target(context="c"))
    assert argv == [
        "/bin/kubectl", "--kubeconfig", "/k/config", "--context", "c", "-n", "ns", "port-forward",
        "--address", "127.0.0.1", "pod/p-1", ":8443",
    ]  # fmt: skip
    assert portforward.command(target(), 4321)[-1] == "4321:8443"


def test_each_cluster_is_remembered_once_for_gc() -> None:
    assert portforward.known_clusters() == set()
    portforward.remember(target())
    portforward.remember(target(pod="p-2"))  # the same cluster
    portforward.remember(target(namespace="other"))
    assert portforward.known_clusters() == {
        portforward.Cluster("/k/config", None, "ns"),
        portforward.Cluster("/k/config", None, "other"),
    }


def test_a_forward_whose_owner_is_gone_is_an_orphan() -> None:
    """A stand-in for kubectl (a process with port-forward in its argv and the owner variable) is an orphan
    once the process its variable names is gone, and not while it runs."""
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    started = portforward.procs.start_time(owner.pid)
    fake = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "port-forward"],
        env={**os.environ, portforward.OWNER_ENV: f"{owner.pid}:{started}"},
    )
    try:
        deadline = time.monotonic() + 5
        while portforward.procs.argv(fake.pid)[-1:] != ["port-forward"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fake.pid not in portforward.sweep_orphans(dry_run=True)
        owner.kill()
        owner.wait()
        assert fake.pid in portforward.sweep_orphans(dry_run=True)
        assert fake.pid in portforward.sweep_orphans()
        assert fake.wait(timeout=10) == -9
    finally:
        for proc in (owner, fake):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
