"""Environment profiles: which provider and image serve each logical snapshot, with what shape.

A profile lives in a Pulumi stack config file (``stacks/Pulumi.<name>.yaml``) under the key
``ale-iac:profile``; a pool stack adds ``ale-iac:pool``. The same models are read by the inline
program of ``ale-iac evaluate`` and by ``Pulumi.yaml``'s program, so both declare identical units.

Everything is strict: an unknown key is an error naming the key and the file.
"""

from __future__ import annotations

import os
import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ale_iac.cloud_routes import AliyunRoute, AwsRoute, GcloudRoute, KubernetesRoute
from ale_iac.config_files import read_yaml, validate
from ale_iac.contract import (
    LINUX_DESKTOP_PATHS,
    HostChannel,
    OsName,
    ResetMode,
    SandboxPaths,
    Shape,
    forwarder_channel,
)
from ale_iac.egress_policy import EgressPolicy
from ale_iac.errors import AleIacError, ConfigError, Problems, did_you_mean
from ale_iac.paths import project_root

CONFIG_NAMESPACE = "ale-iac"
PROFILE_KEY = f"{CONFIG_NAMESPACE}:profile"
POOL_KEY = f"{CONFIG_NAMESPACE}:pool"

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CleanupMode(StrEnum):
    """What happens to a unit's sandbox when its run ends."""

    DESTROY = "destroy"
    RETAIN = "retain"
    RETAIN_ON_FAILURE = "retain-on-failure"


HOST_RESET_DESCRIPTION = (
    "How a pool unit of this route gets back to its image's clean state between leases: 'restore' (the "
    "substrate remakes it under the same id), 'recreate' (the pool stack replaces its resource through the "
    "engine: pulumi up --replace), 'none' (leased as it is)."
)


EGRESS_DESCRIPTION = (
    "Where units may connect, through a per-unit egress proxy on the host (docs/isolation.md, Egress): "
    "allow (domains, '*.' wildcards, CIDRs), deny (wins), ports. None: no network at all."
)


class HostRoute(StrictModel):
    """What every route to a host substrate (``ale_iac/substrates/<provider>``) has."""

    provider: str
    image: str = Field(default="desktop", description="Image recipe name under images/.")
    screen_width: int = Field(default=1280, ge=320, le=7680)
    screen_height: int = Field(default=800, ge=240, le=4320)
    shape: Shape = Field(default_factory=Shape, description="Default shape when a task gives none.")
    reset: ResetMode = Field(default="restore", description=HOST_RESET_DESCRIPTION)
    egress: EgressPolicy | None = Field(default=None, description=EGRESS_DESCRIPTION)

    @model_validator(mode="after")
    def _one_way_out(self) -> HostRoute:
        if self.egress is not None and getattr(self, "allow_outbound", False):
            raise ValueError("give either allow_outbound: true (everything) or an egress policy, not both")
        return self


def egress_of(route: BaseModel) -> str:
    """What a route lets its units reach, in one line (plans, records): everything, nothing, or the policy."""
    if getattr(route, "allow_outbound", False):
        return "everything (allow_outbound: true; no per-destination filter)"
    policy = getattr(route, "egress", None)
    return policy.summary() if isinstance(policy, EgressPolicy) else "none (no network but the unit's endpoint)"


class LocalRoute(HostRoute):
    """A sandbox on this host: the image's rootfs run in Linux namespaces (bubblewrap)."""

    provider: Literal["local"]
    allow_outbound: bool = Field(default=False, description="Give the sandbox outbound network.")
    pids_limit: int = Field(
        default=4096, ge=64, le=4_194_304, description="Most tasks (processes and threads) alive in a sandbox at once."
    )
    checkpoint: bool = Field(
        default=False,
        description="Start units from CRIU checkpoints of a ready desktop instead of booting it: a pool unit is "
        "checkpointed once and reset between leases by restoring its checkpoint on a new writable layer; any other "
        "unit restores a template slot's, one made by the first unit of the same template (docs/checkpoint.md; "
        "needs root, CRIU 4.2 or later, and no outbound network).",
    )

    @field_validator("checkpoint")
    @classmethod
    def _checkpoint_needs(cls, value: bool, info: ValidationInfo) -> bool:
        """Errors at ``<route>.checkpoint``: a restore is a way to reset (a pool unit's), into a network of its own."""
        if value and info.data.get("allow_outbound"):
            raise PydanticCustomError(
                "checkpoint_and_outbound",
                "checkpoint: true cannot go with allow_outbound: true (each restore has a network of its own, which "
                "slirp4netns would have to follow)",
            )
        if value and info.data.get("reset", "restore") != "restore":
            raise PydanticCustomError(
                "checkpoint_needs_restore",
                "checkpoint: true is a way to reset a unit: it needs reset: restore, not {reset}",
                {"reset": repr(info.data.get("reset"))},
            )
        return value


