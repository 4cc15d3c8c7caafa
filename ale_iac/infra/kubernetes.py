"""Kubernetes: a pod of the desktop image per unit on the user's cluster, declared with ``pulumi_kubernetes``.

Per unit, a ``ale-iac:kubernetes:Unit`` component parents:

* ``<unit>-token``: the unit's endpoint token (``infra/endpoint_token.py``: made once, a secret in the state);
* ``<unit>-secret``: a ``v1.Secret`` holding it, and ``<unit>-forwarder``: a ``v1.ConfigMap`` holding the
  forwarder (``substrates/authproxy.py``, standard library only); the pod mounts both, read-only, at
  ``/opt/ale-iac`` (a projected volume, mode 0400): the token is in no environment variable, command line,
  annotation or output in clear;
* ``<unit>-pod``: the ``v1.Pod``. Its PID 1 is the forwarder in front of the image's computer-server
  (``authproxy.unit_entry``, as a ``docker`` unit's), the forwarder listening on the pod's *loopback*: it is
  reached only through the API server's port-forward (``contract.PortForward``), never through the pod
  network, a NodePort or a LoadBalancer. Requests and limits from the shape (CPU, memory, ephemeral storage);
  no privilege, no privilege escalation, every capability dropped but the local substrate's set, a read-only
  root with node-disk ``emptyDir`` volumes where the image writes (``/dev/shm`` and ``/run`` included: the
  kubelet mounts a memory-backed one as a fresh tmpfs that can be neither ``nosuid`` nor ``nodev``, while a
  disk-backed one is a bind from the kubelet's folder and keeps that mount's flags, so a node whose kubelet
  folder is mounted ``nosuid,nodev`` gives every writable mount of the unit both), no service-account token,
  no service links, the route's ``runtimeClassName``; seccomp: the project's policy as a ``Localhost`` profile
  where the route names one (the nodes have it), else ``RuntimeDefault`` (recorded either way);
* ``<unit>-deny-egress``: a ``networking.v1.NetworkPolicy`` selecting the pod that denies all egress and all
  ingress (the port-forward does not cross the pod network), unless the route sets ``allow_outbound``; recorded
  as enforced or not (the route's ``network_policy_enforced``: the API cannot tell whether the cluster's network
  plugin enforces it).

Every object carries the unit labels of the clouds (``cloud_common.unit_labels``) plus ``ale-home`` (the ale-iac
home that made it), and the annotation ``ale-iac/expires-at``; ``ale-iac gc`` finds them by label, also when
their stack is gone (``runner/kube_gc.py``). The pod is auto-named (``<unit>-pod-<hex>``), so a pool's
``reset: recreate`` replaces it create-before-delete and the unit's endpoint follows the new name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from ale_iac.cloud_routes import KUBE_FORWARDER_PORT, KubernetesRoute
from ale_iac.contract import LINUX_DESKTOP_PATHS, PortForward, UnitOutputs, UnitSpec, forwarder_channel
from ale_iac.errors import ConfigError
from ale_iac.images import oci_image_name, recipe_hash
from ale_iac.infra import DeclareContext
from ale_iac.infra.cloud_common import (
    LABEL_EXPIRY,
    digest,
    expiry_for,
    expiry_label_to_iso,
    shared_resource,
    unit_labels,
    unit_slug,
)
from ale_iac.infra.endpoint_token import EndpointToken
from ale_iac.paths import home_id
from ale_iac.substrates import authproxy

# The SDK's submodules are lazy (importlib's LazyLoader), and loading one from two threads at once races
# (Python 3.11): two inline programs of `evaluate` declaring at once saw "'pulumi_kubernetes.core.v1' has no
# attribute 'Secret'". Touching what this module uses loads them here, under this module's import lock.
_USED = (
    k8s.Provider,
    k8s.core.v1.Secret,
    k8s.core.v1.ConfigMap,
    k8s.core.v1.Pod,
    k8s.networking.v1.NetworkPolicy,
    k8s.meta.v1.ObjectMetaArgs,
)

UNIT_TYPE = "ale-iac:kubernetes:Unit"
LABEL_HOME = "ale-home"
LABEL_UNIT_ID = "ale-unit-id"
"""A value unique to the unit across stacks: what its NetworkPolicy selects."""
ANNOTATION_EXPIRES = "ale-iac/expires-at"
ANNOTATION_STACK = "ale-iac/stack"
"""The stack's exact name (the ``ale-stack`` label is cleaned to a label value): what gc compares."""
ANNOTATION_SECCOMP = "ale-iac/seccomp"
ANNOTATION_EGRESS_POLICY = "ale-iac/egress-policy"
ALE_DIR = "/opt/ale-iac"
INIT = "/usr/local/sbin/ale-init"
SERVER_PORT = 8000
KEPT_CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID", "NET_BIND_SERVICE", "SYS_CHROOT"]
"""The local substrate's set (a ``docker`` unit keeps the same): everything else is dropped."""
SCRATCH = {
    "home": ("/root", None),
    "data": ("/data", None),
    "media": ("/media", None),
    "tmp": ("/tmp", None),
    "var-tmp": ("/var/tmp", None),
    "run": ("/run", None),
    "log": ("/var/log/ale", None),
}
"""emptyDir volumes (name -> mount point, medium) under the read-only root: the docker unit's volumes and tmpfs.
None is the node's disk: see the module's docstring for why nothing is memory-backed."""


