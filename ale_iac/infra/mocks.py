"""Pulumi mocks that record what a program declares: for tests, ``ale-iac plan`` and the bench.

Rules that keep mocks honest are built in:

* :class:`RecordingMocks` records ``(type, name, inputs)`` of every registration and **raises on a
  repeated (type, name)**, which the real engine rejects as a duplicate URN but plain mocks accept;
* :func:`install` always uses ``preview=False`` (in preview, unknown outputs skip ``apply`` and
  assertions inside it never run);
* it installs :class:`RecordingMonitor`, which also records what ``MockResourceArgs`` lacks: the
  parent, the provider and ``ignore_changes`` of each resource.

Outputs are the inputs plus a few computed properties the handles read (instance IPs). Ids are
``<name>-id`` and IPs are derived from the resource name, so two runs of a program give the same
values: the plan stays stable. With ``symbolic_addresses`` the IPs are placeholders such as
``<natIP>``, which is what a plan shows to reviewers.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi.runtime.mocks import MockCallArgs, MockMonitor, MockResourceArgs

from ale_iac.substrates import registry

STACK_TYPE = "pulumi:pulumi:Stack"


class DuplicateResourceError(RuntimeError):
    """Two resources with the same (type, name): the real engine fails with 'Duplicate resource URN'."""


@dataclass(frozen=True)
class RecordedResource:
    """One registration as the engine would see it."""

    type: str
    name: str
    inputs: dict[str, Any]
    custom: bool
    parent: str | None = None
    """Logical name of the parent; None for the stack."""
    provider: str | None = None
    """Logical name of an explicit provider; None for the default provider."""
    ignore_changes: tuple[str, ...] = ()


@dataclass
class _Options:
    parent: str | None = None
    provider: str | None = None
    ignore_changes: tuple[str, ...] = ()


def _name_of_urn(urn: str) -> str | None:
    """``urn:pulumi:<stack>::<project>::<type chain>::<name>`` -> name; the stack -> None."""
    parts = urn.split("::")
    if len(parts) < 4 or parts[2].endswith(STACK_TYPE):
        return None
    return parts[-1]


def _provider_name(ref: str) -> str | None:
    """``urn:...::aws-us-east-1::<id>`` -> ``aws-us-east-1``; default providers -> None."""
    if not ref:
        return None
    urn = ref.rsplit("::", 1)[0]
    name = urn.rsplit("::", 1)[-1]
    return None if name.startswith("default") else name


def _fake_ip(name: str, public: bool) -> str:
    digest = hashlib.sha256(name.encode()).digest()
    if public:
        return f"203.0.113.{digest[0] % 254 + 1}"
    return f"10.{digest[0]}.{digest[1]}.{digest[2] % 254 + 1}"


@dataclass
class RecordingMocks(pulumi.runtime.Mocks):
    """Records registrations; raises on a duplicate (type, name)."""

    symbolic_addresses: bool = False
    resources: list[RecordedResource] = field(default_factory=list)
    _seen: set[tuple[str, str]] = field(default_factory=set)
    _options: dict[tuple[str, str], _Options] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ---- the Mocks interface -------------------------------------------------------------------

    def new_resource(self, args: MockResourceArgs) -> tuple[str | None, dict[str, Any]]:
        key = (args.typ, args.name)
        with self._lock:
            if key in self._seen:
                raise DuplicateResourceError(
                    f"duplicate resource {args.typ} {args.name!r}: the engine would fail with 'Duplicate resource URN'"
                )
            self._seen.add(key)
            opts = self._options.pop(key, _Options())
            self.resources.append(
                RecordedResource(
                    type=args.typ,
                    name=args.name,
                    inputs=dict(args.inputs),
                    custom=bool(args.custom),
                    parent=opts.parent,
                    provider=opts.provider or _provider_name(args.provider or ""),
                    ignore_changes=opts.ignore_changes,
                )
            )
        outputs = dict(args.inputs)
        add_computed(self, args.typ, args.name, outputs)
        return f"{args.name}-id", outputs

    def call(self, args: MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
        raise NotImplementedError(f"ale-iac programs make no provider calls; got {args.token}")

    # ---- helpers for tests and plans -----------------------------------------------------------

    def note_options(self, typ: str, name: str, opts: _Options) -> None:
        with self._lock:
            self._options[(typ, name)] = opts

    def address(self, name: str, prop: str, public: bool) -> str:
        return f"<{prop}>" if self.symbolic_addresses else _fake_ip(name, public)

    def of_type(self, typ: str) -> list[RecordedResource]:
        return [r for r in self.resources if r.type == typ]

    def one(self, typ: str, name: str | None = None) -> RecordedResource:
        """The single recorded resource of ``typ`` (and ``name``); AssertionError otherwise."""
        found = [r for r in self.resources if r.type == typ and (name is None or r.name == name)]
        if len(found) != 1:
            seen = sorted(f"{r.type} {r.name}" for r in self.resources)
            raise AssertionError(f"expected one {typ} {name or ''}, found {len(found)}; recorded: {seen}")
        return found[0]

    def children_of(self, parent: str) -> list[RecordedResource]:
        return [r for r in self.resources if r.parent == parent]


class RecordingMonitor(MockMonitor):
    """A MockMonitor that tells the mocks each resource's parent, provider and ignore_changes."""

    def __init__(self, mocks: RecordingMocks) -> None:
        super().__init__(mocks)
        self._recording = mocks

    def RegisterResource(self, request: Any) -> Any:  # noqa: N802 (gRPC method name)
        if request.type != STACK_TYPE:
            self._recording.note_options(
                request.type,
                request.name,
                _Options(
                    parent=_name_of_urn(request.parent),
                    provider=_provider_name(request.provider),
                    ignore_changes=tuple(request.ignoreChanges),
                ),
            )
        return super().RegisterResource(request)  # type: ignore[no-untyped-call]


