"""The ``qemu`` substrate: a QEMU guest of the image's qcow2 export per unit (``runtime.py``), run on this host
or, with ``runner: container``, inside the ``qemu-runner`` image on the local Docker engine (built and imported
locally, nothing pulled), from the same launch script.
"""

from __future__ import annotations

import asyncio
import functools
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import SecretStr

from ale_iac import clock, image_build
from ale_iac.contract import UnitOutputs, UnitSpec
from ale_iac.errors import AleIacError
from ale_iac.images import ensure_docker_image, require_image
from ale_iac.profile import QemuRoute
from ale_iac.substrates.base import (
    BulkTransport,
    Capability,
    HostCheck,
    HostUnit,
    Leftover,
    LiveEndpoint,
    LogFn,
    Substrate,
    UnitInputs,
    UnitShell,
    UnitState,
)
from ale_iac.substrates.isolation import IsolationProbe
from ale_iac.substrates.qemu import cloud, cloud_boot, disk, launcher, runtime, saved
from ale_iac.substrates.qemu import share as guest_share
from ale_iac.substrates.qemu.isolation import QemuIsolation

RUNNER_IMAGE = "qemu-runner"
DEFAULT_VCPUS = 1
DEFAULT_MEMORY_GB = 2.0


class QemuInputs(UnitInputs):
    image_recipe: str
    vcpus: int = DEFAULT_VCPUS
    memory_gb: float = DEFAULT_MEMORY_GB
    restore: bool = True
    runner: Literal["host", "container"] = "host"
    ttl_hours: float = 24.0


class QemuState(UnitState):
    unit_dir: str
    accel: str
    restored: bool
    expires_at: str
    runner_image: str | None = None


class GuestShareTransport:
    """The guest's 9p share: a host folder copy plus one command in the guest, for any path."""

    def reaches(self, unit: UnitOutputs, remote: str) -> bool:
        del remote
        return _share_of(unit) is not None

    async def upload(self, unit: UnitOutputs, shell: UnitShell, local: Path, remote: str) -> int:
        share = _share_of(unit)
        assert share is not None
        host, guest = guest_share.new_transfer(share, "in")
        try:
            count = await asyncio.to_thread(guest_share.put_tree, local, host)
            done = await shell.run_command(guest_share.stage_command(guest, remote))
            if done.exit_code != 0:
                raise guest_share.ShareError(
                    f"staging into {remote} through the guest share failed: {done.stderr.strip()}"
                )
        finally:
            await asyncio.to_thread(shutil.rmtree, host, True)
        return count

    async def download(self, unit: UnitOutputs, shell: UnitShell, remote: str, local: Path) -> int:
        share = _share_of(unit)
        assert share is not None
        host, guest = guest_share.new_transfer(share, "out")
        try:
            done = await shell.run_command(guest_share.collect_command(remote, guest))
            if done.exit_code == guest_share.MISSING_EXIT:
                return 0
            if done.exit_code != 0:
                raise guest_share.ShareError(f"pulling {remote} through the guest share failed: {done.stderr.strip()}")
            return await asyncio.to_thread(guest_share.take_tree, host, local)
        finally:
            await asyncio.to_thread(shutil.rmtree, host, True)


def _share_of(unit: UnitOutputs) -> Path | None:
    """The unit's guest share when it is on this host."""
    try:
        share = runtime.share_dir(unit.resource_id)
    except AleIacError:  # not a qemu unit id of this host
        return None
    return share if share.is_dir() else None