class DockerRoute(HostRoute):
    """A container of the image per unit on the local Docker engine (``ale_iac/substrates/docker``)."""

    provider: Literal["docker"]
    image: str = Field(default="desktop", description="Image recipe name under images/ (exported to the engine).")
    allow_outbound: bool = Field(default=False, description="Give the container outbound network (never the host).")
    pids_limit: int = Field(default=4096, ge=64, le=4_194_304, description="Most tasks alive in a container at once.")
    shm_gb: float = Field(default=1.0, gt=0, le=64, description="Size of /dev/shm.")
    ttl_hours: float = Field(default=24.0, gt=0, le=24 * 365, description="Expiry label: gc may reap it after this.")


class QemuRoute(HostRoute):
    """A QEMU guest of the image's qcow2 export per unit (``ale_iac/substrates/qemu``): a real kernel."""

    provider: Literal["qemu"]
    image: str = Field(default="desktop", description="Image recipe name under images/ (exported as qcow2).")
    restore: bool = Field(
        default=True,
        description="Start units by restoring a saved memory state (one cold boot per image and shape) "
        "instead of booting each one.",
    )
    runner: Literal["host", "container"] = Field(
        default="host",
        description="Where QEMU runs: 'host' (qemu installed here) or 'container' (the qemu-runner image "
        "on the local Docker engine); both run the same launch script.",
    )
    ttl_hours: float = Field(default=24.0, gt=0, le=24 * 365, description="Expiry: gc may reap it after this.")
    shape: Shape = Field(
        default_factory=Shape, description="Default shape when a task gives none (guest vCPUs, memory)."
    )


class StaticRoute(StrictModel):
    """Existing computer-server endpoints. ale-iac attaches to them and never destroys them."""

    provider: Literal["static"]
    endpoints: list[str] = Field(min_length=1, description="One computer-server URL per unit.")
    image: str = Field(default="static", description="Label for records; nothing is provisioned.")
    os: OsName = "linux"
    paths: SandboxPaths = LINUX_DESKTOP_PATHS
    reset: Literal["none"] = Field(
        default="none", description="Static endpoints are not ale-iac's to remake: always 'none'."
    )
    endpoint_token_env: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="The environment variable that holds the endpoints' bearer token (ale-iac's forwarder in "
        "front of them, e.g. a VM of its cloud disk); the token itself never goes in a file.",
    )
    forwarder: bool = Field(
        default=False,
        description="The endpoints are ale-iac forwarders (a VM of ale-iac's cloud disk, a unit of another "
        "runner's): each serves, besides the computer-server behind it, the model channel (an in-sandbox agent's "
        "model URL, 127.0.0.1:4010 inside) and the egress channel (127.0.0.1:4011), both carried back to this host "
        "through the endpoint with its token. Needs endpoint_token_env. False: a plain computer-server (no "
        "in-sandbox agent with a model, no egress policy).",
    )
    egress: EgressPolicy | None = Field(
        default=None,
        description="Where units may connect, through a per-unit egress proxy on this host reached over the "
        "endpoint's egress channel (docs/isolation.md, Egress). Needs forwarder: true. None: nothing (as far as "
        "ale-iac is concerned: what the endpoint's own network allows is not ale-iac's).",
    )

    def gateway_channel(self) -> HostChannel | None:
        """What its units' outputs carry as ``gateway_channel``: the forwarder's channel, or None (both ways a
        static unit is made, a stack's ``infra/static.py`` and a run's lease of the endpoints, read it here)."""
        return forwarder_channel() if self.forwarder else None

    @field_validator("forwarder")
    @classmethod
    def _forwarder(cls, value: bool, info: ValidationInfo) -> bool:
        if value and not info.data.get("endpoint_token_env"):
            raise PydanticCustomError(
                "forwarder_needs_token",
                "forwarder: true needs endpoint_token_env (an ale-iac forwarder admits only requests with its "
                "token, and its channels are opened with it)",
            )
        return value

    @field_validator("egress")
    @classmethod
    def _egress(cls, value: EgressPolicy | None, info: ValidationInfo) -> EgressPolicy | None:
        if value is not None and not info.data.get("forwarder"):
            raise PydanticCustomError(
                "egress_needs_forwarder",
                "an egress policy needs forwarder: true (the in-unit proxy port is served by an ale-iac forwarder)",
            )
        return value

    def endpoint_token(self) -> str | None:
        """The endpoints' token from :attr:`endpoint_token_env`; an error naming the variable when it is unset."""
        if self.endpoint_token_env is None:
            return None
        token = os.environ.get(self.endpoint_token_env, "")
        if not token:
            raise AleIacError(f"endpoint_token_env: the environment variable {self.endpoint_token_env} is not set")
        return token

    @model_validator(mode="after")
    def _check_endpoints(self) -> StaticRoute:
        for endpoint in self.endpoints:
            if not re.match(r"^https?://[^/\s]+(:\d+)?/?$", endpoint):
                raise ValueError(f"endpoint {endpoint!r} is not a base URL like http://127.0.0.1:8000")
        return self