def install(mocks: RecordingMocks, project: str = "ale-iac", stack: str = "test") -> RecordingMocks:
    """Make ``mocks`` the process's Pulumi mocks (preview=False, recording monitor)."""
    # set_mocks and @pulumi.runtime.test use the thread's current event loop. An earlier
    # asyncio.run() in the same process (the runner, the bridges' tests) leaves none set, and then
    # set_mocks fails with "There is no current event loop"; give the thread a fresh one.
    try:
        asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        asyncio.set_event_loop(asyncio.new_event_loop())
    pulumi.runtime.set_mocks(mocks, project=project, stack=stack, preview=False, monitor=RecordingMonitor(mocks))
    return mocks


def run_program(
    program: Callable[[], Any], mocks: RecordingMocks, project: str = "ale-iac", stack: str = "test"
) -> Any:
    """Run ``program`` to completion under ``mocks`` (outside pytest) and return its resolved value.

    Same mechanism as ``@pulumi.runtime.test``: every Output the program returns is awaited, so
    failures inside ``apply`` surface here.

    The cyclic garbage collector is paused for the run. Almost everything a program allocates
    (resources, Outputs, recorded inputs) stays alive until it ends, so each full collection only
    re-traverses a growing heap: with the collector on, 400 units cost ~1.8x more CPU per unit
    than 100; paused, the cost per unit is flat (bench/bench_plan.py).
    """
    install(mocks, project=project, stack=stack)
    result: dict[str, Any] = {}

    def wrapped() -> pulumi.Output[Any]:
        return pulumi.Output.from_input(program()).apply(lambda value: result.setdefault("value", value))

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        pulumi.runtime.test(wrapped)()  # type: ignore[no-untyped-call]
    finally:
        if was_enabled:
            gc.enable()
    return result.get("value")


# ---- computed outputs per resource type ------------------------------------------------------


