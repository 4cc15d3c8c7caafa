"""``ale-iac plan``: the resource graph a stack's program declares, as stable text for review.

The program is the same :func:`ale_iac.infra.declaration` that ``pulumi up`` and ``ale-iac evaluate``
run, executed under :class:`~ale_iac.infra.mocks.RecordingMocks`: no Pulumi CLI, no provider
plugin, no credentials, no network. Each resource is rendered with its type, logical name,
parent, explicit provider, ``ignore_changes`` and all its inputs (engine names, keys sorted).

Stability, so that a committed plan only changes when the program does:

* the clock is fixed at :data:`PLAN_EPOCH` while declaring, and every time derived from it is
  rendered relative to deploy time (``<deploy+6h>``);
* mock ids are ``<name>-id`` and instance addresses are symbolic (``<natIP>``);
* resources are sorted by name; long texts (startup scripts) are printed once under ``blobs``
  and referenced by digest;
* a secret input (an endpoint token in a VM's metadata, a dynamic provider) shows as ``[secret]``, and so
  does the ``endpoint_token`` of a unit's handle: the plan says what is secret, never its value.

The plan also runs the policy pack's checks (:mod:`ale_iac.infra.policy`) on the recorded inputs.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ale_iac.cloud_routes import find_clear_credentials
from ale_iac.config_files import read_yaml
from ale_iac.contract import UnitSpec
from ale_iac.errors import AleIacError, ConfigError
from ale_iac.infra.cloud_common import EXPIRY_FORMAT, use_clock
from ale_iac.profile import LoadedProfile, egress_of, resolve_profile, stacks_dir

if TYPE_CHECKING:
    from ale_iac.infra.mocks import RecordedResource

PLAN_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
"""The fixed "deploy time" of a plan. Never a real time: the year 2000 marks derived values."""
PROJECT = "ale-iac"
BLOB_MIN_LINES = 4

_EPOCH_LABEL = re.compile(r"2000\d{4}t\d{4}z")
_EPOCH_ISO = re.compile(r"2000-\d\d-\d\dT\d\d:\d\d:\d\dZ")


_PROVIDER_ENV_PREFIXES = ("AWS_", "ALICLOUD_", "ALIBABA_CLOUD_", "GOOGLE_", "CLOUDSDK_", "GCLOUD_")


@contextmanager
def _without_provider_env() -> Iterator[None]:
    """Hide cloud environment variables while rendering.

    Provider constructors copy some of them into their inputs (``ALICLOUD_PROFILE``,
    ``AWS_REGION``...), which would make a plan depend on who renders it, and could print a
    credential into a file meant for a pull request.
    """
    saved = {k: v for k, v in os.environ.items() if k.startswith(_PROVIDER_ENV_PREFIXES)}
    for key in saved:
        del os.environ[key]
    try:
        yield
    finally:
        os.environ.update(saved)


class PlanError(AleIacError):
    """The program could not be rendered (a provider module is missing, a declaration failed)."""


@dataclass(frozen=True)
class Plan:
    stack: str
    text: str
    resource_count: int
    unit_count: int
    violations: int


def stack_name(loaded: LoadedProfile) -> str:
    """``stacks/Pulumi.<stack>.yaml`` -> ``<stack>``; otherwise the profile's name."""
    name = Path(loaded.source).name
    if name.startswith("Pulumi.") and name.endswith((".yaml", ".yml")):
        return name[len("Pulumi.") :].rsplit(".", 1)[0]
    return loaded.profile.name


def stack_units(loaded: LoadedProfile, units: int | None = None) -> list[UnitSpec]:
    """The units a stack's program declares.

    A pool stack: exactly the units of the ``Pulumi.yaml`` program
    (:func:`ale_iac.infra.program.pool_units`), ``units`` overriding the pool's size. Any other
    (ephemeral) profile: ``units`` (default 1) units per snapshot route, named
    ``<snapshot>-000``..., as ``ale-iac evaluate`` declares them for tasks of each snapshot, so the
    plan shows every route.
    """
    from ale_iac.infra.program import pool_units

    profile = loaded.profile
    if units is not None and units < 1:
        raise ConfigError(loaded.source, "units", "must be at least 1")
    if loaded.pool is not None:
        pool = loaded.pool if units is None else loaded.pool.model_copy(update={"units": units})
        return pool_units(pool, stack_name(loaded))
    count = units or 1
    return [UnitSpec(name=f"{snap}-{i:03d}", snapshot=snap) for snap in sorted(profile.snapshots) for i in range(count)]