AnyRoute = LocalRoute | DockerRoute | QemuRoute | StaticRoute | GcloudRoute | AwsRoute | AliyunRoute | KubernetesRoute
"""The provider kinds: one route model each. The kind names and the declaring modules
(``ale_iac.infra.<kind>``) derive from it; a new kind is a route model here plus that module."""
Route = Annotated[AnyRoute, Field(discriminator="provider")]


def _kind_of(route_type: type[BaseModel]) -> str:
    kind: str = get_args(route_type.model_fields["provider"].annotation)[0]
    return kind


ROUTE_TYPES: tuple[type[BaseModel], ...] = get_args(AnyRoute)
PROVIDER_KINDS: tuple[str, ...] = tuple(_kind_of(route) for route in ROUTE_TYPES)


class Profile(StrictModel):
    """An environment profile: snapshot routing plus run defaults."""

    name: str = Field(description="Profile name; also the stack name of its pool.")
    description: str = ""
    snapshots: dict[str, Route] = Field(min_length=1, description="Logical snapshot -> route.")
    default_snapshot: str | None = Field(default=None, description="Used when a task names none.")
    cleanup: CleanupMode = CleanupMode.DESTROY
    ready_timeout_s: float = Field(default=180.0, gt=0, description="Readiness deadline per unit.")

    @model_validator(mode="after")
    def _check(self) -> Profile:
        if not _NAME_RE.match(self.name):
            raise ValueError(f"name {self.name!r} must be lowercase letters, digits and '-' (max 40)")
        if self.default_snapshot is not None and self.default_snapshot not in self.snapshots:
            raise ValueError(
                f"default_snapshot {self.default_snapshot!r} is not one of the snapshots "
                f"({', '.join(sorted(self.snapshots))})"
            )
        return self

    def route(self, snapshot: str | None) -> tuple[str, AnyRoute]:
        """The (snapshot, route) serving ``snapshot``; falls back to the default snapshot."""
        name = snapshot or self.default_snapshot
        if name is None:
            if len(self.snapshots) == 1:
                name = next(iter(self.snapshots))
            else:
                raise ConfigError(
                    f"profile {self.name}", "default_snapshot", "task names no snapshot and the profile has no default"
                )
        if name not in self.snapshots:
            raise ConfigError(
                f"profile {self.name}",
                "snapshots",
                f"no route for snapshot {name!r} (routes: {', '.join(sorted(self.snapshots))})",
            )
        return name, self.snapshots[name]


_POOL_SNAPSHOT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")