def _gce(mocks: RecordingMocks, name: str, outputs: dict[str, Any]) -> None:
    interfaces = []
    for declared in outputs.get("networkInterfaces") or []:
        nic = dict(declared)
        nic["networkIp"] = mocks.address(name, "networkIP", public=False)
        nic["accessConfigs"] = [
            {**dict(ac), "natIp": mocks.address(name, "natIP", public=True)} for ac in nic.get("accessConfigs") or []
        ]
        interfaces.append(nic)
    outputs["networkInterfaces"] = interfaces
    outputs.setdefault("instanceId", f"{name}-instance-id")


def _ec2(mocks: RecordingMocks, name: str, outputs: dict[str, Any]) -> None:
    outputs["privateIp"] = mocks.address(name, "privateIp", public=False)
    outputs["publicIp"] = (
        mocks.address(name, "publicIp", public=True) if outputs.get("associatePublicIpAddress") else ""
    )


def _ecs(mocks: RecordingMocks, name: str, outputs: dict[str, Any]) -> None:
    outputs["privateIp"] = mocks.address(name, "privateIp", public=False)
    public = (outputs.get("internetMaxBandwidthOut") or 0) > 0
    outputs["publicIp"] = mocks.address(name, "publicIp", public=True) if public else ""


def _host_unit(mocks: RecordingMocks, name: str, outputs: dict[str, Any]) -> None:
    """What a host substrate's create would add (``HostUnitProvider``): the sandbox id and its loopback endpoint,
    and a value of its type for every other output its state model requires (empty, zero, false)."""
    port = 40000 + hashlib.sha256(name.encode()).digest()[0] * 64
    outputs["sandbox_id"] = f"{outputs.get('name_prefix', name)}-mock"
    outputs["host_port"] = port
    outputs["endpoint"] = "<endpoint>" if mocks.symbolic_addresses else f"http://127.0.0.1:{port}"
    outputs["endpoint_token"] = "<token>" if mocks.symbolic_addresses else f"mock-token-{name}-0123456789"
    state_model = registry.get(str(outputs["substrate"])).state_model
    for key, info in state_model.model_fields.items():
        if outputs.get(key) is None and info.is_required():
            outputs[key] = info.annotation() if isinstance(info.annotation, type) else None


def _endpoint_token(mocks: RecordingMocks, name: str, outputs: dict[str, Any]) -> None:
    """What ``EndpointTokenProvider.create`` would make: a token (a placeholder; never a real one)."""
    outputs["token"] = "<token>" if mocks.symbolic_addresses else f"mock-token-{name}-0123456789"


def _gce_image(mocks: RecordingMocks, name: str, outputs: dict[str, Any]) -> None:
    del mocks, name
    outputs["selfLink"] = f"projects/{outputs.get('project')}/global/images/{outputs.get('name')}"


_COMPUTED: dict[str, Callable[[RecordingMocks, str, dict[str, Any]], None]] = {
    "gcp:compute/image:Image": _gce_image,
    "gcp:compute/instance:Instance": _gce,
    "gcp:compute/instanceFromMachineImage:InstanceFromMachineImage": _gce,
    "aws:ec2/instance:Instance": _ec2,
    "alicloud:ecs/instance:Instance": _ecs,
    **{f"pulumi-python:dynamic/ale:{registry.get(kind).resource_type}": _host_unit for kind in registry.names()},
    "pulumi-python:dynamic/ale:EndpointToken": _endpoint_token,
}


def add_computed(mocks: RecordingMocks, typ: str, name: str, outputs: dict[str, Any]) -> None:
    """Add to ``outputs`` (a resource's inputs) what a provider computes for a resource of ``typ`` named ``name``:
    instance addresses, a host unit's sandbox id and endpoint, ... (nothing for other types)."""
    computed = _COMPUTED.get(typ)
    if computed is not None:
        computed(mocks, name, outputs)
