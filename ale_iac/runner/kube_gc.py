"""``ale-iac gc`` on Kubernetes: the pods, secrets, config maps and network policies of this home that no stack
accounts for, found by label (``managed-by=ale-iac``, ``ale-home=<home id>``: ``infra/kubernetes.py`` sets both)
on every cluster this home knows, and deleted.

The clusters: every ``kubernetes`` route of the profiles under ``stacks/``, and every cluster this home has
reached a unit on (``sandbox.portforward`` records each one, so a profile kept elsewhere is not forgotten). An
object is left over when the stack its ``ale-iac/stack`` annotation names is gone (``pulumi stack rm``, a backend
wiped), or, for a pod, when its stack exists but lists no unit on it (a create killed before Pulumi recorded
it). A stack that a live run claims or a live CLI is changing is left alone, as for the host substrates.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass

from ale_iac.cloud_routes import KubernetesRoute
from ale_iac.errors import AleIacError
from ale_iac.paths import home_id
from ale_iac.profile import load_profile_file, stacks_dir
from ale_iac.sandbox.portforward import Cluster, known_clusters
from ale_iac.toolchain import find_kubectl

KINDS = ("pods", "networkpolicies", "secrets", "configmaps")
"""What a unit is made of, in the order gc deletes it (the pod first: it mounts the rest)."""
ANNOTATION_STACK = "ale-iac/stack"
"""The stack's exact name (a label value is cleaned; ``infra/kubernetes.py`` sets both)."""
KUBECTL_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class KubeObject:
    cluster: Cluster
    kind: str
    namespace: str
    name: str
    stack: str

    @property
    def what(self) -> str:
        return f"kubernetes {self.kind[:-1]} {self.namespace}/{self.name} (stack {self.stack})"


def profile_clusters() -> set[Cluster]:
    """The clusters of the ``kubernetes`` routes of the profiles under ``stacks/`` (those that load)."""
    found: set[Cluster] = set()
    for path in sorted(stacks_dir().glob("Pulumi.*.yaml")):
        try:
            loaded = load_profile_file(path)
        except AleIacError:
            continue
        for route in loaded.profile.snapshots.values():
            if isinstance(route, KubernetesRoute):
                found.add(Cluster(route.kubeconfig_path, route.context, route.namespace))
    return found


def _kubectl(cluster: Cluster, *args: str) -> str:
    argv = [str(find_kubectl()), "--kubeconfig", cluster.kubeconfig, "-n", cluster.namespace]
    if cluster.context:
        argv += ["--context", cluster.context]
    done = subprocess.run(
        [*argv, *args], check=False, capture_output=True, text=True, timeout=KUBECTL_TIMEOUT_S, stdin=subprocess.DEVNULL
    )
    if done.returncode != 0:
        raise AleIacError(f"kubectl {' '.join(args[:2])} on {cluster.kubeconfig}: {done.stderr.strip()[-400:]}")
    return done.stdout


def objects_of_home(cluster: Cluster) -> list[KubeObject]:
    """Every object of this home on ``cluster``, of each of :data:`KINDS`."""
    selector = f"managed-by=ale-iac,ale-home={home_id()}"
    found: list[KubeObject] = []
    listing = json.loads(_kubectl(cluster, "get", ",".join(KINDS), "-l", selector, "-o", "json"))
    for item in listing.get("items", []):
        meta = item.get("metadata", {})
        kind = f"{str(item.get('kind', '')).lower()}s"
        if kind == "networkpolicys":
            kind = "networkpolicies"
        stack = (meta.get("annotations") or {}).get(ANNOTATION_STACK, "")
        found.append(KubeObject(cluster, kind, meta.get("namespace", ""), meta.get("name", ""), stack))
    return found


def leftovers(cluster: Cluster, existing: set[str], referenced: set[str], busy: set[str]) -> list[KubeObject]:
    """The objects of this home on ``cluster`` that no stack accounts for. ``existing``: the stacks of the
    backend; ``referenced``: the ``namespace/pod`` of every unit the stacks list;
    ``busy``: stacks to leave alone."""
    left: list[KubeObject] = []
    for obj in objects_of_home(cluster):
        if obj.stack in busy:
            continue
        if obj.stack not in existing or (obj.kind == "pods" and f"{obj.namespace}/{obj.name}" not in referenced):
            left.append(obj)
    return sorted(left, key=lambda o: (KINDS.index(o.kind), o.name))


def delete(obj: KubeObject) -> None:
    _kubectl(obj.cluster, "delete", obj.kind, obj.name, "--ignore-not-found", "--wait=false")


def clusters() -> set[Cluster]:
    """Every cluster this home knows (profiles under ``stacks/`` and those it reached units on), whose
    kubeconfig is still there."""
    import os

    return {c for c in profile_clusters() | known_clusters() if os.path.isfile(c.kubeconfig)}


def sweep(existing: set[str], referenced: set[str], busy: set[str], errors: list[str]) -> Iterable[KubeObject]:
    """The leftovers of every known cluster; a cluster that does not answer goes to ``errors``."""
    for cluster in sorted(clusters(), key=lambda c: (c.kubeconfig, c.context or "", c.namespace)):
        try:
            yield from leftovers(cluster, existing, referenced, busy)
        except (AleIacError, subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
            errors.append(f"kubernetes cluster {cluster.kubeconfig} ({cluster.namespace}): {exc}")


def cluster_rows() -> list[tuple[str, bool, str]]:
    """``ale-iac doctor``: kubectl, the provider plugin, and whether each known cluster answers with a Ready
    node (a usable cluster: units can be scheduled)."""
    from ale_iac.toolchain import KubectlNotFoundError, kube_bin_dir

    rows: list[tuple[str, bool, str]] = []
    try:
        rows.append(("kubectl", True, str(find_kubectl())))
    except KubectlNotFoundError as exc:
        return [("kubectl", False, str(exc))]
    plugin = kube_bin_dir() / "pulumi-resource-kubernetes"
    rows.append(
        (
            "provider plugin",
            plugin.is_file(),
            str(plugin) if plugin.is_file() else "not built: scripts/kube-cluster.sh build provider",
        )
    )
    for cluster in sorted(profile_clusters() | known_clusters(), key=lambda c: (c.kubeconfig, c.context or "")):
        name = f"cluster {cluster.kubeconfig}" + (f" ({cluster.context})" if cluster.context else "")
        rows.append((name, *_usable(cluster)))
    return rows


def _usable(cluster: Cluster) -> tuple[bool, str]:
    import os

    if not os.path.isfile(cluster.kubeconfig):
        return False, "no such kubeconfig (scripts/kube-cluster.sh start makes the test cluster's)"
    try:
        _kubectl(cluster, "get", "--raw", "/readyz")
        nodes = json.loads(_kubectl(cluster, "get", "nodes", "-o", "json")).get("items", [])
    except (AleIacError, subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
        return False, f"does not answer: {exc}"
    ready = [
        n["metadata"]["name"]
        for n in nodes
        if any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in n.get("status", {}).get("conditions", [])
        )
    ]
    if not ready:
        return False, f"API server ready, but no Ready node (of {len(nodes)})"
    return True, f"ready: {len(ready)} node(s) Ready ({', '.join(ready[:3])}), namespace {cluster.namespace}"
