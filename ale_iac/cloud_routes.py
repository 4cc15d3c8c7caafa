"""Route models for the remote providers: the clouds (gcloud, aws, aliyun) and a user's Kubernetes cluster.

Kept apart from profile.py because they are large; profile.py puts them in its discriminated union.
Every cloud route must name the source ranges allowed to reach the computer-server port: there is
no default and 0.0.0.0/0 is refused, because the server has no authentication of its own.

No route field carries a credential. Providers take credentials from the environment
(``GOOGLE_APPLICATION_CREDENTIALS`` / ADC, ``AWS_*``, ``ALIBABA_CLOUD_*``); the models are strict,
so a ``password:`` or ``access_key:`` under a route is an "unknown key" error, and
:func:`find_clear_credentials` finds provider credentials written in clear text elsewhere in a
stack config file.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ale_iac.contract import OsName, SandboxPaths, Shape
from ale_iac.egress_policy import EgressPolicy

IPV4_MIN_PREFIX = 8
"""Widest IPv4 range accepted (a /8). Wider ranges are refused: 0.0.0.0/1 + 128.0.0.0/1 is the internet."""
IPV6_MIN_PREFIX = 32
"""Widest IPv6 range accepted."""
GUEST_AGENT_PORT = 8443
"""The endpoint's port on ale-iac's own disk: the forwarder, in front of the computer-server's loopback port."""


def check_source_ranges(ranges: list[str]) -> list[str]:
    """Reject an empty list and any range that opens the port to the whole internet (or close to it).

    Errors are ``PydanticCustomError`` so the one-line message profile.py prints has no
    "Value error," prefix.
    """
    if not ranges:
        raise PydanticCustomError(
            "source_ranges_required",
            "required: list the runner's CIDR ranges (there is no default and no 0.0.0.0/0, "
            "because the computer-server has no authentication)",
        )
    for text in ranges:
        try:
            net = ipaddress.ip_network(text, strict=False)
        except ValueError:
            raise PydanticCustomError("cidr", f"{text!r} is not a CIDR range") from None
        minimum = IPV4_MIN_PREFIX if net.version == 4 else IPV6_MIN_PREFIX
        if net.prefixlen == 0:
            raise PydanticCustomError(
                "world_open", f"{text!r} opens the port to the whole internet; name the runner's ranges"
            )
        if net.prefixlen < minimum:
            raise PydanticCustomError("too_wide", f"{text!r} is wider than /{minimum}; name the runner's ranges")
    return ranges


