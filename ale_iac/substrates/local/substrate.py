"""The ``local`` substrate: the image's rootfs run in Linux namespaces on this host (``runtime.py``)."""

from __future__ import annotations

import functools
from dataclasses import asdict
from pathlib import Path
from typing import ClassVar

from pydantic import Field, SecretStr

from ale_iac.contract import POOL_LABEL, UnitOutputs, UnitSpec
from ale_iac.images import require_image
from ale_iac.profile import LocalRoute
from ale_iac.substrates.base import (
    Capability,
    HostCheck,
    HostUnit,
    Leftover,
    Limit,
    LiveEndpoint,
    Substrate,
    UnitInputs,
    UnitLimits,
    UnitState,
)
from ale_iac.substrates.isolation import IsolationProbe
from ale_iac.substrates.local import checkpoint, host, runtime, sandboxes, templates
from ale_iac.substrates.local.isolation import LocalIsolation


class LocalInputs(UnitInputs):
    rootfs: str
    allow_outbound: bool = False
    vcpus: int | None = None
    memory_gb: float | None = None
    disk_gb: int = sandboxes.DEFAULT_DISK_GB
    pids_limit: int = sandboxes.DEFAULT_PIDS_LIMIT
    checkpoint: bool = False
    """The route's ``checkpoint``, for a pool's unit (the only kind that is reset): a checkpoint of its own."""
    template: bool = False
    """The route's ``checkpoint``, for any other unit: it restores a template slot's (``local/templates.py``)."""


class LocalState(UnitState):
    supervisor_pid: int
    state_dir: str
    limits: list[Limit] = Field(default_factory=list)
    gateway_socket: str = ""
    """Only in the state of units made before the model channel went through the endpoint."""
    gateway_url: str = ""


class LocalSubstrate(Substrate[LocalInputs, LocalState, LocalRoute]):
    name: ClassVar[str] = "local"
    resource_type: ClassVar[str] = "LocalSandbox"
    inputs_model: ClassVar[type[UnitInputs]] = LocalInputs
    state_model: ClassVar[type[UnitState]] = LocalState
    folder_output: ClassVar[str] = "state_dir"
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {Capability.HOST_CHANNEL, Capability.RESTORE, Capability.LIMITS}
    )

    def inputs_for(self, unit: UnitSpec, route: LocalRoute, name_prefix: str, labels: dict[str, str]) -> LocalInputs:
        shape = unit.shape.over(route.shape)
        return LocalInputs(
            **self.common_inputs(route, name_prefix, labels),
            rootfs=str(require_image(route.image).rootfs),
            allow_outbound=route.allow_outbound,
            vcpus=shape.vcpus,
            memory_gb=shape.memory_gb,
            disk_gb=shape.disk_gb or sandboxes.DEFAULT_DISK_GB,
            pids_limit=route.pids_limit,
            checkpoint=route.checkpoint and POOL_LABEL in labels,
            template=route.checkpoint and POOL_LABEL not in labels,
        )

    def units_on_image(self, rootfs: Path) -> list[str]:
        target = str(rootfs.resolve())
        return [
            state.sandbox_id
            for state in sandboxes.list_sandboxes()
            if sandboxes.is_alive(state) and str(Path(state.rootfs).resolve()) == target
        ]

    def create(self, sandbox_id: str, inputs: LocalInputs) -> LocalState:
        spec = sandboxes.LocalSandboxSpec(
            sandbox_id=sandbox_id,
            rootfs=inputs.rootfs,
            screen_width=inputs.screen_width,
            screen_height=inputs.screen_height,
            allow_outbound=inputs.allow_outbound,
            vcpus=inputs.vcpus,
            memory_gb=inputs.memory_gb,
            disk_gb=inputs.disk_gb,
            pids_limit=inputs.pids_limit,
            checkpoint=inputs.checkpoint or inputs.template,
            template=inputs.template,
            labels=dict(inputs.labels),
        )
        state = runtime.start(spec)
        return LocalState(
            sandbox_id=state.sandbox_id,
            endpoint=state.endpoint,
            endpoint_token=sandboxes.auth_token(state),
            host_port=state.host_port,
            supervisor_pid=state.supervisor_pid,
            state_dir=state.state_dir,
            limits=[Limit(**asdict(record)) for record in state.limits],
            gateway_url=state.gateway_url,
        )

    def exists(self, sandbox_id: str, home: Path | None) -> bool:
        # A dead sandbox whose state dir remains still exists: destroy cleans it up.
        return sandboxes.load_state(sandbox_id, home=home) is not None

    def destroy(self, sandbox_id: str, home: Path | None) -> None:
        runtime.stop(sandbox_id, home=home)

    def reset(self, sandbox_id: str) -> None:
        runtime.reset(sandbox_id)

    def current(self, unit: UnitOutputs) -> LiveEndpoint | None:
        state = sandboxes.load_state(unit.resource_id)
        if state is None:
            return None
        return LiveEndpoint(endpoint=state.endpoint, endpoint_token=SecretStr(sandboxes.auth_token(state)))

    def units(self) -> list[HostUnit]:
        return [HostUnit(state.sandbox_id, state.labels.get("stack")) for state in sandboxes.list_sandboxes()]

    def leftovers(self) -> list[Leftover]:
        """Template slots no unit holds that are of no further use (``templates.leftovers``)."""
        return [
            Leftover("folder", str(slot), f"local template slot {slot}", functools.partial(templates.remove, slot))
            for slot in templates.leftovers(templates.templates_dir(sandboxes.home_dir().resolve()))
        ]

    def limits(self, unit: UnitOutputs) -> UnitLimits | None:
        state = sandboxes.load_state(unit.resource_id)
        if state is None:
            return None
        limits = [Limit(**asdict(record)) for record in state.limits]
        return UnitLimits(limits=limits, oom_kills=sandboxes.oom_kills(state))

    def log_tails(self, unit: UnitOutputs) -> str:
        try:
            state = sandboxes.load_state(unit.resource_id)
        except sandboxes.SandboxError:
            return ""
        return sandboxes.log_tails(state) if state is not None else ""

    def host_checks(self) -> list[HostCheck]:
        # The very list the runtime enforces; a limit the host lacks is recorded, not refused.
        return [
            HostCheck(
                name=check.name,
                ok=check.ok,
                detail=check.detail
                if check.ok
                else f"{check.detail} ({check.fix})"
                if check.required
                else f"{check.detail} (not applied; to change: {check.fix})",
                required=check.required,
            )
            for check in host.host_checks()
        ] + [self._checkpoint_check()]

    @staticmethod
    def _checkpoint_check() -> HostCheck:
        """CRIU, for routes with ``checkpoint: true`` only (not among what every start enforces: it runs
        ``criu check``)."""
        ok, detail = checkpoint.criu_status()
        return HostCheck(
            name="criu (checkpoint: true)",
            ok=ok,
            detail=detail if ok else f"{detail} (only routes with checkpoint: true need it)",
            required=False,
        )

    def isolation_probe(self, state: object, owner: int = 0) -> IsolationProbe:
        assert isinstance(state, sandboxes.LocalSandboxState), state
        return LocalIsolation(state, owner)
