"""Pytest plugin: the private single-node Kubernetes cluster of the ``kubernetes`` marker's tests.

Loaded by ``tests/conftest.py``. ``kube_cluster`` (session) builds the cluster's binaries and the provider plugin
(``scripts/kube-cluster.sh build``: cached, under a lock; ~23 min cold), starts the cluster (its own ports,
folders, containerd and network devices), imports the desktop image's OCI archive into its containerd, and stops
it at the end, leaving nothing: unless it was running already, then it is left as found. The tests that use it
carry ``pytestmark = [pytest.mark.kubernetes, pytest.mark.xdist_group("kubernetes")]``: one worker owns it.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ale_iac.cloud_routes import KubernetesRoute
from ale_iac.contract import Shape
from ale_iac.images import ensure_oci_archive, require_image
from ale_iac.profile import Profile, resolve_profile
from ale_iac.substrates import isolation

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


def kube_profile(cluster: KubeCluster, shape: Shape | None = None) -> Profile:
    """The shipped ``kubernetes`` profile, pointed at the test cluster's kubeconfig (and given ``shape``: requests
    are limits, and the 2-core node fits two units of the shipped 1 vCPU)."""
    profile = resolve_profile("kubernetes").profile
    update: dict[str, object] = {"kubeconfig": str(cluster.kubeconfig)}
    if shape is not None:
        update["shape"] = shape
    routes = {
        name: route.model_copy(update=update) if isinstance(route, KubernetesRoute) else route
        for name, route in profile.snapshots.items()
    }
    return profile.model_copy(update={"snapshots": routes})


def objects_of(cluster: KubeCluster, stack: str) -> list[str]:
    """``Kind/name`` of every ale-iac object on the cluster that belongs to ``stack``."""
    listing = cluster.kubectl(
        "get", "pods,secrets,configmaps,networkpolicies", "-A", "-o", "json", "-l", "managed-by=ale-iac"
    )
    items = json.loads(listing.stdout)["items"]
    return [
        f"{i['kind']}/{i['metadata']['name']}"
        for i in items
        if (i["metadata"].get("annotations") or {}).get("ale-iac/stack") == stack
    ]


_RUNTIME_ONLY = (
    "no host process stands for the unit but the cluster's own (the kubelet, containerd and its shim), which "
    "ale-iac does not start"
)
POD_NOT_APPLICABLE = {
    isolation.ROOT_UNPRIVILEGED: "the test cluster's runtime (Debian 12's containerd 1.6) gives a pod no user "
    "namespace (`hostUsers: false` needs containerd 2 and runc 1.2): root in the pod is the node's uid 0, "
    "held back by the capability set, the project's seccomp policy and no_new_privs (their rows)",
    isolation.DISK_BOUNDED: "not held at write time: Kubernetes bounds a pod's volumes on the node's disk only by "
    "eviction (past the shape's disk_gb, its ephemeral-storage limit, or a volume's sizeLimit the kubelet evicts the "
    "pod at its next check); no write is refused for space, and a memory-backed volume, which would be, cannot be "
    "nosuid (the kubelet mounts it as a fresh tmpfs)",
    isolation.HOST_READS_SAFELY: "the host reads a pod's files only through its endpoint (the computer-server, "
    "over the port-forward), never from the node's disk",
    isolation.NETWORK_LOOPBACK_ONLY: "a pod has a network of its own (the cluster's bridge; a port-forward "
    "needs one), with no route off it: tests/infra/test_kubernetes_cluster.py checks from inside",
    isolation.HOST_PROCESS_CONFINED: _RUNTIME_ONLY,
    isolation.HOST_PROCESS_UNPRIVILEGED: _RUNTIME_ONLY,
}
"""Why a check of the isolation suite does not apply to a pod of the test cluster (``docs/isolation.md``)."""


class KubePodIsolation:
    """A unit's pod on the private test cluster, whose node is this host: its processes are those in the pod's
    cgroup, its host folder is the kubelet's folder of the pod (its emptyDir volumes, its projected token)."""

    def __init__(self, cluster: KubeCluster, namespace: str, pod: str) -> None:
        self.cluster = cluster
        meta = json.loads(cluster.kubectl("get", "pod", pod, "-n", namespace, "-o", "json").stdout)["metadata"]
        self.uid = str(meta["uid"])

    def _pod_cgroup(self, line: str) -> str | None:
        """The pod's own cgroup path in one line of ``/proc/<pid>/cgroup`` (cgroupfs or systemd naming)."""
        path = line.split(":", 2)[2]
        for name in (f"pod{self.uid}", f"pod{self.uid.replace('-', '_')}.slice"):
            if f"/{name}/" in path + "/":
                return path[: path.index(name) + len(name)]
        return None

    def host_pids(self) -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                lines = (entry / "cgroup").read_text().splitlines()
            except OSError:
                continue
            if any(self._pod_cgroup(line) for line in lines):
                found.append(int(entry.name))
        return found

    def host_paths(self) -> list[Path]:
        return [self.cluster.state / "kubelet" / "pods" / self.uid]

    def read_log(self, name: str) -> str:
        raise NotImplementedError(POD_NOT_APPLICABLE[isolation.HOST_READS_SAFELY])

    def _pids_file(self, name: str) -> Path:
        """``name`` of the pod's pids cgroup (the kubelet's ``podPidsLimit`` is set there, for the whole pod)."""
        for pid in self.host_pids():
            for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
                number, controllers, _ = line.split(":", 2)
                pod = self._pod_cgroup(line)
                if pod is None:
                    continue
                if "pids" in controllers.split(","):
                    return Path("/sys/fs/cgroup") / controllers / pod.lstrip("/") / name
                if number == "0" and controllers == "":
                    return Path("/sys/fs/cgroup") / pod.lstrip("/") / name
        raise FileNotFoundError(f"pod {self.uid} has no process in a pids cgroup")

    def tasks_in_use(self) -> int:
        return int(self._pids_file("pids.current").read_text())

    def tasks_limit(self) -> int:
        """The pod's task limit as the kernel applies it (``pids.max``)."""
        return int(self._pids_file("pids.max").read_text())

    def not_applicable(self, check: str) -> str | None:
        isolation.unknown_check(check)
        return POD_NOT_APPLICABLE.get(check)
