"""The substrate contract: what every host substrate provides, whole, so that no code outside
``ale_iac/substrates/`` needs to know which one a unit runs on.

A *substrate* is a kind of sandbox this host runs itself (``local`` namespaces, ``docker`` containers, ``qemu``
guests), as opposed to a remote endpoint that a cloud provider or a static address gives (those are *providers*
only: their units are reached over their endpoint and nothing else). A substrate is one folder,
``ale_iac/substrates/<name>/``, whose ``substrate.py`` subclasses :class:`Substrate`, and one line in
:data:`ale_iac.substrates.registry.SUBSTRATES`. The registry answers every question the rest of the code has:

* **declaring** (``ale_iac.infra.host_units``, one Pulumi dynamic resource for every substrate): the typed
  resource inputs made from a route (:meth:`Substrate.inputs_for`), the typed outputs a created unit has
  (:attr:`Substrate.state_model`), and the handle the stack exports (:meth:`Substrate.outputs_for`);
* **images**: what the route's image needs before a unit can start (:meth:`Substrate.prepare_images`);
* **lifecycle**: create, exists, destroy, reset (restore under the same id), current (its live endpoint);
* **the host's view**: its units for ``gc`` (:meth:`Substrate.units`, :meth:`Substrate.leftovers`), limits as
  applied, log tails for a unit that is not ready, ``doctor`` checks, and the probe the inside-out isolation
  suite drives (:meth:`Substrate.isolation_probe`, ``ale_iac/substrates/isolation.py``);
* **capabilities** a substrate may lack, said in its type (:attr:`Substrate.capabilities`): bulk transport
  (:attr:`Substrate.transport`), the model channel for an in-sandbox agent (its endpoint's forwarder serves
  the agent's model URL in the unit and carries it back over connections this host opens: the handle's
  ``gateway_channel``, :meth:`Substrate.model_channel`), restore.
  :func:`require` refuses clearly, naming the substrate and the capability.

Resource inputs and outputs are pydantic models with the Pulumi property names as fields: the declaration
and the driver share one definition and its defaults, and a stack made before keeps its properties.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, SecretStr

from ale_iac.contract import LINUX_DESKTOP_PATHS, HostChannel, UnitOutputs, UnitSpec, forwarder_channel
from ale_iac.errors import AleIacError
from ale_iac.images import require_image
from ale_iac.profile import HostRoute
from ale_iac.substrates.isolation import IsolationProbe

LogFn = Callable[[str], None]


class Capability(enum.Enum):
    """What a substrate may provide beyond the lifecycle every substrate has."""

    BULK_TRANSPORT = "bulk transport (folders in and out faster than the endpoint's file commands)"
    HOST_CHANNEL = "host channel (the model channel: an in-unit agent's model URL carried back to this host)"
    RESTORE = "restore (a fresh unit under the same id, for pool leases)"
    LIMITS = "limits as applied (what the unit was limited to, read back at the end of a unit)"


class MissingCapabilityError(AleIacError):
    """A substrate was asked for a capability it does not provide."""


class Limit(BaseModel):
    """One limit a unit asked for, and whether (and how) the substrate applied it."""

    name: str
    requested: Any = None
    applied: Any = None
    detail: str = ""


class UnitInputs(BaseModel):
    """The inputs every host substrate's unit resource has; a change to any input replaces the unit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name_prefix: str
    image: str
    """The image's ref (``<name>-<hash12>``): a rebuilt recipe replaces the unit."""
    screen_width: int = 1280
    screen_height: int = 800
    labels: dict[str, str] = {}


class UnitState(BaseModel):
    """The outputs every host substrate's unit resource has once created."""

    model_config = ConfigDict(extra="forbid")

    sandbox_id: str
    endpoint: str
    endpoint_token: str
    host_port: int


class LiveEndpoint(BaseModel):
    """Where a unit answers now and with which token (a restored unit has new ones)."""

    endpoint: str
    endpoint_token: SecretStr
    container_id: str | None = None


@dataclass(frozen=True)
class HostUnit:
    """A unit this host runs, as ``gc`` sees it: its id and the stack it says it belongs to."""

    sandbox_id: str
    stack: str | None


@dataclass(frozen=True)
class Leftover:
    """Something a substrate made that belongs to no unit any more (a runner container whose unit folder is
    gone, the folder of a killed boot), and how to remove it."""

    kind: str
    """``container`` or ``folder``: which list of ``gc``'s report it goes to."""
    name: str
    what: str
    remove: Callable[[], object]


