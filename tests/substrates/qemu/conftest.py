"""The qemu substrate's fixtures: the desktop image's qcow2 export, one saved memory state, unit guests.

The export and the saved state are cached (by recipe hash; by disk and machine shape) outside the tests'
per-test ``ALE_IAC_HOME``, so only the first run on a host pays for them (about a minute each under TCG);
scripts/setup.sh makes both. Guests here use the ``qemu`` profile's shape (1 vCPU, 2 GiB), so the state is
the one the profile, the provider tests and the benchmark restore too.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator

import pytest

from ale_iac.images import ImageInfo
from ale_iac.substrates.qemu import runtime
from ale_iac.substrates.qemu.disk import QemuDisk
from ale_iac.substrates.qemu.disk import ensure_export as ensure_qcow2_image
from ale_iac.substrates.qemu.launcher import Runner, qemu_pids
from tests.support.sandbox import Endpoint

VCPUS = 1
MEMORY_MB = 2048


@pytest.fixture(scope="session")
def qemu_disk(desktop_image: ImageInfo) -> QemuDisk:
    return ensure_qcow2_image(desktop_image.name)


def spec_for(
    disk: QemuDisk, *, restore: bool = True, runner: Runner = "host", **fields: object
) -> runtime.QemuSandboxSpec:
    return runtime.QemuSandboxSpec(
        sandbox_id=f"pytest-q-{secrets.token_hex(3)}",
        disk=disk.disk,
        kernel=disk.kernel,
        initrd=disk.initrd,
        vcpus=VCPUS,
        memory_mb=MEMORY_MB,
        restore=restore,
        runner=runner,
        **fields,  # type: ignore[arg-type]
    )


StartFn = Callable[..., runtime.QemuSandboxState]


@pytest.fixture
def start_unit(qemu_disk: QemuDisk) -> Iterator[StartFn]:
    """``start_unit(**spec_fields)``: a started unit guest, stopped (and checked gone) after the test."""
    started: list[str] = []

    def start(**fields: object) -> runtime.QemuSandboxState:
        spec = spec_for(qemu_disk, **fields)  # type: ignore[arg-type]
        started.append(spec.sandbox_id)
        return runtime.start(spec)

    yield start
    for sandbox_id in started:
        runtime.stop(sandbox_id)
        unit_dir = runtime.unit_dir_of(sandbox_id)
        assert not unit_dir.exists() and qemu_pids(unit_dir) == [], f"{sandbox_id} left something behind"


def endpoint(state: runtime.QemuSandboxState) -> Endpoint:
    return Endpoint(state.endpoint, state.token)