def image_name(route: KubernetesRoute) -> str:
    """The pods' image: the recipe's hash names it, as in the image cache (``ale-iac images build --export oci``)."""
    tag = "<hash12>" if _under_mocks() else recipe_hash(route.image)[:12]  # a plan outlives a recipe edit
    return oci_image_name(route.image, tag, route.registry)


def kube_labels(unit: UnitSpec, snapshot: str, route: KubernetesRoute, ctx: DeclareContext) -> dict[str, str]:
    """The cloud units' labels (valid Kubernetes label values: they start and end alphanumeric) plus the home
    and the unit's own id."""
    labels = unit_labels(unit, snapshot, ctx, expiry_for(route.ttl_hours), _outbound(route))
    labels = {key: value.strip("-_") or "x" for key, value in labels.items()}
    labels[LABEL_HOME] = "home" if _under_mocks() else home_id()  # a plan is the same on every host
    labels[LABEL_UNIT_ID] = f"u{digest(f'{pulumi.get_project()}/{ctx.stack}/{unit.name}', 16)}"
    return labels


def _outbound(route: KubernetesRoute) -> str:
    if route.allow_outbound:
        return "all"
    return "proxy" if route.egress is not None else "none"


def seccomp_of(route: KubernetesRoute) -> dict[str, str]:
    if route.seccomp_localhost:
        return {"type": "Localhost", "localhost_profile": route.seccomp_localhost}
    return {"type": "RuntimeDefault"}


def resources_of(unit: UnitSpec, route: KubernetesRoute) -> dict[str, str]:
    """The shape as the pod's requests and limits (the same values: the unit gets what it asks, no more)."""
    shape = unit.shape.over(route.shape)
    out: dict[str, str] = {}
    if shape.vcpus:
        out["cpu"] = str(shape.vcpus)
    if shape.memory_gb:
        out["memory"] = f"{int(shape.memory_gb * 1024)}Mi"
    if shape.disk_gb:
        out["ephemeral-storage"] = f"{shape.disk_gb}Gi"
    return out


def _under_mocks() -> bool:
    """Whether the program runs under Pulumi's mocks (``ale-iac plan``, tests): no cluster is asked then."""
    from pulumi.runtime.mocks import MockMonitor
    from pulumi.runtime.settings import get_monitor

    return isinstance(get_monitor(), MockMonitor)


