"""Both packagings of the runner start a guest from the same launch script: QEMU on the host, and QEMU in
the locally built ``qemu-runner`` container (launch.sh bind-mounted read-only from the package)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from ale_iac.image_build import build_image
from ale_iac.images import ensure_docker_image
from ale_iac.substrates.docker.runtime import client
from ale_iac.substrates.qemu import launcher, runtime
from tests.substrates.qemu.conftest import StartFn, endpoint
from tests.support.sandbox import run

pytestmark = [pytest.mark.qemu, pytest.mark.timeout(1500), pytest.mark.xdist_group("qemu")]


@pytest.fixture(scope="module")
def runner_image(docker_engine: None) -> Iterator[str]:
    build_image("qemu-runner")  # cached by recipe hash
    yield ensure_docker_image("qemu-runner")


def test_the_host_runner_execs_qemu_from_launch_sh(start_unit: StartFn) -> None:
    state = start_unit()
    assert state.runner == "host" and state.pid is not None
    process = psutil.Process(state.pid)
    assert process.name().startswith(("qemu-system", "ale-qemu")) and str(state.unit_dir) in " ".join(process.cmdline())
    log = (state.unit_dir / "qemu.log").read_text()
    assert "launch.sh" not in log  # no usage error
    status = Path(f"/proc/{state.pid}/status").read_text()
    assert "Seccomp:\t2" in status  # QEMU's own filter (-sandbox on)
    assert process.uids().real == launcher.qemu_uid(state.unit_dir) != 0  # never root (test_isolation has more)
    assert run(endpoint(state), "hostname")["stdout"].strip() == state.sandbox_id


@pytest.mark.docker
def test_the_container_runner_runs_the_same_launch_sh(start_unit: StartFn, runner_image: str) -> None:
    state = start_unit(runner="container", runner_image=runner_image)
    assert state.runner == "container" and state.container_id
    engine = client()
    try:
        attrs = engine.api.inspect_container(state.container_id)
        mounts = {m["Destination"]: m for m in attrs["Mounts"]}
        script = mounts[launcher.CONTAINER_LAUNCH]
        assert script["Source"] == str(launcher.LAUNCH_SCRIPT) and script["RW"] is False
        assert attrs["Config"]["Cmd"][:2] == ["/bin/sh", launcher.CONTAINER_LAUNCH]
        assert attrs["HostConfig"]["NetworkMode"] == "host" and attrs["HostConfig"]["Privileged"] is False
        qemu = psutil.Process(int(attrs["State"]["Pid"]))  # launch.sh execs setpriv, which execs QEMU
        assert qemu.uids().real == launcher.qemu_uid(state.unit_dir) != 0 and qemu.gids().real != 0
        assert "Seccomp:\t2" in Path(f"/proc/{qemu.pid}/status").read_text()
        assert run(endpoint(state), "hostname")["stdout"].strip() == state.sandbox_id
        runtime.stop(state.sandbox_id)
        assert engine.containers.list(all=True, filters={"name": launcher.container_name(state.unit_dir)}) == []
    finally:
        engine.close()
    assert not state.unit_dir.exists()


@pytest.mark.docker
@pytest.mark.engine
def test_gc_removes_a_runner_container_whose_unit_folder_is_gone(start_unit: StartFn, runner_image: str) -> None:
    import shutil

    from ale_iac.engine import Engine
    from ale_iac.runner.gc import collect

    state = start_unit(runner="container", runner_image=runner_image)
    name = launcher.container_name(state.unit_dir)
    shutil.rmtree(state.unit_dir)  # removed behind ale-iac's back: the container is all that is left
    assert name in launcher.orphan_containers()
    report = collect(Engine())
    assert name in report.containers_removed, report
    engine = client()
    try:
        assert engine.containers.list(all=True, filters={"name": name}) == []
    finally:
        engine.close()
