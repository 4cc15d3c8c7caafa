"""Environment profiles: which provider and image serve each logical snapshot, with what shape.

A profile lives in a Pulumi stack config file (``stacks/Pulumi.<name>.yaml``) under the key
``ale-iac:profile``; a pool stack adds ``ale-iac:pool``. The same models are read by the inline
program of ``ale-iac evaluate`` and by ``Pulumi.yaml``'s program, so both declare identical units.

Everything is strict: an unknown key is an error naming the key and the file.
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ale_iac.cloud_routes import AliyunRoute, AwsRoute, GcloudRoute
from ale_iac.contract import OsName, SandboxPaths
from ale_iac.errors import ConfigError, format_validation_error, yaml_error

CONFIG_NAMESPACE = "ale-iac"
PROFILE_KEY = f"{CONFIG_NAMESPACE}:profile"
POOL_KEY = f"{CONFIG_NAMESPACE}:pool"
PROVIDER_KINDS = frozenset({"local", "static", "gcloud", "aws", "aliyun"})

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CleanupMode(StrEnum):
    """What happens to a unit's sandbox when its run ends."""

    DESTROY = "destroy"
    RETAIN = "retain"
    RETAIN_ON_FAILURE = "retain-on-failure"


class Shape(StrictModel):
    """Resource hints from a task card. Each provider translates what it can and records the rest."""

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


LINUX_DESKTOP_PATHS = SandboxPaths(
    home="/root",
    work_dir_base="/root/.ale",
    task_data_root="/data/tasks",
    python="/usr/bin/python3",
)
"""Path conventions of the ``desktop`` image built from ``images/desktop``."""


class LocalRoute(StrictModel):
    """A sandbox on this host: the image's rootfs run in Linux namespaces (bubblewrap)."""

    provider: Literal["local"]
    image: str = Field(default="desktop", description="Image recipe name under images/.")
    screen_width: int = Field(default=1280, ge=320, le=7680)
    screen_height: int = Field(default=800, ge=240, le=4320)
    allow_outbound: bool = Field(default=False, description="Give the sandbox outbound network.")
    pids_limit: int = Field(
        default=4096, ge=64, le=4_194_304, description="Most tasks (processes and threads) alive in a sandbox at once."
    )
    shape: Shape = Field(default_factory=Shape, description="Default shape when a task gives none.")


class StaticRoute(StrictModel):
    """Existing computer-server endpoints. ale-iac attaches to them and never destroys them."""

    provider: Literal["static"]
    endpoints: list[str] = Field(min_length=1, description="One computer-server URL per unit.")
    image: str = Field(default="static", description="Label for records; nothing is provisioned.")
    os: OsName = "linux"
    paths: SandboxPaths = LINUX_DESKTOP_PATHS

    @model_validator(mode="after")
    def _check_endpoints(self) -> StaticRoute:
        for endpoint in self.endpoints:
            if not re.match(r"^https?://[^/\s]+(:\d+)?/?$", endpoint):
                raise ValueError(f"endpoint {endpoint!r} is not a base URL like http://127.0.0.1:8000")
        return self


Route = Annotated[
    LocalRoute | StaticRoute | GcloudRoute | AwsRoute | AliyunRoute,
    Field(discriminator="provider"),
]


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

    def route(
        self, snapshot: str | None
    ) -> tuple[str, LocalRoute | StaticRoute | GcloudRoute | AwsRoute | AliyunRoute]:
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

    def providers(self) -> set[str]:
        return {route.provider for route in self.snapshots.values()}


class PoolSpec(StrictModel):
    """A persistent pool stack: N units of one snapshot, brought up with ``pulumi up``."""

    units: int = Field(ge=1, le=1000)
    snapshot: str | None = None
    shape: Shape = Field(default_factory=Shape)


class LoadedProfile(StrictModel):
    profile: Profile
    source: str = Field(description="File the profile came from (for error messages and records).")
    pool: PoolSpec | None = None


def parse_profile(data: Any, source: str | Path, pool_data: Any = None) -> LoadedProfile:
    """Validate a profile mapping (the value of ``ale-iac:profile``)."""
    if not isinstance(data, dict):
        raise ConfigError(source, PROFILE_KEY, "must be a mapping")
    try:
        profile = Profile.model_validate(data)
    except ValidationError as exc:
        raise format_validation_error(source, exc, PROFILE_KEY, drop=PROVIDER_KINDS) from None
    pool = None
    if pool_data is not None:
        try:
            pool = PoolSpec.model_validate(pool_data)
        except ValidationError as exc:
            raise format_validation_error(source, exc, POOL_KEY) from None
        if pool.snapshot is not None:
            try:
                profile.route(pool.snapshot)
            except ConfigError as exc:
                raise ConfigError(source, f"{POOL_KEY}.snapshot", exc.detail) from None
    return LoadedProfile(profile=profile, source=str(source), pool=pool)


def load_profile_file(path: Path) -> LoadedProfile:
    """Read a Pulumi stack config file and validate its ``ale-iac:*`` keys."""
    try:
        doc = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(path, "", "file not found") from None
    except yaml.YAMLError as exc:
        raise yaml_error(path, exc) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("config"), dict):
        raise ConfigError(path, "config", "a stack config file needs a 'config:' mapping")
    config = doc["config"]
    unknown = sorted(
        k for k in config if str(k).startswith(f"{CONFIG_NAMESPACE}:") and k not in (PROFILE_KEY, POOL_KEY)
    )
    if unknown:
        raise ConfigError(path, f"config.{unknown[0]}", f"unknown key (known: {PROFILE_KEY}, {POOL_KEY})")
    if PROFILE_KEY not in config:
        raise ConfigError(path, f"config.{PROFILE_KEY}", "required key is missing")
    return parse_profile(config[PROFILE_KEY], path, config.get(POOL_KEY))


def stacks_dir() -> Path:
    """The project's ``stacks/`` folder (next to Pulumi.yaml), where shipped profiles live."""
    return Path(__file__).resolve().parent.parent / "stacks"


def resolve_profile(name_or_path: str) -> LoadedProfile:
    """A profile by stack name (``local`` -> stacks/Pulumi.local.yaml) or by file path."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists():
        return load_profile_file(candidate)
    for folder in (Path.cwd() / "stacks", stacks_dir()):
        path = folder / f"Pulumi.{name_or_path}.yaml"
        if path.exists():
            return load_profile_file(path)
    known = sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in stacks_dir().glob("Pulumi.*.yaml"))
    raise ConfigError(name_or_path, "profile", f"no such profile (shipped: {', '.join(known)})")