def provider_for(route: KubernetesRoute) -> k8s.Provider:
    """One provider per (kubeconfig, context, namespace) in the program. The kubeconfig is given by path: its
    keys never enter the stack's state."""
    path = route.kubeconfig_path
    if not os.path.isfile(path) and not _under_mocks():
        raise ConfigError(
            "profile",
            "kubeconfig",
            f"{route.kubeconfig!r} is no file (resolved to {path}): name the cluster's kubeconfig",
        )
    key = f"{path}|{route.context}|{route.namespace}"

    def make() -> k8s.Provider:
        return k8s.Provider(
            f"kube-{digest(key)}",
            kubeconfig=path,
            context=route.context,
            namespace=route.namespace,
        )

    provider: k8s.Provider = shared_resource(f"kubernetes:{key}", make)
    return provider


def _volumes(secret: k8s.core.v1.Secret, forwarder: k8s.core.v1.ConfigMap, shm_gb: float) -> list[Any]:
    volumes: list[Any] = [
        k8s.core.v1.VolumeArgs(
            name="ale",
            projected=k8s.core.v1.ProjectedVolumeSourceArgs(
                default_mode=0o400,
                sources=[
                    k8s.core.v1.VolumeProjectionArgs(
                        secret=k8s.core.v1.SecretProjectionArgs(
                            name=secret.metadata.name, items=[k8s.core.v1.KeyToPathArgs(key="token", path="token")]
                        )
                    ),
                    k8s.core.v1.VolumeProjectionArgs(
                        config_map=k8s.core.v1.ConfigMapProjectionArgs(
                            name=forwarder.metadata.name,
                            items=[k8s.core.v1.KeyToPathArgs(key="authproxy.py", path="authproxy.py")],
                        )
                    ),
                ],
            ),
        ),
        # On the node's disk like the rest (not medium Memory: see the module's docstring); its size is bounded
        # by the kubelet, which evicts a pod whose volume outgrows its sizeLimit.
        k8s.core.v1.VolumeArgs(name="shm", empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs(size_limit=f"{shm_gb}Gi")),
    ]
    for volume, (_, medium) in SCRATCH.items():
        volumes.append(
            k8s.core.v1.VolumeArgs(name=volume, empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs(medium=medium))
        )
    return volumes


