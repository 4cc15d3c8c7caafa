"""Pytest plugin: the private single-node Kubernetes cluster of the ``kubernetes`` marker's tests.

Loaded by ``tests/conftest.py``. ``kube_cluster`` (session) builds the cluster's binaries and the provider plugin
(``scripts/kube-cluster.sh build``: cached, under a lock; ~23 min cold), starts the cluster (its own ports,
folders, containerd and network devices), imports the desktop image's OCI archive into its containerd, and stops
it at the end, leaving nothing: unless it was running already, then it is left as found. The tests that use it
carry ``pytestmark = [pytest.mark.kubernetes, pytest.mark.xdist_group("kubernetes")]``: one worker owns it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ale_iac.images import ensure_oci_archive, require_image

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "kube-cluster.sh"
BUILD_TIMEOUT_S = 3600.0
"""A cold build: ~23 min of compiling on 2 cores idle, more under a loaded test run."""


@dataclass(frozen=True)
class KubeCluster:
    kubeconfig: Path
    bin_dir: Path
    state: Path

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            check=check,
            timeout=120,
        )


def script(*args: str, timeout: float = 600.0) -> str:
    """Run kube-cluster.sh; its stdout (its progress lines go to the test's stderr)."""
    done = subprocess.run(
        ["bash", str(SCRIPT), *args], stdout=subprocess.PIPE, stderr=None, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"scripts/kube-cluster.sh {' '.join(args)} failed (exit {done.returncode})")
    return done.stdout.strip()


def state_dir() -> Path:
    return Path(os.environ.get("ALE_IAC_KUBE_STATE", "/run/ale-iac-kube"))


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[KubeCluster]:
    bin_dir = Path(script("build", "cluster", "provider", timeout=BUILD_TIMEOUT_S).splitlines()[-1])
    was_running = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True, check=False).returncode == 0
    kubeconfig = Path(script("start", timeout=600).splitlines()[-1])
    try:
        require_image("desktop")
        script("load", str(ensure_oci_archive("desktop")), timeout=900)
        yield KubeCluster(kubeconfig=kubeconfig, bin_dir=bin_dir, state=state_dir())
    finally:
        if not was_running:
            script("stop", timeout=300)
