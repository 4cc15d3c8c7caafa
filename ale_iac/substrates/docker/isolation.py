"""The ``docker`` substrate's unit as the isolation suite sees it from the host (``ale_iac.substrates.isolation``)."""

from __future__ import annotations

from pathlib import Path

from ale_iac import docker_engine
from ale_iac.substrates import isolation
from ale_iac.substrates.docker import walls
from ale_iac.substrates.docker.runtime import DockerSandboxState

_ENGINE_ONLY = (
    "no host process stands for the unit but the engine's own (containerd-shim, docker-proxy), which ale-iac "
    "does not start"
)
NOT_APPLICABLE = {
    isolation.HOST_READS_SAFELY: "the host reads a unit's files only through the engine's archive API, which "
    "copies regular files and never follows a link (tests/substrates/docker/test_transport.py)",
    isolation.NETWORK_LOOPBACK_ONLY: "a unit has a network of its own (a published port needs one); "
    "tests/substrates/docker/test_runtime.py checks from inside that nothing of the host or beyond is reached",
    isolation.HOST_PROCESS_CONFINED: _ENGINE_ONLY,
    isolation.HOST_PROCESS_UNPRIVILEGED: _ENGINE_ONLY,
}


class DockerIsolation:
    """A unit container, found through the engine; its disk is the one host folder kept for it."""

    def __init__(self, state: DockerSandboxState) -> None:
        self.state = state

    def host_pids(self) -> list[int]:
        engine = docker_engine.client()
        try:
            top = engine.api.top(self.state.container_id, ps_args="-eo pid")
        finally:
            engine.close()
        return [int(row[0]) for row in top["Processes"]]

    def host_paths(self) -> list[Path]:
        return [walls.unit_dir(self.state.sandbox_id)]

    def read_log(self, name: str) -> str:
        raise NotImplementedError(NOT_APPLICABLE[isolation.HOST_READS_SAFELY])

    def tasks_in_use(self) -> int:
        """The container's pids cgroup, found from its init's ``/proc/<pid>/cgroup`` (v1 or v2, any driver)."""
        engine = docker_engine.client()
        try:
            pid = int(engine.api.inspect_container(self.state.container_id)["State"]["Pid"])
        finally:
            engine.close()
        return isolation.pids_current(pid)

    def not_applicable(self, check: str) -> str | None:
        isolation.unknown_check(check)
        return NOT_APPLICABLE.get(check)
