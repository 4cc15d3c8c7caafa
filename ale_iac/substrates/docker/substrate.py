"""The ``docker`` substrate: a container of the image per unit on the local Docker engine (``runtime.py``).

The image is the recipe's rootfs imported into the engine (``images.ensure_docker_image``:
``ale-iac/<name>:<hash12>``), made by ``create`` if the engine lacks it; nothing is pulled.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, SecretStr

from ale_iac import clock, docker_engine
from ale_iac.contract import UnitOutputs, UnitSpec
from ale_iac.errors import AleIacError
from ale_iac.hostcheck import Check
from ale_iac.images import ensure_docker_image, require_image
from ale_iac.profile import DockerRoute
from ale_iac.substrates.base import (
    BulkTransport,
    Capability,
    HostCheck,
    HostUnit,
    Limit,
    LiveEndpoint,
    Substrate,
    UnitInputs,
    UnitLimits,
    UnitShell,
    UnitState,
)
from ale_iac.substrates.docker import runtime, walls
from ale_iac.substrates.docker.isolation import DockerIsolation
from ale_iac.substrates.isolation import IsolationProbe


class DockerInputs(UnitInputs):
    image_recipe: str
    allow_outbound: bool = False
    vcpus: int | None = None
    memory_gb: float | None = None
    shm_gb: float = runtime.DEFAULT_SHM_GB
    pids_limit: int = runtime.DEFAULT_PIDS_LIMIT
    disk_gb: float = runtime.DEFAULT_DISK_GB
    ttl_hours: float = 24.0


class DockerState(UnitState):
    image_tag: str
    container_id: str
    expires_at: str
    limits: list[Limit] = Field(default_factory=list)


class ArchiveTransport:
    """One streamed tar through the engine's archive API, for paths on the unit's volumes."""

    def reaches(self, unit: UnitOutputs, remote: str) -> bool:
        return bool(unit.container_id) and runtime.archive_reaches(remote)

    async def upload(self, unit: UnitOutputs, shell: UnitShell, local: Path, remote: str) -> int:
        del shell
        assert unit.container_id is not None
        return await asyncio.to_thread(runtime.copy_in, unit.container_id, local, remote)

    async def download(self, unit: UnitOutputs, shell: UnitShell, remote: str, local: Path) -> int:
        del shell
        assert unit.container_id is not None
        return await asyncio.to_thread(runtime.copy_out, unit.container_id, remote, local)


class DockerSubstrate(Substrate[DockerInputs, DockerState, DockerRoute]):
    name: ClassVar[str] = "docker"
    resource_type: ClassVar[str] = "DockerSandbox"
    inputs_model: ClassVar[type[UnitInputs]] = DockerInputs
    state_model: ClassVar[type[UnitState]] = DockerState
    folder_output: ClassVar[str] = ""  # its units live in the engine, not in a home's folder
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {Capability.BULK_TRANSPORT, Capability.HOST_CHANNEL, Capability.RESTORE, Capability.LIMITS}
    )
    transport: ClassVar[BulkTransport | None] = ArchiveTransport()

    def inputs_for(self, unit: UnitSpec, route: DockerRoute, name_prefix: str, labels: dict[str, str]) -> DockerInputs:
        shape = unit.shape.over(route.shape)
        return DockerInputs(
            **self.common_inputs(route, name_prefix, labels),
            image_recipe=route.image,
            allow_outbound=route.allow_outbound,
            vcpus=shape.vcpus,
            memory_gb=shape.memory_gb,
            shm_gb=route.shm_gb,
            pids_limit=route.pids_limit,
            disk_gb=shape.disk_gb or runtime.DEFAULT_DISK_GB,
            ttl_hours=route.ttl_hours,
        )

    def extra_outputs(self, state: DockerState) -> dict[str, Any]:
        return {"expires_at": state.expires_at, "transport": "docker", "container_id": state.container_id}

    def create(self, sandbox_id: str, inputs: DockerInputs) -> DockerState:
        expiry = clock.iso_seconds(clock.expires_at(inputs.ttl_hours))
        tag = ensure_docker_image(inputs.image_recipe)  # exported once per recipe hash, never pulled
        spec = runtime.DockerSandboxSpec(
            sandbox_id=sandbox_id,
            image=tag,
            screen_width=inputs.screen_width,
            screen_height=inputs.screen_height,
            allow_outbound=inputs.allow_outbound,
            vcpus=inputs.vcpus,
            memory_gb=inputs.memory_gb,
            shm_gb=inputs.shm_gb,
            pids_limit=inputs.pids_limit,
            labels=dict(inputs.labels),
            expires_at=expiry,
            disk_gb=inputs.disk_gb,
        )
        state = runtime.start(spec)
        return DockerState(
            sandbox_id=state.sandbox_id,
            endpoint=state.endpoint,
            endpoint_token=state.token,
            host_port=state.host_port,
            image_tag=tag,
            container_id=state.container_id,
            expires_at=expiry,
            limits=[Limit(**asdict(limit)) for limit in state.limits],
        )

    def exists(self, sandbox_id: str, home: Path | None) -> bool:
        # A stopped container still exists: destroy removes it with its network and volumes.
        del home
        return runtime.inspect(sandbox_id) is not None

    def destroy(self, sandbox_id: str, home: Path | None) -> None:
        del home
        runtime.stop(sandbox_id)

    def reset(self, sandbox_id: str) -> None:
        runtime.reset(sandbox_id)

    def current(self, unit: UnitOutputs) -> LiveEndpoint | None:
        from docker.errors import DockerException

        try:
            container = runtime.current(unit.resource_id, known_container=unit.container_id)
        except DockerException:
            return None
        if container is None:
            return None
        return LiveEndpoint(
            endpoint=container.endpoint,
            endpoint_token=SecretStr(container.token),
            container_id=container.container_id,
        )

    def units(self) -> list[HostUnit]:
        """Unit containers, and units left with a network or volumes but no container (a killed create)."""
        try:
            engine = docker_engine.client(timeout=30)
        except AleIacError:
            return []  # no engine: nothing of it to collect
        try:
            stack_label = f"{runtime.LABEL}stack"
            found = {unit.sandbox_id: unit.labels for unit in runtime.list_sandboxes(engine)}
            found.update(runtime.orphan_objects(engine))
            return [HostUnit(sandbox_id, labels.get(stack_label)) for sandbox_id, labels in found.items()]
        finally:
            engine.close()

    def limits(self, unit: UnitOutputs) -> UnitLimits | None:
        limits = runtime.limits_of(unit.resource_id)
        return None if limits is None else UnitLimits(limits=[Limit(**asdict(limit)) for limit in limits])

    def host_checks(self) -> list[HostCheck]:
        """The tools a unit's disk needs; an engine that answers, the host firewall its units rely on, the image
        exported into the engine (made on first use if missing), and what the engine confines units with (its
        user namespace, seccomp, AppArmor, cgroup version)."""
        checks = [_host_check(check) for check in walls.tool_checks()]
        try:
            engine = docker_engine.client(timeout=10)
        except AleIacError as exc:
            return [*checks, HostCheck("engine", False, str(exc))]
        try:
            version, info = engine.version(), engine.info()
            units = len(runtime.list_sandboxes(engine))
            checks.append(
                HostCheck(
                    "engine",
                    True,
                    f"server {version.get('Version')}, {info.get('Driver')}, cgroup v{info.get('CgroupVersion')}, "
                    f"{units} unit container(s) of this home",
                )
            )
            ok, detail = runtime.firewall_status()
            firewall = detail if ok else f"{detail} (added on the first unit create)"
            checks.append(HostCheck("unit firewall", ok, firewall))
            checks.append(_image_check(engine))
            return checks + [_host_check(check) for check in walls.engine_checks(engine)]
        finally:
            engine.close()

    def isolation_probe(self, state: object, owner: int = 0) -> IsolationProbe:
        del owner  # the engine's units: root's
        assert isinstance(state, runtime.DockerSandboxState), state
        return DockerIsolation(state)


def _host_check(check: Check) -> HostCheck:
    detail = check.detail if check.ok or not check.fix else f"{check.detail} ({check.fix})"
    return HostCheck(check.name, check.ok, detail)


def _image_check(engine: Any) -> HostCheck:
    from ale_iac.images import docker_has, docker_image_tag

    try:
        tag = docker_image_tag(require_image("desktop"))
    except AleIacError as exc:
        return HostCheck("image", False, str(exc))
    present = docker_has(engine, tag)
    return HostCheck("image", present, tag if present else f"{tag} not exported yet (made on first use)")