class QemuSubstrate(Substrate[QemuInputs, QemuState, QemuRoute]):
    name: ClassVar[str] = "qemu"
    resource_type: ClassVar[str] = "QemuSandbox"
    inputs_model: ClassVar[type[UnitInputs]] = QemuInputs
    state_model: ClassVar[type[UnitState]] = QemuState
    folder_output: ClassVar[str] = "unit_dir"
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {Capability.BULK_TRANSPORT, Capability.HOST_CHANNEL, Capability.RESTORE}
    )
    transport: ClassVar[BulkTransport | None] = GuestShareTransport()
    image_exports: ClassVar[tuple[str, ...]] = ("qcow2", *cloud.FORMATS)
    """Its own qcow2, and the cloud disks (``cloud.py``): the same guest, booted by the clouds instead of QEMU."""

    def inputs_for(self, unit: UnitSpec, route: QemuRoute, name_prefix: str, labels: dict[str, str]) -> QemuInputs:
        shape = unit.shape.over(route.shape)
        return QemuInputs(
            **self.common_inputs(route, name_prefix, labels),
            image_recipe=route.image,
            vcpus=shape.vcpus or DEFAULT_VCPUS,
            memory_gb=shape.memory_gb or DEFAULT_MEMORY_GB,
            restore=route.restore,
            runner=route.runner,
            ttl_hours=route.ttl_hours,
        )

    def extra_outputs(self, state: QemuState) -> dict[str, Any]:
        return {"expires_at": state.expires_at, "transport": "qemu"}

    def prepare_images(self, routes: Sequence[QemuRoute], log: LogFn | None) -> None:
        """The qcow2 export of each image and, for ``runner: container``, the runner image's rootfs."""
        for name in sorted({route.image for route in routes}):
            disk.ensure_export(name, log)
        if any(route.runner == "container" for route in routes):
            image_build.build_image(RUNNER_IMAGE) if log is None else image_build.build_image(RUNNER_IMAGE, log=log)

    def export_image(self, name: str, target: str, log: LogFn | None) -> str:
        if target in cloud.FORMATS:
            return str(cloud.ensure_cloud_export(name, target, log))
        return str(disk.ensure_export(name, log).disk)

    def create(self, sandbox_id: str, inputs: QemuInputs) -> QemuState:
        expiry = clock.iso_seconds(clock.expires_at(inputs.ttl_hours))
        qcow2 = disk.ensure_export(inputs.image_recipe)  # exported once per recipe hash
        runner_image = None
        if inputs.runner == "container":
            image_build.build_image(RUNNER_IMAGE)  # cached by recipe hash: built once
            runner_image = ensure_docker_image(RUNNER_IMAGE)
        spec = runtime.QemuSandboxSpec(
            sandbox_id=sandbox_id,
            disk=qcow2.disk,
            kernel=qcow2.kernel,
            initrd=qcow2.initrd,
            vcpus=inputs.vcpus,
            memory_mb=max(512, round(inputs.memory_gb * 1024)),
            screen_width=inputs.screen_width,
            screen_height=inputs.screen_height,
            restore=inputs.restore,
            runner=inputs.runner,
            runner_image=runner_image,
            labels=dict(inputs.labels),
            expires_at=expiry,
        )
        state = runtime.start(spec)
        return QemuState(
            sandbox_id=state.sandbox_id,
            endpoint=state.endpoint,
            endpoint_token=state.token,
            host_port=state.host_port,
            unit_dir=str(state.unit_dir),
            accel=state.accel,
            restored=state.restored,
            expires_at=expiry,
            runner_image=runner_image,
        )

    def exists(self, sandbox_id: str, home: Path | None) -> bool:
        # A stopped guest's folder stays for destroy.
        return runtime.inspect(sandbox_id, home) is not None

    def destroy(self, sandbox_id: str, home: Path | None) -> None:
        runtime.stop(sandbox_id, home)

    def reset(self, sandbox_id: str) -> None:
        runtime.reset(sandbox_id)

    def current(self, unit: UnitOutputs) -> LiveEndpoint | None:
        found = runtime.current(unit.resource_id)
        if found is None:
            return None
        endpoint, token = found
        return LiveEndpoint(endpoint=endpoint, endpoint_token=SecretStr(token))

    def units(self) -> list[HostUnit]:
        return [HostUnit(info.sandbox_id, info.labels.get("stack")) for info in runtime.list_sandboxes()]

    def leftovers(self) -> list[Leftover]:
        """Runner containers whose unit folder is gone, the folders of saved-state boots whose saver was
        killed (nobody holds their lock), and cloud disk boots (``cloud_boot.py``) whose starter is gone."""
        found = [
            Leftover(
                "container",
                name,
                f"qemu runner container {name}",
                functools.partial(launcher.remove_container_named, name),
            )
            for name in launcher.orphan_containers()
        ]
        found += [
            Leftover(
                "folder",
                build.name,
                f"qemu saved-state boot {build.name}",
                functools.partial(saved.remove_build, build),
            )
            for build in saved.stale_builds()
        ]
        found += [
            Leftover(
                "folder",
                guest_dir.name,
                f"cloud disk boot {guest_dir} (QEMU pid {pid}, its starter gone)",
                functools.partial(cloud_boot.remove_orphan, pid, guest_dir),
            )
            for pid, guest_dir in cloud_boot.orphans()
        ]
        return found

    def isolation_probe(self, state: object, owner: int = 0) -> IsolationProbe:
        del owner  # the unit folder is root's; QEMU runs as the unit's own id (launcher.qemu_uid)
        assert isinstance(state, runtime.QemuSandboxState), state
        return QemuIsolation(state)

    def host_checks(self) -> list[HostCheck]:
        """QEMU, the accelerator it will use (KVM when usable, else TCG), the desktop image's qcow2 export."""
        checks = [HostCheck(name.removeprefix("qemu: "), ok, detail) for name, ok, detail in runtime.host_checks()]
        try:
            export = disk.find_export(require_image("desktop").path)
            detail = str(export.disk) if export else "not exported yet (ale-iac images build desktop --export qcow2)"
            checks.append(HostCheck("disk", export is not None, detail))
        except AleIacError as exc:
            checks.append(HostCheck("disk", False, str(exc)))
        return checks
