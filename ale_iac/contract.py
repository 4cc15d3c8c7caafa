"""The seam between declaring sandboxes (``infra/``) and running against them (``sandbox/``,
``runner/``): the only thing the two sides share.

* The unit request: :class:`UnitSpec` (name, logical snapshot, :class:`Shape`, labels) is what the
  runtime asks the declaring side for.
* The unit outputs: every program that declares sandboxes exports one output, ``units``: a
  mapping of unit name to a dict of the shape of :class:`UnitOutputs`. The runtime parses that
  dict into a ``SandboxHandle``; it never looks at resources, providers or Pulumi state.
* The path conventions of the images, per OS (:data:`LINUX_DESKTOP_PATHS`, :data:`WINDOWS_DESKTOP_PATHS`).

It imports nothing of ours: both sides import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

UNITS_OUTPUT = "units"
"""Name of the stack output that carries the per-unit handles."""

POOL_LABEL = "pool"
"""The label of a pool's units (its value: the pool's stack), a run's shared stack's among them: the units that
are reset between leases, and so the only ones a route's ``checkpoint`` applies to."""

OsName = Literal["linux", "windows"]
BulkTransport = Literal["http", "docker", "qemu"]
ResetMode = Literal["restore", "recreate", "none"]
"""How a pool unit gets back to its image's clean state between leases: ``restore`` (its substrate remakes
it under the same id: local, docker, qemu), ``recreate`` (the pool stack replaces the unit's resources
through the engine: ``pulumi up --replace``), ``none`` (leased as it is)."""

ENDPOINT_TOKEN_ENV = "ALE_IAC_ENDPOINT_TOKEN"
"""Environment variable that carries an endpoint's bearer token to a process (a bridge, an agent's
MCP server): never a command-line argument, which every user of the host can read."""
ENDPOINT_TOKEN_FILE_ENV = "ALE_IAC_ENDPOINT_TOKEN_FILE"
"""Or the path of a file holding that token (0600, outside any record): what an executor hands a
bridge, so that an agent's MCP configuration, which lands in the run record, never holds the token."""
COMMAND_ENV_ENV = "ALE_IAC_COMMAND_ENV"
"""A JSON object: the environment every command a bridge starts in its unit sees (the unit's egress proxy
variables, ``SandboxHandle.command_env``); set by the executor that launches the bridge."""


class SandboxPaths(BaseModel):
    """Path conventions baked into an image; tasks and agents use them instead of hard-coding."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    home: str = Field(description="Home directory of the user the computer-server runs as.")
    work_dir_base: str = Field(description="Where per-run agent work dirs are created.")
    task_data_root: str = Field(description="Root of staged task data (input/, reference/, output/).")
    python: str = Field(description="A Python interpreter inside the sandbox.")
    ale_root: str | None = Field(
        default=None,
        description="ALE's REMOTE_ROOT_DIR: where cua-bench tasks keep their data, "
        "<ale_root>/<domain>/<task>/<variant>/{input,software,reference,output}. None: ALE's default for the OS.",
    )
    user: str | None = Field(default=None, description="The account the computer-server (and every command) runs as.")


ALE_LINUX_ROOT = "/media/user/data/agenthle"
"""ALE's ``REMOTE_ROOT_DIR`` on its Linux images (ale-ubuntu22), which its Linux tasks assume."""
ALE_WINDOWS_ROOT = "E:\\agenthle"
"""ALE's ``REMOTE_ROOT_DIR`` on its Windows images (ale-win10)."""

LINUX_DESKTOP_PATHS = SandboxPaths(
    home="/root",
    work_dir_base="/root/.ale",
    task_data_root="/data/tasks",
    python="/usr/bin/python3",
    ale_root=ALE_LINUX_ROOT,
    user="root",
)
"""Path conventions of the ``desktop`` image built from ``images/desktop``. ALE's data root is made by
the staging code when a task needs it (the root file system is writable); ``python3`` is on PATH."""

WINDOWS_DESKTOP_PATHS = SandboxPaths(
    home="C:\\Users\\User",
    work_dir_base="C:\\Users\\User\\.ale",
    task_data_root="C:\\ale\\tasks",
    python="C:\\ale-run\\.venv\\Scripts\\python.exe",
    ale_root=ALE_WINDOWS_ROOT,
    user="User",
)
"""Path conventions for Windows images: the desktop user ``User`` (auto-logon), the computer-server's
venv under ``C:\\ale-run`` (as in ALE's ale-win10 image), task data under ``C:\\ale\\tasks``, ALE's
tasks' data under ``E:\\agenthle``."""


