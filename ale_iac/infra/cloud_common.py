"""What the three cloud modules share: names, labels, expiry, startup scripts, the unit handle.

Nothing here imports a cloud SDK. ``pulumi`` itself is imported lazily inside the functions that
build Outputs, so the label and script helpers can be used (and tested) without it.

Labels
    Every resource that can carry labels/tags gets the same set (keys in :data:`LABEL_KEYS`); the
    values are cleaned to the strictest charset of the three clouds (GCE: lowercase letters, digits,
    ``_`` and ``-``, at most 63 characters; Alibaba: no value may start with ``aliyun``), so a
    garbage collector can read the same values from any cloud.

Expiry
    ``ale-expiry`` holds the deploy time plus the route's ``ttl_hours`` as ``YYYYMMDDtHHMMz``
    (minute precision; no ``:`` or uppercase, which GCE labels refuse). The clock is a context
    variable so plans and tests can fix it (:func:`use_clock`). Each cloud module lists the expiry
    fields in ``ignore_changes``: a later ``pulumi up`` of a pool does not push the expiry forward,
    and the exported ``expires_at`` is read back from the resource's labels (state), not recomputed.
"""

from __future__ import annotations

import hashlib
import re
import types
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ale_iac import clock
from ale_iac.contract import SandboxPaths, UnitOutputs, forwarder_channel
from ale_iac.contract import paths_for as contract_paths_for

if TYPE_CHECKING:
    import pulumi

    from ale_iac.cloud_routes import CloudRouteBase
    from ale_iac.contract import UnitSpec
from ale_iac.infra import DeclareContext

LABEL_RUN = "ale-run"
LABEL_UNIT = "ale-unit"
LABEL_STACK = "ale-stack"
LABEL_EXPIRY = "ale-expiry"
LABEL_PROFILE = "ale-profile"
LABEL_SNAPSHOT = "ale-snapshot"
LABEL_MANAGED_BY = "managed-by"
LABEL_EGRESS = "ale-egress"
"""What the unit's route lets its VM reach: ``none``, ``proxy`` (an egress policy, through the runner's proxy; the
VM itself reaches nothing) or ``all`` (``allow_outbound``). The policy pack's ``ale-egress-walled`` reads it."""
LABEL_KEYS = (LABEL_RUN, LABEL_UNIT, LABEL_STACK, LABEL_EXPIRY)
"""The labels every VM must carry (the policy pack checks these four)."""
MANAGED_BY = "ale-iac"

_LABEL_MAX = 63
_LABEL_BAD = re.compile(r"[^a-z0-9_-]+")
EXPIRY_FORMAT = "%Y%m%dt%H%Mz"


# --------------------------------------------------------------------------------------------- names


def digest(text: str, length: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def label_value(text: str) -> str:
    """``text`` as a value every cloud accepts: [a-z0-9_-], <= 63 chars, not starting with ``aliyun``.

    A value that had to be shortened ends in a digest of the original, so two long names stay apart.
    """
    value = _LABEL_BAD.sub("-", text.lower())
    if value.startswith("aliyun"):
        value = "v-" + value
    if len(value) > _LABEL_MAX:
        value = f"{value[: _LABEL_MAX - 9]}-{digest(text)}"
    return value


def label_key(text: str) -> str:
    """``text`` as a key every cloud accepts: starts with a letter, [a-z0-9_-], <= 63 chars."""
    key = label_value(text)
    if not key[:1].isalpha() or key.startswith(("aliyun", "acs")):
        key = f"x-{key}"[:_LABEL_MAX]
    return key


def unit_slug(name: str, limit: int = 40) -> str:
    """A logical resource name for a unit that is also a valid GCE/EC2/ECS name prefix.

    Pulumi auto-names physical resources as ``<logical>-<7 hex>``, and GCE names must match
    ``[a-z]([-a-z0-9]*[a-z0-9])?`` within 63 characters, so unit names are cleaned and shortened;
    a name that had to change gets a digest so ``a_b`` and ``a-b`` do not collide.
    """
    slug = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]+", "-", name.lower())).strip("-")
    if not slug[:1].isalpha():
        slug = f"u-{slug}".rstrip("-")
    if slug == name and len(slug) <= limit:
        return slug
    return f"{slug[: limit - 9].rstrip('-')}-{digest(name)}"