def _display_source(source: str) -> str:
    path = Path(source)
    try:
        return str(path.resolve().relative_to(stacks_dir().parent))
    except ValueError:
        return path.name


def _check_credentials(loaded: LoadedProfile) -> None:
    path = Path(loaded.source)
    if not path.exists():
        return
    doc = read_yaml(path) or {}
    leaks = find_clear_credentials(doc.get("config") or {})
    if leaks:
        raise ConfigError(
            loaded.source,
            f"config.{leaks[0]}",
            "a credential in clear text; remove it (providers read credentials from the environment) "
            "or set it with `pulumi config set --secret`",
        )


# -------------------------------------------------------------------------------------- rendering


def _relative(delta: timedelta) -> str:
    minutes = round(delta.total_seconds() / 60)
    if minutes % 60 == 0:
        return f"<deploy+{minutes // 60}h>"
    return f"<deploy+{minutes}m>"


def _symbolic_times(text: str) -> str:
    def label(match: re.Match[str]) -> str:
        at = datetime.strptime(match.group(0), EXPIRY_FORMAT).replace(tzinfo=UTC)
        return _relative(at - PLAN_EPOCH)

    def iso(match: re.Match[str]) -> str:
        at = datetime.strptime(match.group(0), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        return _relative(at - PLAN_EPOCH)

    return _EPOCH_ISO.sub(iso, _EPOCH_LABEL.sub(label, text))


SECRET = "[secret]"
_SIG_KEY = "4dabf18193072939515e22adb298388d"
_SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"
"""Pulumi's wire signature of a secret value (``pulumi.runtime.rpc``), as the mocks receive it."""


def _redact_handles(handles: Any) -> Any:
    """The units' handles with each endpoint token replaced by :data:`SECRET`."""
    if not isinstance(handles, Mapping):
        return handles
    return {
        name: {**h, "endpoint_token": SECRET} if isinstance(h, Mapping) and h.get("endpoint_token") else h
        for name, h in handles.items()
    }


class _Renderer:
    def __init__(self) -> None:
        self.blobs: dict[str, str] = {}

    def value(self, value: Any) -> Any:
        if isinstance(value, Mapping) and value.get(_SIG_KEY) == _SECRET_SIG:
            return SECRET
        if isinstance(value, Mapping):
            return {str(k): self.value(value[k]) for k in sorted(value, key=str)}
        if isinstance(value, list | tuple):
            return [self.value(v) for v in value]
        if isinstance(value, float) and value.is_integer():
            return int(value)  # the mock wire (protobuf Struct) turns every number into a float
        if isinstance(value, str):
            value = _symbolic_times(value)
            if value.count("\n") >= BLOB_MIN_LINES:
                digest = hashlib.sha256(value.encode()).hexdigest()[:12]
                self.blobs[digest] = value
                return f"<blob {digest}: {value.count(chr(10))} lines, see blobs>"
        return value


class _Dumper(yaml.SafeDumper):
    pass


def _str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str_representer)


def _dump(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100, allow_unicode=True)


def render(loaded: LoadedProfile, units: int | None = None, stack: str | None = None) -> Plan:
    """Run the stack's program under recording mocks and render what it declared."""
    import pulumi

    from ale_iac.infra.declaration import declare
    from ale_iac.infra.mocks import RecordingMocks, run_program

    _check_credentials(loaded)
    stack = stack or stack_name(loaded)
    specs = stack_units(loaded, units)
    mocks = RecordingMocks(symbolic_addresses=True)

    def program() -> Any:
        return pulumi.Output.from_input(declare(loaded.profile, specs, stack))

    try:
        with use_clock(lambda: PLAN_EPOCH), _without_provider_env():
            handles = run_program(program, mocks, project=PROJECT, stack=stack)
    except AleIacError:
        raise
    except ModuleNotFoundError as exc:
        raise PlanError(f"stack {stack}: cannot import {exc.name} to declare its units ({exc})") from None

    renderer = _Renderer()
    resources, violations, by_type = _resources(mocks.resources, renderer)
    header = _header(loaded, stack, len(specs), len(resources), by_type, violations)
    body: dict[str, Any] = {
        "resources": resources,
        "outputs": {"units": renderer.value(_redact_handles(handles or {}))},
    }
    if renderer.blobs:
        body["blobs"] = {digest: renderer.blobs[digest] for digest in sorted(renderer.blobs)}
    text = "\n".join(header) + "\n\n" + _dump(body)
    return Plan(stack, text, len(resources), len(specs), len(violations))