class CloudRouteBase(BaseModel):
    """Fields every cloud route shares. One route = one logical snapshot served by one cloud."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str = Field(description="Machine image / AMI / ECS image the VM boots from.")
    os: OsName = "linux"
    allowed_source_ranges: list[str] = Field(
        default_factory=list,
        validate_default=True,
        description="CIDRs allowed to reach the computer-server port. Required; 0.0.0.0/0 is refused.",
    )
    ssh_source_ranges: list[str] = Field(
        default_factory=list,
        description="CIDRs allowed to reach SSH (port 22). Empty (the default) keeps SSH closed.",
    )
    server_port: int = Field(default=8000, ge=1, le=65535, description="Port of the computer-server.")
    ttl_hours: float = Field(default=6.0, gt=0, le=24 * 14, description="Cloud-side time-to-live per VM.")
    reach_privately: bool = Field(
        default=False,
        description="The runner reaches VMs over a private network (same VPC, VPN, interconnect): "
        "no public IP is allocated and the endpoint uses the private address.",
    )
    allow_outbound: bool = Field(
        default=False, description="Let the VM open outbound connections. Off: egress is denied."
    )
    machine_type: str | None = Field(
        default=None, description="Machine/instance type when the task gives no shape hints."
    )
    gpu: str | None = Field(default=None, description="GPU this snapshot needs (a task's gpu hint wins).")
    disk_gb: int | None = Field(
        default=None, ge=10, le=65536, description="Boot disk size when the task gives none (None: image size)."
    )
    paths: SandboxPaths | None = Field(
        default=None, description="Path conventions of the image; None uses the defaults of `os`."
    )
    guest_agent: bool = Field(
        default=False,
        description="The image is ale-iac's own desktop disk (`ale-iac images build desktop --export gce|ec2|ecs`, "
        "docs/clouds.md): its guest agent takes the unit's endpoint token from the instance metadata at boot "
        f"and its forwarder on port {GUEST_AGENT_PORT} admits only requests that carry it. The unit gets a "
        "token of its own (a secret in the stack) and no startup script; the firewall opens that port only. "
        "The forwarder also serves the unit's model and egress channels (the handle's gateway_channel): "
        "in-sandbox agents reach their model, and an egress policy its proxy, through the endpoint alone.",
    )
    egress: EgressPolicy | None = Field(
        default=None,
        description="Where units may connect, through a per-unit egress proxy on the runner reached over the "
        "unit's own endpoint (docs/clouds.md, Egress): allow (domains, '*.' wildcards, CIDRs), deny (wins), "
        "ports. The VM itself keeps no outbound at all (its egress walls are declared either way). Needs "
        "guest_agent: true (the in-unit proxy port is the forwarder's). None: no network at all.",
    )
    reset: Literal["recreate", "none"] = Field(
        default="recreate",
        description="How a pool unit gets back to a clean state between leases: 'recreate' (the pool stack "
        "replaces its VM through the engine: a new instance from the image, pulumi up --replace), 'none' "
        "(leased as it is). A VM cannot be restored in place.",
    )

    @field_validator("allowed_source_ranges")
    @classmethod
    def _ranges(cls, value: list[str]) -> list[str]:
        return check_source_ranges(value)

    @field_validator("guest_agent")
    @classmethod
    def _guest_agent(cls, value: bool, info: ValidationInfo) -> bool:
        """ale-iac's disk is the Linux desktop image: its paths (python, work dirs) are Linux's."""
        if value and info.data.get("os") == "windows":
            raise PydanticCustomError(
                "guest_agent_is_linux", "guest_agent: true is ale-iac's own disk, a Linux one: give os: linux"
            )
        return value

    @field_validator("egress")
    @classmethod
    def _egress(cls, value: EgressPolicy | None, info: ValidationInfo) -> EgressPolicy | None:
        """Errors at ``<route>.egress``: a policy is one way out, and its proxy port is served by ale-iac's disk."""
        if value is None:
            return value
        if info.data.get("allow_outbound"):
            raise PydanticCustomError(
                "egress_and_outbound", "give either allow_outbound: true (everything) or an egress policy, not both"
            )
        if not info.data.get("guest_agent"):
            raise PydanticCustomError(
                "egress_needs_guest_agent",
                "an egress policy needs guest_agent: true (ale-iac's own disk, whose forwarder serves the in-unit "
                "proxy port; the VM itself has no outbound)",
            )
        return value

    @property
    def outbound(self) -> Literal["none", "proxy", "all"]:
        """What the VM may reach on its own network: nothing (the default, and with an egress policy, whose proxy
        is reached through the unit's endpoint), or everything (``allow_outbound``)."""
        if self.allow_outbound:
            return "all"
        return "proxy" if self.egress is not None else "none"

    @property
    def endpoint_port(self) -> int:
        """The port the firewall opens and the endpoint names: the forwarder's on ale-iac's disk, else the
        computer-server's own."""
        return GUEST_AGENT_PORT if self.guest_agent else self.server_port

    @field_validator("ssh_source_ranges")
    @classmethod
    def _ssh_ranges(cls, value: list[str]) -> list[str]:
        return check_source_ranges(value) if value else value


_GCE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