# -------------------------------------------------------------------------------------------- expiry

_CLOCK: ContextVar[Callable[[], datetime] | None] = ContextVar("ale_iac_clock", default=None)


@contextmanager
def use_clock(clock: Callable[[], datetime]) -> Iterator[None]:
    """Fix "now" for declarations made inside the block (plans, tests)."""
    token = _CLOCK.set(clock)
    try:
        yield
    finally:
        _CLOCK.reset(token)


def now() -> datetime:
    clock = _CLOCK.get()
    return clock() if clock is not None else datetime.now(UTC)


@dataclass(frozen=True)
class Expiry:
    """When a unit's VM should be gone, in the forms the clouds and the handle need."""

    at: datetime
    ttl_seconds: int

    @property
    def label(self) -> str:
        return self.at.strftime(EXPIRY_FORMAT)

    @property
    def iso(self) -> str:
        return clock.iso_seconds(self.at)


def expiry_for(ttl_hours: float) -> Expiry:
    """Deploy time (per :func:`now`, floored to the minute) plus the TTL."""
    return Expiry(at=clock.expires_at(ttl_hours, now()), ttl_seconds=clock.ttl_seconds(ttl_hours))


def parse_expiry_label(value: str) -> datetime | None:
    """The time an ``ale-expiry`` label value stands for; None when it is not one."""
    try:
        return datetime.strptime(value, EXPIRY_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return None


def expiry_label_to_iso(value: str) -> str | None:
    parsed = parse_expiry_label(value)
    return parsed.strftime("%Y-%m-%dT%H:%M:%SZ") if parsed else None


def is_expired(labels: Mapping[str, str], at: datetime | None = None) -> bool:
    """For ``ale-iac gc``: True when the labels carry an ``ale-expiry`` that has passed."""
    parsed = parse_expiry_label(labels.get(LABEL_EXPIRY, ""))
    return parsed is not None and parsed <= (at or datetime.now(UTC))


# -------------------------------------------------------------------------------------------- labels


def unit_labels(
    unit: UnitSpec, snapshot: str, ctx: DeclareContext, expiry: Expiry, outbound: str = "none"
) -> dict[str, str]:
    """The labels of every resource of a unit. ``unit.labels`` add to them but never override ours.
    ``outbound`` is the route's :attr:`~ale_iac.cloud_routes.CloudRouteBase.outbound` (label ``ale-egress``).

    ``ale-run`` is ``unit.labels["run"]`` when the runner sets it, else the stack name (a pool).
    """
    extra = dict(unit.labels)
    run = extra.pop("run", None) or extra.pop(LABEL_RUN, None) or ctx.stack
    labels = {label_key(k): label_value(v) for k, v in sorted(extra.items())}
    labels.update(
        {
            LABEL_RUN: label_value(run),
            LABEL_UNIT: label_value(unit.name),
            LABEL_STACK: label_value(ctx.stack),
            LABEL_EXPIRY: expiry.label,
            LABEL_PROFILE: label_value(ctx.profile),
            LABEL_SNAPSHOT: label_value(snapshot),
            LABEL_EGRESS: outbound,
            LABEL_MANAGED_BY: MANAGED_BY,
        }
    )
    return labels


def wall_text(route: CloudRouteBase) -> str:
    """The description of a unit's egress walls: why the VM reaches nothing on its own."""
    if route.egress is not None:
        return "no outbound (its egress policy is enforced by the runner's proxy, reached through the endpoint)"
    return "no outbound"


def identity_text(labels: Mapping[str, str]) -> str:
    """A description for resources that cannot carry labels (GCE firewalls, ECS rules).

    Without the expiry, so the text does not change between deploys.
    """
    return f"ale-iac unit={labels[LABEL_UNIT]} stack={labels[LABEL_STACK]} run={labels[LABEL_RUN]}"


def paths_for(route: CloudRouteBase) -> SandboxPaths:
    if route.paths is not None:
        return route.paths
    return contract_paths_for(route.os)


def split_ranges(ranges: list[str]) -> tuple[list[str], list[str]]:
    """(IPv4, IPv6) ranges: GCE firewalls and ECS rules take one family at a time."""
    v6 = [r for r in ranges if ":" in r]
    return [r for r in ranges if ":" not in r], v6


# ---------------------------------------------------------------------------------- startup scripts

_LINUX_HEADER = """\
#!/bin/sh
# ale-iac startup script. Runs as root at boot; idempotent. It makes sure the Cua computer-server
# serves port {port} on all interfaces (the cloud firewall decides who reaches it) and never in
# Cua cloud-auth mode, which any CONTAINER_NAME in the environment would switch on.
set -eu
mkdir -p /var/lib/ale-iac
"""

_LINUX_SERVER = """\
cat > /usr/local/sbin/ale-computer-server <<'ALE_EOF'
#!/bin/sh
unset CONTAINER_NAME
export CUA_TELEMETRY=0 XDG_SESSION_TYPE=x11
if [ -z "${{DISPLAY:-}}" ]; then
  if [ -S /tmp/.X11-unix/X0 ]; then
    export DISPLAY=:0
  else
    Xvfb :99 -screen 0 1280x800x24 -nolisten tcp &
    export DISPLAY=:99
    sleep 2
  fi
fi
exec {python} -m computer_server --host 0.0.0.0 --port {port}
ALE_EOF
chmod 0755 /usr/local/sbin/ale-computer-server
if [ -d /run/systemd/system ]; then
  cat > /etc/systemd/system/ale-computer-server.service <<'ALE_EOF'
[Unit]
Description=Cua computer-server (ale-iac)
After=network-online.target
[Service]
UnsetEnvironment=CONTAINER_NAME
ExecStart=/usr/local/sbin/ale-computer-server
Restart=always
RestartSec=2
[Install]
WantedBy=multi-user.target
ALE_EOF
  systemctl daemon-reload
  systemctl enable ale-computer-server.service
  systemctl restart ale-computer-server.service
else
  pgrep -f 'computer_server --host 0.0.0.0 --port {port}' >/dev/null || \\
    nohup /usr/local/sbin/ale-computer-server >/var/log/ale-computer-server.log 2>&1 &
fi
"""

_LINUX_TTL = """\
# Guest time-to-live: power off at the deadline; the cloud turns that shutdown into a termination
# (instance_initiated_shutdown_behavior = terminate). The deadline is fixed at first boot, so this
# text is the same on every deploy, and ale-ttl.service re-arms it at every boot.
cat > /usr/local/sbin/ale-ttl <<'ALE_EOF'
#!/bin/sh
set -eu
[ -s /var/lib/ale-iac/deadline ] || echo $(( $(date +%s) + {ttl_seconds} )) > /var/lib/ale-iac/deadline
left=$(( ($(cat /var/lib/ale-iac/deadline) - $(date +%s)) / 60 ))
if [ "$left" -lt 1 ]; then exec shutdown -h now "ale-iac time-to-live reached"; fi
exec shutdown -h +"$left" "ale-iac time-to-live reached"
ALE_EOF
chmod 0755 /usr/local/sbin/ale-ttl
if [ -d /run/systemd/system ]; then
  cat > /etc/systemd/system/ale-ttl.service <<'ALE_EOF'
[Unit]
Description=ale-iac time-to-live
[Service]
Type=oneshot
ExecStart=/usr/local/sbin/ale-ttl
[Install]
WantedBy=multi-user.target
ALE_EOF
  systemctl daemon-reload
  systemctl enable ale-ttl.service
fi
/usr/local/sbin/ale-ttl
"""

_WINDOWS_HEADER = """\
# ale-iac startup script (PowerShell, runs as SYSTEM at every boot). It makes sure the Cua
# computer-server serves port {port} and never in Cua cloud-auth mode (CONTAINER_NAME unset).
$ErrorActionPreference = "Stop"
New-Item -ItemType Directory -Force -Path C:\\ProgramData\\ale-iac | Out-Null
"""

_WINDOWS_SERVER = """\
[Environment]::SetEnvironmentVariable("CONTAINER_NAME", $null, "Machine")
Remove-Item Env:CONTAINER_NAME -ErrorAction SilentlyContinue
if (-not (Get-NetFirewallRule -Name ale-computer-server -ErrorAction SilentlyContinue)) {{
  New-NetFirewallRule -Name ale-computer-server -DisplayName "ale-iac computer-server" `
    -Direction Inbound -Protocol TCP -LocalPort {port} -Action Allow | Out-Null
}}
$launcher = "C:\\ProgramData\\ale-iac\\computer-server.cmd"
Set-Content -Path $launcher -Encoding ASCII -Value @(
  "@echo off",
  "set CONTAINER_NAME=",
  "set CUA_TELEMETRY=0",
  '"{python}" -m computer_server --host 0.0.0.0 --port {port}'
)
# GUI automation needs the desktop session, so the server is a logon task of the desktop users
# (the image logs its user on automatically), not a service in session 0.
$action = New-ScheduledTaskAction -Execute $launcher
$trigger = New-ScheduledTaskTrigger -AtLogOn
$principal = New-ScheduledTaskPrincipal -GroupId "BUILTIN\\Users" -RunLevel Highest
Register-ScheduledTask -TaskName ale-computer-server -Action $action -Trigger $trigger `
  -Principal $principal -Force | Out-Null
Start-ScheduledTask -TaskName ale-computer-server
"""

_WINDOWS_TTL = """\
# Guest time-to-live: shut down at the deadline (fixed at first boot, re-armed at every boot);
# the cloud turns that shutdown into a termination.
$deadline = "C:\\ProgramData\\ale-iac\\deadline"
if (-not (Test-Path $deadline)) {{
  [DateTimeOffset]::UtcNow.AddSeconds({ttl_seconds}).ToUnixTimeSeconds() | Set-Content -Path $deadline
}}
$left = [int64](Get-Content -Path $deadline) - [DateTimeOffset]::UtcNow.ToUnixTimeSeconds()
if ($left -lt 60) {{ $left = 60 }}
shutdown.exe /s /t $left /c "ale-iac time-to-live reached" /d p:0:0
"""


def startup_script(route: CloudRouteBase, guest_ttl_seconds: int | None = None) -> str:
    """The boot script for ``route.os``. ``guest_ttl_seconds`` adds the guest shutdown timer (EC2).

    The text depends only on the route (no times, no names), so it is identical on every deploy
    and a change to it is a real change in the plan. The timer is armed *before* the server is
    started: a VM whose server fails to start still goes away; one whose timer failed to arm
    never serves (the script stops there), so the runner's readiness check fails and destroys it.
    """
    python = paths_for(route).python
    if route.os == "windows":
        header, server, ttl = _WINDOWS_HEADER, _WINDOWS_SERVER, _WINDOWS_TTL
    else:
        header, server, ttl = _LINUX_HEADER, _LINUX_SERVER, _LINUX_TTL
    parts = [header.format(port=route.server_port)]
    if guest_ttl_seconds:
        parts.append(ttl.format(ttl_seconds=guest_ttl_seconds))
    parts.append(server.format(port=route.server_port, python=python))
    return "".join(parts)


# ------------------------------------------------------------------------------- per-program state

_PROGRAM_STATE: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def program_state() -> dict[str, Any]:
    """A dict private to the running Pulumi program (keyed by its resource monitor).

    Inline programs of parallel stacks run in one process, and tests run many programs in one
    process, so shared resources (one provider per region) cannot live in a module global.
    """
    from pulumi.runtime.settings import get_monitor

    monitor = get_monitor()
    state = _PROGRAM_STATE.get(monitor)
    if state is None:
        state = {}
        _PROGRAM_STATE[monitor] = state
    return state


def shared_resource(key: str, factory: Callable[[], Any]) -> Any:
    """The program's single instance of a shared resource (e.g. the provider of one region)."""
    state = program_state()
    if key not in state:
        state[key] = factory()
    return state[key]


# ---------------------------------------------------------------------------------------- the handle


def unit_handle(
    *,
    unit: UnitSpec,
    snapshot: str,
    route: CloudRouteBase,
    region: str,
    address: pulumi.Output[Any],
    resource_id: pulumi.Output[Any],
    resource_labels: pulumi.Output[Any],
    labels: Mapping[str, str],
    reset_urn: pulumi.Output[str],
    root_urn: pulumi.Output[str],
    depends_on: Sequence[pulumi.CustomResource] = (),
    token: pulumi.Output[str] | None = None,
) -> pulumi.Output[dict[str, Any]]:
    """The unit's ``UnitOutputs`` dict, validated by the contract model when the values resolve.

    ``expires_at`` comes from the labels in the resource's state (see the module docstring). The
    handle also waits for ``depends_on`` (the unit's firewall rules / security group): an endpoint
    is only usable once the rules that let the runner reach it exist. ``reset_urn`` is the VM's URN:
    what a pool's ``reset: recreate`` replaces (the rules hold no state of a task and stay); ``root_urn`` the unit's
    component's (what removing the unit from a shared stack targets, with its dependents). ``token`` is the
    endpoint's token on ale-iac's own disk (a secret: so is then the whole handle). On that disk the endpoint is
    ale-iac's forwarder, so the handle carries its model channel (and the unit can carry an egress policy).
    """
    import pulumi

    paths = paths_for(route)

    def build(values: list[Any]) -> dict[str, Any]:
        ip, rid, state_labels, urn, secret, root = values[:6]
        final_labels = {str(k): str(v) for k, v in (state_labels or labels).items()}
        expiry = final_labels.get(LABEL_EXPIRY) or labels[LABEL_EXPIRY]
        handle = UnitOutputs(
            unit=unit.name,
            provider=route.provider,  # type: ignore[attr-defined]
            endpoint=f"http://{ip}:{route.endpoint_port}",
            endpoint_token=secret,
            inner_endpoint=f"http://127.0.0.1:{route.server_port}",
            os=route.os,
            snapshot=snapshot,
            image=route.image,
            resource_id=str(rid),
            region=region,
            paths=paths,
            labels=final_labels,
            expires_at=expiry_label_to_iso(expiry) or expiry,
            managed=True,
            reset=route.reset,
            reset_urns=[str(urn)],
            root_urn=str(root),
            gateway_channel=forwarder_channel() if route.guest_agent else None,
            # A pool lease's policy comes from here (runner/egress.leased_policy), as a host substrate's does.
            egress=route.egress.model_dump(mode="json") if route.egress is not None else None,
        )
        return handle.to_output()

    ids = [r.id for r in depends_on]
    return pulumi.Output.all(address, resource_id, resource_labels, reset_urn, token, root_urn, *ids).apply(build)


def load_lazy_submodules(*submodules: types.ModuleType) -> None:
    """Load a cloud SDK's submodules now, whole (each cloud module calls it as it is imported).

    The SDKs import their submodules lazily (``pulumi_gcp.compute`` is a module of ``pulumi._utils.lazy_import``,
    a copy of importlib's LazyLoader, until first used), and that loader is not thread-safe: programs declaring
    units at once (a run's units at ``-j 2``, each ``up`` in a thread of the runner) met ``gcp.compute``
    half-loaded, "module 'pulumi_gcp.compute' has no attribute 'Firewall'", in 7 of 8 threads
    (tests/infra/test_cloud_common.py).
    Loaded here, under the cloud module's own import lock, they are whole before any program uses them."""
    for module in submodules:
        # Any attribute but the introspection ones (``__name__``, ``__dict__``, ...) runs the lazy module's load;
        # this one does not exist, so it loads the module and returns the default.
        getattr(module, "_ale_iac_load_probe", None)