@dataclass(frozen=True)
class HostCheck:
    """One fact ``ale-iac doctor`` prints about what this host has for a substrate."""

    name: str
    ok: bool
    detail: str
    required: bool = False
    """Whether the substrate cannot run without it (``doctor`` exits 1 for the ``local`` profile's)."""


@dataclass(frozen=True)
class UnitLimits:
    """What a unit was limited to, and how many of its processes its memory limit killed (when known)."""

    limits: list[Limit]
    oom_kills: int | None = None


class CommandOutcome(Protocol):
    """What a command run in a unit answers (``ale_iac.sandbox.protocol.CommandResult``)."""

    @property
    def exit_code(self) -> int: ...

    @property
    def stderr(self) -> str: ...


class UnitShell(Protocol):
    """Runs a command in a unit (``ale_iac.sandbox.client.ComputerServerClient``): what a transport may need of
    the unit's endpoint besides its own channel."""

    async def run_command(self, command: str, timeout: float | None = None) -> CommandOutcome: ...


class BulkTransport(Protocol):
    """Moves folders into and out of a unit by a way faster than one endpoint request per file."""

    def reaches(self, unit: UnitOutputs, remote: str) -> bool:
        """Whether this transport can move ``remote`` of ``unit`` from this host."""
        ...

    async def upload(self, unit: UnitOutputs, shell: UnitShell, local: Path, remote: str) -> int:
        """Copy a host folder into ``remote``; returns the number of files."""
        ...

    async def download(self, unit: UnitOutputs, shell: UnitShell, remote: str, local: Path) -> int:
        """Copy ``remote``'s regular files into a host folder; returns the number of files."""
        ...


InputsT = TypeVar("InputsT", bound=UnitInputs)
StateT = TypeVar("StateT", bound=UnitState)
RouteT = TypeVar("RouteT", bound=HostRoute)