def paths_for(os_name: OsName) -> SandboxPaths:
    return WINDOWS_DESKTOP_PATHS if os_name == "windows" else LINUX_DESKTOP_PATHS


class Shape(BaseModel):
    """Resource hints from a task card. Each provider translates what it can and records the rest."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vcpus: int | None = Field(default=None, ge=1, le=1024, description="Virtual CPUs.")
    memory_gb: float | None = Field(default=None, gt=0, le=16384, description="Memory in GiB.")
    disk_gb: int | None = Field(default=None, ge=1, le=65536, description="Boot disk size in GiB.")
    gpu: str | None = Field(default=None, description="GPU kind, e.g. nvidia-l4; None for no GPU.")
    machine_type: str | None = Field(default=None, description="Explicit machine type; wins over the rest.")

    def over(self, base: Shape) -> Shape:
        """This shape's set fields on top of ``base`` (task hints override profile defaults)."""
        merged = base.model_dump()
        merged.update({k: v for k, v in self.model_dump().items() if v is not None})
        return Shape(**merged)


@dataclass(frozen=True)
class UnitSpec:
    """One sandbox to declare: its name in the stack, the snapshot it asks for, its shape."""

    name: str
    snapshot: str | None = None
    shape: Shape = field(default_factory=Shape)
    labels: Mapping[str, str] = field(default_factory=dict)


class HostChannel(BaseModel):
    """The unit's model channel: an in-sandbox agent's model base URL, served inside the unit by the
    endpoint's forwarder and carried back to the runner's host over connections the host opens to the
    endpoint (``ale_iac.substrates.channel``). Nothing answers there unless a run holds the channel open,
    and what answers (the run's gateway) checks the unit's own token."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sandbox_url: str = Field(description="The channel inside the sandbox, e.g. http://127.0.0.1:4010.")
    host_socket: str | None = Field(
        default=None,
        description="Only in the outputs of local units made before the channel went through the endpoint: "
        "the Unix socket their supervisor relayed to (no longer used).",
    )


FORWARDER_MODEL_PORT = 4010
"""The port inside a unit on which an ale-iac forwarder (``substrates/authproxy.py``, ``MODEL_PORT``) serves the
model channel; its egress port is the next one (4011)."""


def forwarder_channel() -> HostChannel:
    """The model channel of a unit whose endpoint is an ale-iac forwarder: a host substrate's unit, a cloud VM of
    ale-iac's own disk (the route's ``guest_agent: true``), a static endpoint declared so (``forwarder: true``).
    The same forwarder serves the unit's egress channel, so a unit with this channel can carry an egress policy."""
    return HostChannel(sandbox_url=f"http://127.0.0.1:{FORWARDER_MODEL_PORT}")