class ImageImport(BaseModel):
    """An image the stack imports from a disk file in the cloud's object store (a cloud export of ale-iac's
    disk, docs/clouds.md): the object (uploaded from ``source`` when given) and the image made from it. The
    route's ``image`` is then the new image's name, and its units boot from that resource."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bucket: str = Field(min_length=3, description="Bucket of the disk file (GCS, S3 or OSS, by the route's cloud).")
    object: str = Field(min_length=1, description="Object name (key) of the disk file in the bucket.")
    source: str | None = Field(
        default=None,
        description="A local disk file the stack uploads as that object (the path `ale-iac images build desktop "
        "--export <cloud>` prints); None: the object is already there.",
    )


class GcloudRoute(CloudRouteBase):
    """A GCE VM per unit. ``image`` is an image (``projects/P/global/images/X`` or ``.../family/F``)
    or a machine image (``projects/P/global/machineImages/X``), which the VM is created from."""

    provider: Literal["gcloud"]
    project: str = Field(description="GCP project id.")
    zone: str = Field(description="Zone, e.g. us-central1-a.")
    network: str = Field(default="default", description="VPC network name or self link.")
    subnetwork: str | None = Field(default=None, description="Subnetwork; None uses the network's default.")
    image_import: ImageImport | None = Field(
        default=None,
        description="Import the image (a `compute.Image` from the bucket's disk.raw .tar.gz); `image` is its name.",
    )

    @field_validator("zone")
    @classmethod
    def _zone(cls, value: str) -> str:
        if not re.match(r"^[a-z]+-[a-z]+\d+-[a-z]$", value):
            raise PydanticCustomError("zone", f"{value!r} is not a GCE zone like us-central1-a")
        return value

    @model_validator(mode="after")
    def _image_name(self) -> GcloudRoute:
        if self.image_import is not None and not _GCE_NAME.match(self.image):
            raise PydanticCustomError(
                "image_name", f"with image_import, image is the new image's name; {self.image!r} is not a GCE name"
            )
        return self

    @property
    def uses_machine_image(self) -> bool:
        """True when ``image`` names a machine image (VM created with InstanceFromMachineImage)."""
        return "/machineImages/" in self.image


class AwsRoute(CloudRouteBase):
    """An EC2 instance per unit."""

    provider: Literal["aws"]
    region: str = Field(description="AWS region, e.g. us-east-1.")
    availability_zone: str | None = Field(default=None, description="AZ; None lets EC2 (or the subnet) pick.")
    vpc_id: str | None = Field(default=None, description="VPC of the security group; None: the default VPC.")
    subnet_id: str | None = Field(default=None, description="Subnet; None: a default subnet.")
    key_name: str | None = Field(default=None, description="EC2 key pair name (a name, not a key).")
    image_import: ImageImport | None = Field(
        default=None,
        description="Import the image (a VMDK in S3: an EBS snapshot import, then an AMI); `image` is the AMI's name.",
    )
    import_role: str = Field(
        default="vmimport", description="The IAM service role VM Import uses to read the bucket (AWS's default name)."
    )

    @model_validator(mode="after")
    def _network(self) -> AwsRoute:
        if self.subnet_id is not None and self.vpc_id is None:
            raise PydanticCustomError(
                "vpc_required",
                "subnet_id needs vpc_id too (the security group must be in the subnet's VPC)",
            )
        return self


class AliyunRoute(CloudRouteBase):
    """An Alibaba Cloud ECS instance per unit (VPC network only)."""

    provider: Literal["aliyun"]
    region: str = Field(description="Region id, e.g. cn-hangzhou.")
    vpc_id: str = Field(description="VPC of the security group.")
    vswitch_id: str = Field(description="VSwitch the instance is attached to (it fixes the zone).")
    key_name: str | None = Field(default=None, description="ECS key pair name (a name, not a key).")
    public_bandwidth_mbps: int = Field(
        default=10, ge=1, le=200, description="Outbound bandwidth of the public IP (when not private)."
    )
    ttl_hours: float = Field(
        default=6.0, ge=0.5, le=24 * 14, description="Cloud-side time-to-live (ECS needs >= 30 min)."
    )
    image_import: ImageImport | None = Field(
        default=None,
        description="Import the image (a qcow2 in OSS, the region's bucket: an ECS image import); `image` is its name.",
    )


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
KUBE_FORWARDER_PORT = 8443
"""The pod's forwarder port: reached only through the API server's port-forward (it listens on the pod's
loopback), never through the pod network."""


class KubernetesRoute(BaseModel):
    """A pod of the desktop image per unit on the user's cluster (``ale_iac/infra/kubernetes.py``), reached
    through the API server's port-forward only; docs/kubernetes.md. No credential is a field: the kubeconfig
    is named by its path and read by the provider and by kubectl, never copied into the stack."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: Literal["kubernetes"]
    kubeconfig: str = Field(
        description="Path of the kubeconfig file that reaches the cluster ('~' expanded; relative to the working "
        "directory). Required: ale-iac never falls back to ~/.kube/config."
    )
    context: str | None = Field(default=None, description="The kubeconfig's context; None: its current context.")
    namespace: str = Field(default="default", description="Namespace of the units' pods, secrets and policies.")
    image: str = Field(default="desktop", description="Image recipe name under images/ (exported as an OCI archive).")
    registry: str | None = Field(
        default=None,
        description="Registry the image was pushed to (docs/kubernetes.md): pods pull "
        "<registry>/ale-iac/<recipe>:<hash12>. None: the image is imported into each node's containerd "
        "(ale-iac.local/<recipe>:<hash12>, imagePullPolicy: Never).",
    )
    runtime_class: str | None = Field(default=None, description="runtimeClassName of the pods (gVisor, Kata, ...).")
    seccomp_localhost: str | None = Field(
        default=None,
        description="The project's seccomp policy as a Localhost profile, relative to the kubelet's seccomp "
        "folder of every node (scripts/kube-cluster.sh installs ale-iac/sandbox.json). None: RuntimeDefault.",
    )
    network_policy_enforced: bool = Field(
        default=False,
        description="Whether the cluster's network plugin enforces NetworkPolicy (the API cannot tell): each "
        "unit's deny-egress policy is declared either way, and recorded as enforced or not.",
    )
    allow_outbound: bool = Field(default=False, description="Declare no deny-egress policy for the pods.")
    egress: EgressPolicy | None = Field(
        default=None,
        description="Where units may connect, through a per-unit egress proxy on the runner reached over the "
        "unit's own endpoint (the pod's forwarder); the pod itself keeps its deny-egress policy.",
    )
    screen_width: int = Field(default=1280, ge=320, le=7680)
    screen_height: int = Field(default=800, ge=240, le=4320)
    shape: Shape = Field(default_factory=Shape, description="Default shape: requests and limits of the pods.")
    shm_gb: float = Field(
        default=1.0,
        gt=0,
        le=64,
        description="Size limit of /dev/shm (an emptyDir on the node's disk; the kubelet evicts past it).",
    )
    ttl_hours: float = Field(default=24.0, gt=0, le=24 * 365, description="Expiry annotation: gc may reap it after.")
    reset: Literal["recreate", "none"] = Field(
        default="recreate",
        description="How a pool unit is cleaned between leases: 'recreate' (the pool stack replaces its pod, "
        "pulumi up --replace), 'none' (leased as it is).",
    )

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if not _DNS_LABEL.match(value):
            raise PydanticCustomError("namespace", f"{value!r} is not a Kubernetes namespace name (a DNS label)")
        return value

    @model_validator(mode="after")
    def _one_way_out(self) -> KubernetesRoute:
        if self.egress is not None and self.allow_outbound:
            raise PydanticCustomError(
                "egress_and_outbound", "give either allow_outbound: true (everything) or an egress policy, not both"
            )
        return self

    @property
    def os(self) -> OsName:
        return "linux"

    @property
    def kubeconfig_path(self) -> str:
        """The kubeconfig's absolute path (``~`` expanded), as the provider and kubectl are given it."""
        import os

        return os.path.abspath(os.path.expanduser(self.kubeconfig))


_CREDENTIAL_KEYS = frozenset(
    {
        "aws:accesskey",
        "aws:secretkey",
        "aws:token",
        "gcp:credentials",
        "gcp:accesstoken",
        "alicloud:accesskey",
        "alicloud:secretkey",
        "alicloud:securitytoken",
    }
)
_SECRETISH = re.compile(r"(secret|password|passwd|token|credential|private_?key|access_?key)", re.I)


def find_clear_credentials(config: Mapping[str, Any]) -> list[str]:
    """Config keys of a stack file that hold a credential in clear text (not ``secure:``).

    Pulumi stores ``pulumi config set --secret`` values as ``{secure: <ciphertext>}``; anything else
    under a credential-looking key is a leak waiting for a ``git push``.
    """
    found: list[str] = []
    for key, value in config.items():
        name = str(key)
        looks_secret = name.lower() in _CREDENTIAL_KEYS or bool(_SECRETISH.search(name.split(":", 1)[-1]))
        is_secure = isinstance(value, Mapping) and set(value) == {"secure"}
        if looks_secret and not is_secure and value not in (None, ""):
            found.append(name)
    return sorted(found)