class Substrate(ABC, Generic[InputsT, StateT, RouteT]):
    """One host substrate, whole. Stateless: every method takes what it needs (instances are shared)."""

    name: ClassVar[str]
    """The provider kind of its routes and units (``UnitOutputs.provider``)."""
    resource_type: ClassVar[str]
    """Its Pulumi resource's type name (``pulumi-python:dynamic/ale:<resource_type>``)."""
    inputs_model: ClassVar[type[UnitInputs]]
    state_model: ClassVar[type[UnitState]]
    folder_output: ClassVar[str]
    """The output naming the unit's folder on this host (``<home>/<kind>/<id>``): a later destroy finds the
    unit in the home it was made in, whatever ``ALE_IAC_HOME`` its process has."""
    capabilities: ClassVar[frozenset[Capability]] = frozenset()
    transport: ClassVar[BulkTransport | None] = None
    """Its bulk transport when it has :attr:`Capability.BULK_TRANSPORT`."""
    image_exports: ClassVar[tuple[str, ...]] = ()
    """The image exports it makes beyond the rootfs (``ale-iac images build --export <one>``): the one it
    needs itself first, then any it makes for others (qemu: ``qcow2``, then the cloud disks)."""

    # --- declaring ------------------------------------------------------------------------------------

    @abstractmethod
    def inputs_for(self, unit: UnitSpec, route: RouteT, name_prefix: str, labels: dict[str, str]) -> InputsT:
        """The unit's resource inputs from its request and its route."""

    @staticmethod
    def common_inputs(route: HostRoute, name_prefix: str, labels: dict[str, str]) -> dict[str, Any]:
        """The :class:`UnitInputs` every substrate's inputs start from (the image must be built)."""
        return {
            "name_prefix": name_prefix,
            "image": require_image(route.image).ref,
            "screen_width": route.screen_width,
            "screen_height": route.screen_height,
            "labels": labels,
        }

    def outputs_for(
        self, unit: UnitSpec, snapshot: str, route: RouteT, inputs: InputsT, state: StateT, urn: str
    ) -> UnitOutputs:
        """The handle the stack exports for a created unit."""
        return UnitOutputs(
            unit=unit.name,
            provider=self.name,
            endpoint=state.endpoint,
            endpoint_token=SecretStr(state.endpoint_token),
            os="linux",
            snapshot=snapshot,
            image=inputs.image,
            resource_id=state.sandbox_id,
            labels=inputs.labels,
            paths=LINUX_DESKTOP_PATHS,
            managed=True,
            reset=route.reset,
            reset_urns=[urn],
            root_urn=urn,
            egress=route.egress.model_dump(mode="json") if route.egress is not None else None,
            gateway_channel=self.model_channel(),
            **self.extra_outputs(state),
        )

    def model_channel(self) -> HostChannel | None:
        """Where an in-unit agent finds its model (:attr:`Capability.HOST_CHANNEL`): the port the unit's
        forwarder serves the model channel on; None without the capability."""
        if Capability.HOST_CHANNEL not in self.capabilities:
            return None
        return forwarder_channel()

    def extra_outputs(self, state: StateT) -> dict[str, Any]:
        """What this substrate's handles carry beyond the common fields (transport, expiry)."""
        del state
        return {}

    # --- images ---------------------------------------------------------------------------------------

    def prepare_images(self, routes: Sequence[RouteT], log: LogFn | None) -> None:
        """Make (or find in the cache) what ``routes`` need beyond their images' rootfs (which the caller
        builds) before a unit starts, with progress on ``log``."""
        del routes, log

    def export_image(self, name: str, target: str, log: LogFn | None) -> str:
        """Make the export ``target`` (one of :attr:`image_exports`) of the built image ``name``; returns where
        it is (a path, a tag)."""
        del name, target, log
        raise MissingCapabilityError(f"the {self.name} substrate has no image export")

    def units_on_image(self, rootfs: Path) -> list[str]:
        """Ids of live units whose root is ``rootfs`` (a forced rebuild must not change it under them)."""
        del rootfs
        return []

    # --- lifecycle ------------------------------------------------------------------------------------

    @abstractmethod
    def create(self, sandbox_id: str, inputs: InputsT) -> StateT:
        """Start a unit; returns once its endpoint is bound."""

    @abstractmethod
    def exists(self, sandbox_id: str, home: Path | None) -> bool:
        """Whether anything of the unit is left to destroy (a stopped unit still exists)."""

    @abstractmethod
    def destroy(self, sandbox_id: str, home: Path | None) -> None:
        """Stop the unit and remove everything it had; nothing to do for one that is gone."""

    def reset(self, sandbox_id: str) -> None:
        """Replace the unit by a fresh one of the same spec under the same id (:attr:`Capability.RESTORE`)."""
        del sandbox_id
        raise MissingCapabilityError(missing(self.name, Capability.RESTORE))

    @abstractmethod
    def current(self, unit: UnitOutputs) -> LiveEndpoint | None:
        """Where the unit answers now, when that differs from what its stack recorded (after a restore);
        None when the stack's values still hold or the unit is gone."""

    # --- the host's view --------------------------------------------------------------------------------

    @abstractmethod
    def units(self) -> list[HostUnit]:
        """This home's units on this host (running or not), for ``gc`` and ``sandbox ls``."""

    def leftovers(self) -> list[Leftover]:
        """What the substrate made that no unit owns any more (``gc`` removes it)."""
        return []

    def limits(self, unit: UnitOutputs) -> UnitLimits | None:
        """What the unit was limited to (:attr:`Capability.LIMITS`); None when not known."""
        del unit
        return None

    def log_tails(self, unit: UnitOutputs) -> str:
        """The tails of the unit's own logs on this host, for a unit that did not become ready."""
        del unit
        return ""

    @abstractmethod
    def host_checks(self) -> list[HostCheck]:
        """What this host has for the substrate (``ale-iac doctor``)."""

    @abstractmethod
    def isolation_probe(self, state: object, owner: int = 0) -> IsolationProbe:
        """The inside-out isolation suite's view of a started unit from the host (``state``: what the
        substrate's driver returned when it started it; ``owner``: the host user that started it)."""

    def home_of(self, outputs: dict[str, Any]) -> Path | None:
        """The ale-iac home a unit was created in, from the folder its outputs recorded."""
        folder = outputs.get(self.folder_output)
        return Path(str(folder)).parent.parent if folder else None


def missing(substrate: str, capability: Capability) -> str:
    """The sentence of a refusal: which substrate lacks which capability."""
    return f"the {substrate} substrate does not provide {capability.value}"


def require(substrate: Substrate[Any, Any, Any], capability: Capability, why: str = "") -> None:
    """Refuse, naming the substrate and the capability (and what needed it), unless the substrate has it."""
    if capability not in substrate.capabilities:
        raise MissingCapabilityError(missing(substrate.name, capability) + (f": {why}" if why else ""))