def _resources(
    recorded: list[RecordedResource], renderer: _Renderer
) -> tuple[list[dict[str, Any]], list[str], dict[str, int]]:
    """Each declared resource as the plan shows it (by name), the policy pack's violations, the count per type."""
    from ale_iac.infra.policy import StackResource, check_resource, check_stack

    resources: list[dict[str, Any]] = []
    violations: list[str] = []
    by_type: dict[str, int] = {}
    for rec in sorted(recorded, key=lambda r: (r.name, r.type)):
        by_type[rec.type] = by_type.get(rec.type, 0) + 1
        entry: dict[str, Any] = {"resource": rec.type, "name": rec.name, "parent": rec.parent or "(stack)"}
        if rec.provider:
            entry["provider"] = rec.provider
        if rec.ignore_changes:
            entry["ignore_changes"] = list(rec.ignore_changes)
        if rec.inputs:
            entry["inputs"] = renderer.value(rec.inputs)
        resources.append(entry)
        violations += [f"{rec.name}: {v.policy}: {v.message}" for v in check_resource(rec.type, rec.inputs)]
    stack = [StackResource(rec.type, rec.name, rec.parent, rec.inputs) for rec in recorded]
    violations += [f"{name}: {v.policy}: {v.message}" for name, v in check_stack(stack)]
    return resources, violations, by_type


def _header(
    loaded: LoadedProfile, stack: str, units: int, resources: int, by_type: dict[str, int], violations: list[str]
) -> list[str]:
    """The plan's comment lines: what it is (and is not), the counts, the policy pack's verdict."""
    header = [
        f"# ale-iac plan of stack `{stack}` (profile {loaded.profile.name}, {_display_source(loaded.source)})",
        "# Rendered by `ale-iac plan` under Pulumi mocks: no cloud account, no provider plugin, no state.",
        "# It is what the program declares, not a diff against a live stack (that is `pulumi preview --diff`).",
        "# Times are relative to deploy time: <deploy+6h> is six hours after `pulumi up`.",
        "# Instance addresses and ids are placeholders the cloud fills in.",
        f"# units: {units}, resources: {resources}",
    ]
    header += [f"#   {count:4d} {typ}" for typ, count in sorted(by_type.items())]
    if violations:
        header.append(f"# policy pack: {len(violations)} violation(s)")
        header += [f"#   {v}" for v in violations]
    else:
        header.append("# policy pack: no violations")
    return header + _egress_lines(loaded)


def _egress_lines(loaded: LoadedProfile) -> list[str]:
    """What each route that reaches any network reaches: everything (``allow_outbound: true``) or its egress
    policy, through the unit's proxy. Routes that reach none (the default) are not listed."""
    lines = [
        f"#   {snapshot} ({route.provider}): {egress_of(route)}"
        for snapshot, route in sorted(loaded.profile.snapshots.items())
        if getattr(route, "allow_outbound", False) or getattr(route, "egress", None) is not None
    ]
    return ["# egress (every other route: none):", *lines] if lines else []


def render_profile(name_or_path: str, units: int | None = None) -> Plan:
    """:func:`render` for a profile given by stack name or file path (as ``--profile`` takes it)."""
    return render(resolve_profile(name_or_path), units)


def shipped_plan_path(stack: str) -> Path:
    """Where the committed plan of a shipped stack lives."""
    return stacks_dir() / "plans" / f"{stack}.txt"


SHIPPED_PLAN_STACKS: Sequence[str] = ("gcloud", "aws", "aliyun", "pool-gcloud", "kubernetes")
"""Stacks whose rendered plans are committed under ``stacks/plans/`` (a test keeps them current)."""