class PortForward(BaseModel):
    """A unit reached through a Kubernetes API server's port-forward to its pod (nothing of the pod is exposed:
    no NodePort, no LoadBalancer). The running side opens the forward on this host's 127.0.0.1
    (``ale_iac.sandbox.portforward``) and uses that address as the unit's endpoint."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kubeconfig: str = Field(description="The kubeconfig file that reaches the cluster (a path, never its contents).")
    context: str | None = Field(default=None, description="Its context; None: the file's current context.")
    namespace: str
    pod: str
    port: int = Field(ge=1, le=65535, description="The pod's port the endpoint is (its forwarder's).")


class UnitOutputs(BaseModel):
    """What a stack exports per unit: everything a SandboxHandle needs, nothing provider-internal."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    unit: str = Field(description="Unit name, unique within its stack.")
    provider: str = Field(description="Provider kind that realised the unit (local, static, gcloud, ...).")
    endpoint: str = Field(description="Base URL of the unit's Cua computer-server.")
    inner_endpoint: str = Field(
        default="http://127.0.0.1:8000",
        description="The computer-server's base URL from inside the sandbox (what an in-sandbox bridge uses).",
    )
    gateway_channel: HostChannel | None = Field(
        default=None,
        description="How an in-sandbox agent reaches the run's model gateway on the host (set exactly when the "
        "unit's endpoint is an ale-iac forwarder, which also serves the unit's egress channel: "
        "forwarder_channel()); None where the endpoint is not one (a cloud image of someone else's, a plain "
        "static endpoint): then in-sandbox agents cannot reach a model and the unit can carry no egress policy.",
    )
    endpoint_token: SecretStr | None = Field(
        default=None,
        description="Bearer token the endpoint requires (a secret: the stack output is marked secret, and it is "
        "shown as '**********' wherever a handle is printed or recorded). None for endpoints without authentication.",
    )
    os: OsName = "linux"
    snapshot: str = Field(description="Logical snapshot the unit was routed from.")
    image: str = Field(description="Image the sandbox was created from.")
    resource_id: str = Field(description="Provider-side identity (instance id, sandbox id, endpoint).")
    region: str | None = Field(default=None, description="Zone or region for cloud units.")
    paths: SandboxPaths
    labels: dict[str, str] = Field(default_factory=dict)
    expires_at: str | None = Field(default=None, description="ISO-8601 time after which gc may reap it.")
    managed: bool = Field(default=True, description="False for endpoints ale-iac did not create (static).")
    transport: BulkTransport = Field(
        default="http",
        description="How bulk files (task inputs, outputs) reach the unit: 'http' (the computer-server's file "
        "commands, any endpoint), 'docker' (the local engine's archive API on ``container_id``) or 'qemu' (the "
        "unit guest's share, found by ``resource_id``).",
    )
    container_id: str | None = Field(default=None, description="The unit's container, for the 'docker' transport.")
    reset: ResetMode | None = Field(
        default=None,
        description="How a pool unit is reset between leases (the route's ``reset``). None: a stack made before "
        "the field existed; then the provider kind's substrate restores it where it can.",
    )
    reset_urns: list[str] = Field(
        default_factory=list,
        description="URNs of the unit's resources that a 'recreate' replaces (its VM, container or sandbox).",
    )
    root_urn: str | None = Field(
        default=None,
        description="URN of the unit's top resource (its component, or its one resource): a targeted update of it "
        "with its dependents removes the unit whole from a stack it shares (``ale_iac.runner.shared_slots``). None: "
        "a stack made before the field existed.",
    )
    port_forward: PortForward | None = Field(
        default=None,
        description="Set when the endpoint is reached through a Kubernetes port-forward to the unit's pod: then "
        "``endpoint`` names the pod (kubernetes://<namespace>/<pod>:<port>) and a handle's is the forward's local "
        "address (``SandboxHandle.from_outputs``).",
    )
    egress: dict[str, Any] | None = Field(
        default=None,
        description="The route's egress policy (an ``egress_policy.EgressPolicy`` as JSON), so a pool lease gets "
        "it as an ephemeral unit does; None: the route has none (or the stack predates the field).",
    )

    def token(self) -> str | None:
        """The endpoint's bearer token in clear (for a client or a bridge's environment)."""
        return self.endpoint_token.get_secret_value() if self.endpoint_token else None

    def to_output(self) -> dict[str, Any]:
        """The plain dict a stack exports (the token in clear: the caller marks the output secret)."""
        data = self.model_dump()
        data["endpoint_token"] = self.token()
        if data["egress"] is None:
            del data["egress"]  # a unit without a policy exports what it did before the field existed
        if data["port_forward"] is None:
            del data["port_forward"]  # likewise: only a Kubernetes unit has one
        if data["root_urn"] is None:
            del data["root_urn"]
        return data


def parse_units(raw: Any) -> dict[str, UnitOutputs]:
    """Parse the ``units`` stack output; raises ``ValueError`` naming the unit and field on bad data."""
    if not isinstance(raw, dict):
        raise ValueError(f"stack output '{UNITS_OUTPUT}' must be a mapping, got {type(raw).__name__}")
    parsed: dict[str, UnitOutputs] = {}
    for name, value in raw.items():
        try:
            parsed[str(name)] = UnitOutputs.model_validate(value)
        except Exception as exc:  # pydantic.ValidationError, re-raised with the unit's name
            raise ValueError(f"stack output '{UNITS_OUTPUT}.{name}' is not a unit handle: {exc}") from exc
    return parsed