def _container(unit: UnitSpec, route: KubernetesRoute) -> k8s.core.v1.ContainerArgs:
    resources = resources_of(unit, route)
    mounts = [
        k8s.core.v1.VolumeMountArgs(name="ale", mount_path=ALE_DIR, read_only=True),
        k8s.core.v1.VolumeMountArgs(name="shm", mount_path="/dev/shm"),
        *(k8s.core.v1.VolumeMountArgs(name=volume, mount_path=path) for volume, (path, _) in SCRATCH.items()),
    ]
    return k8s.core.v1.ContainerArgs(
        name="desktop",
        image=image_name(route),
        image_pull_policy="IfNotPresent" if route.registry else "Never",
        command=authproxy.unit_entry(
            python="/usr/bin/python3",
            proxy_file=f"{ALE_DIR}/authproxy.py",
            token_file=f"{ALE_DIR}/token",
            listen=f"127.0.0.1:{KUBE_FORWARDER_PORT}",
            init=INIT,
            server_port=SERVER_PORT,
            width=route.screen_width,
            height=route.screen_height,
        ),
        env=[
            k8s.core.v1.EnvVarArgs(name="PATH", value="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
            k8s.core.v1.EnvVarArgs(name="LANG", value="C.UTF-8"),
        ],
        resources=k8s.core.v1.ResourceRequirementsArgs(requests=resources, limits=resources) if resources else None,
        security_context=k8s.core.v1.SecurityContextArgs(
            privileged=False,
            allow_privilege_escalation=False,
            read_only_root_filesystem=True,
            capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"], add=KEPT_CAPABILITIES),
        ),
        volume_mounts=mounts,
    )


SEEDED = ("home", "data", "media")
"""The emptyDirs that start with the image's content (as a docker unit's named volumes do): ``seed`` copies it."""


def _seed(container: k8s.core.v1.ContainerArgs) -> k8s.core.v1.ContainerArgs:
    """The init container that copies the image's ``/root``, ``/data`` and ``/media`` into their emptyDirs."""
    copy = " && ".join(f"cp -a {SCRATCH[v][0]}/. /seed/{v}/" for v in SEEDED)
    return k8s.core.v1.ContainerArgs(
        name="seed",
        image=container.image,
        image_pull_policy=container.image_pull_policy,
        command=["/bin/sh", "-c", copy],
        resources=container.resources,
        security_context=container.security_context,
        volume_mounts=[k8s.core.v1.VolumeMountArgs(name=v, mount_path=f"/seed/{v}") for v in SEEDED],
    )


class KubernetesUnit(pulumi.ComponentResource):
    """One unit's pod, the secret and forwarder it mounts, and the policy that walls it."""

    handle: pulumi.Output[dict[str, Any]]

    def __init__(
        self,
        name: str,
        unit: UnitSpec,
        snapshot: str,
        route: KubernetesRoute,
        ctx: DeclareContext,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        provider = provider_for(route)
        super().__init__(
            UNIT_TYPE, name, None, pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(providers=[provider]))
        )
        child = pulumi.ResourceOptions(parent=self, provider=provider)
        expiry = expiry_for(route.ttl_hours)
        labels = kube_labels(unit, snapshot, route, ctx)
        seccomp = seccomp_of(route)
        annotations = {
            ANNOTATION_EXPIRES: expiry.iso,
            ANNOTATION_STACK: ctx.stack,
            ANNOTATION_SECCOMP: seccomp["type"] + (f":{route.seccomp_localhost}" if route.seccomp_localhost else ""),
            ANNOTATION_EGRESS_POLICY: self._policy_record(route),
        }

        def meta() -> k8s.meta.v1.ObjectMetaArgs:
            return k8s.meta.v1.ObjectMetaArgs(labels=labels, annotations=annotations, namespace=route.namespace)

        ignore_expiry = [f'metadata.annotations["{ANNOTATION_EXPIRES}"]', f'metadata.labels["{LABEL_EXPIRY}"]']
        token = EndpointToken(f"{name}-token", pulumi.ResourceOptions(parent=self))
        secret = k8s.core.v1.Secret(
            f"{name}-secret",
            metadata=meta(),
            type="Opaque",
            string_data={"token": token.value},
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(ignore_changes=ignore_expiry)),
        )
        forwarder = k8s.core.v1.ConfigMap(
            f"{name}-forwarder",
            metadata=meta(),
            data={"authproxy.py": Path(authproxy.__file__).read_text(encoding="utf-8")},
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(ignore_changes=ignore_expiry)),
        )
        container = _container(unit, route)
        self.policies = [] if route.allow_outbound else [self._deny_egress(name, meta(), labels, child)]
        self.pod = k8s.core.v1.Pod(
            f"{name}-pod",
            metadata=meta(),
            spec=k8s.core.v1.PodSpecArgs(
                automount_service_account_token=False,
                enable_service_links=False,
                dns_policy="Default",  # the node's resolver (the test cluster's is empty); the pod has no egress
                restart_policy="Never",
                runtime_class_name=route.runtime_class,
                termination_grace_period_seconds=5,
                security_context=k8s.core.v1.PodSecurityContextArgs(
                    seccomp_profile=k8s.core.v1.SeccompProfileArgs(**seccomp)
                ),
                init_containers=[_seed(container)],
                containers=[container],
                volumes=_volumes(secret, forwarder, route.shm_gb),
            ),
            # Replaced (a recreate) by deleting first: the pod being replaced serves nobody, and a node sized for
            # the units has no room for a second one (the new pod never scheduled: "Insufficient cpu").
            opts=pulumi.ResourceOptions.merge(
                child,
                pulumi.ResourceOptions(
                    ignore_changes=ignore_expiry, depends_on=self.policies, delete_before_replace=True
                ),
            ),
        )
        self.handle = self._handle(unit, snapshot, route, labels, token)
        self.register_outputs({"handle": self.handle})

    @staticmethod
    def _policy_record(route: KubernetesRoute) -> str:
        if route.allow_outbound:
            return "none (allow_outbound: true)"
        enforced = "enforced" if route.network_policy_enforced else "not enforced by this cluster (declared)"
        return f"deny-all egress and ingress: {enforced}"

    @staticmethod
    def _deny_egress(
        name: str, meta: k8s.meta.v1.ObjectMetaArgs, labels: dict[str, str], child: pulumi.ResourceOptions
    ) -> k8s.networking.v1.NetworkPolicy:
        return k8s.networking.v1.NetworkPolicy(
            f"{name}-deny-egress",
            metadata=meta,
            spec=k8s.networking.v1.NetworkPolicySpecArgs(
                pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels={LABEL_UNIT_ID: labels[LABEL_UNIT_ID]}),
                policy_types=["Egress", "Ingress"],
                egress=[],
                ingress=[],
            ),
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(ignore_changes=[f'metadata.annotations["{ANNOTATION_EXPIRES}"]'])
            ),
        )

    def _handle(
        self, unit: UnitSpec, snapshot: str, route: KubernetesRoute, labels: dict[str, str], token: EndpointToken
    ) -> pulumi.Output[dict[str, Any]]:
        seccomp = seccomp_of(route)["type"].lower()
        record = {
            **labels,
            "ale-seccomp": seccomp,
            "ale-network-policy": "none"
            if route.allow_outbound
            else ("enforced" if route.network_policy_enforced else "not-enforced"),
        }

        def build(values: list[Any]) -> dict[str, Any]:
            pod_name, namespace, annotations, urn, secret, root = values
            pod_name = pod_name or f"{unit_slug(unit.name)}-pod"  # auto-named: None only under mocks
            expires = (annotations or {}).get(ANNOTATION_EXPIRES)
            handle = UnitOutputs(
                unit=unit.name,
                provider="kubernetes",
                endpoint=f"kubernetes://{namespace}/{pod_name}:{KUBE_FORWARDER_PORT}",
                endpoint_token=secret,
                inner_endpoint=f"http://127.0.0.1:{SERVER_PORT}",
                os="linux",
                snapshot=snapshot,
                image=image_name(route),
                resource_id=f"{namespace}/{pod_name}",
                region=route.context,
                paths=LINUX_DESKTOP_PATHS,
                labels=record,
                expires_at=expires or expiry_label_to_iso(record[LABEL_EXPIRY]),
                managed=True,
                reset=route.reset,
                reset_urns=[str(urn)],
                root_urn=str(root),
                gateway_channel=forwarder_channel(),
                egress=route.egress.model_dump(mode="json") if route.egress is not None else None,
                port_forward=PortForward(
                    kubeconfig=route.kubeconfig_path,
                    context=route.context,
                    namespace=str(namespace),
                    pod=str(pod_name),
                    port=KUBE_FORWARDER_PORT,
                ),
            )
            return handle.to_output()

        meta = self.pod.metadata
        return pulumi.Output.all(
            meta.name,
            meta.namespace,
            meta.annotations,
            self.pod.urn,
            token.value,
            self.urn,
            *(p.id for p in self.policies),
        ).apply(lambda values: build(values[:6]))


def declare_unit(
    unit: UnitSpec, snapshot: str, route: KubernetesRoute, ctx: DeclareContext
) -> pulumi.Output[dict[str, Any]]:
    """Declare one unit's pod on the route's cluster and return its handle (the ``UnitOutputs`` dict)."""
    return KubernetesUnit(unit_slug(unit.name), unit, snapshot, route, ctx).handle