class PoolSpec(StrictModel):
    """A persistent pool stack brought up with ``pulumi up``: N units of one snapshot, or N per snapshot.

    ``units: 2`` makes ``u0``, ``u1`` of ``snapshot`` (the profile's default when none);
    ``units: {ubuntu: 2, win: 1}`` makes ``ubuntu-0``, ``ubuntu-1``, ``win-0``. A task leases a unit
    of the snapshot it names.
    """

    units: int | dict[str, int] = Field(description="A count, or a count per snapshot (each 1 to 1000).")
    snapshot: str | None = None
    shape: Shape = Field(default_factory=Shape)

    @field_validator("units")
    @classmethod
    def _counts(cls, units: int | dict[str, int]) -> int | dict[str, int]:
        for count in units.values() if isinstance(units, dict) else [units]:
            if not 1 <= count <= 1000:
                raise ValueError(f"a count of units should be greater than or equal to 1 and at most 1000, not {count}")
        return units

    @model_validator(mode="after")
    def _check(self) -> PoolSpec:
        if isinstance(self.units, dict):
            if not self.units:
                raise ValueError("units per snapshot: name at least one snapshot")
            if self.snapshot is not None:
                raise ValueError("give either 'snapshot' with a count of units, or a count per snapshot")
            bad = [name for name in self.units if not _POOL_SNAPSHOT_RE.match(name)]
            if bad:
                raise ValueError(f"snapshot {bad[0]!r} cannot name pool units: use letters, digits, '_', '.', '-'")
        return self

    def members(self) -> list[tuple[str, str | None]]:
        """(unit name, snapshot) of every unit; the names are stable, so ``pulumi up`` diffs stay small."""
        if isinstance(self.units, int):
            return [(f"u{i}", self.snapshot) for i in range(self.units)]
        return [(f"{snapshot}-{i}", snapshot) for snapshot, count in self.units.items() for i in range(count)]


class LoadedProfile(StrictModel):
    profile: Profile
    source: str = Field(description="File the profile came from (for error messages and records).")
    pool: PoolSpec | None = None


def parse_profile(data: Any, source: str | Path, pool_data: Any = None) -> LoadedProfile:
    """Validate a profile mapping (the value of ``ale-iac:profile``) and its pool's (``ale-iac:pool``); the
    problems of both are reported together."""
    if not isinstance(data, dict):
        raise ConfigError(source, PROFILE_KEY, "must be a mapping")
    problems = Problems()
    profile: Profile | None = None
    pool: PoolSpec | None = None
    with problems.check():
        profile = validate(Profile, data, source, PROFILE_KEY, drop=frozenset(PROVIDER_KINDS))
    if pool_data is not None:
        with problems.check():
            pool = validate(PoolSpec, pool_data, source, POOL_KEY)
    problems.raise_any()
    assert profile is not None  # else raise_any raised its problems
    if pool is not None:
        field = f"{POOL_KEY}.units" if isinstance(pool.units, dict) else f"{POOL_KEY}.snapshot"
        for snapshot in sorted({s for _, s in pool.members() if s is not None}):
            try:
                profile.route(snapshot)
            except ConfigError as exc:
                problems.add(source, field, exc.detail)
        problems.raise_any()
    return LoadedProfile(profile=profile, source=str(source), pool=pool)


def load_profile_file(path: Path) -> LoadedProfile:
    """Read a Pulumi stack config file and validate its ``ale-iac:*`` keys."""
    doc = read_yaml(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("config"), dict):
        raise ConfigError(path, "config", "a stack config file needs a 'config:' mapping")
    config = doc["config"]
    known = (PROFILE_KEY, POOL_KEY)
    unknown = sorted(k for k in config if str(k).startswith(f"{CONFIG_NAMESPACE}:") and k not in known)
    if unknown:
        problems = Problems()
        for key in unknown:
            hint = did_you_mean(key, known, f"{CONFIG_NAMESPACE}:") or f" (known: {', '.join(known)})"
            problems.add(path, f"config.{key}", f"unknown key{hint}")
        problems.raise_any()
    if PROFILE_KEY not in config:
        raise ConfigError(path, f"config.{PROFILE_KEY}", "required key is missing")
    return parse_profile(config[PROFILE_KEY], path, config.get(POOL_KEY))


def stacks_dir() -> Path:
    """The project's ``stacks/`` folder (next to Pulumi.yaml), where shipped profiles live."""
    return project_root() / "stacks"


def resolve_profile(name_or_path: str, named_in: str | Path | None = None) -> LoadedProfile:
    """A profile by stack name (``local`` -> stacks/Pulumi.local.yaml) or by file path.

    ``named_in``: the file that named the profile (an experiment), for the error when there is no such profile.
    """
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists():
        return load_profile_file(candidate)
    for folder in (Path.cwd() / "stacks", stacks_dir()):
        path = folder / f"Pulumi.{name_or_path}.yaml"
        if path.exists():
            return load_profile_file(path)
    known = sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in stacks_dir().glob("Pulumi.*.yaml"))
    raise ConfigError(
        named_in or name_or_path,
        "profile",
        f"no such profile {name_or_path!r}{did_you_mean(name_or_path, known)} (shipped: {', '.join(known)})",
    )
