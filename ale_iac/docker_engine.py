"""The local Docker engine, as every part of ale-iac that uses it reaches it: the ``docker`` substrate's unit
containers, the ``docker`` executor's agent containers, the ``qemu`` substrate's runner containers and the
images exported into the engine.

A leaf utility: the engine is a service of the host, not any one substrate's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ale_iac.errors import AleIacError

if TYPE_CHECKING:
    from docker import DockerClient

START_HINT = "start it: scripts/dockerd.sh (as root; scripts/setup.sh installs the engine)"


class DockerEngineError(AleIacError):
    """The engine is not reachable or does not answer; the message says how to start it."""


def client(timeout: float = 60.0) -> DockerClient:
    """A client of the local engine (``DOCKER_HOST`` or the default socket) that has answered a ping."""
    import docker
    from docker.errors import DockerException

    try:
        engine = docker.from_env(timeout=int(timeout))
    except DockerException as exc:
        raise DockerEngineError(f"the Docker engine is not reachable ({exc}); {START_HINT}") from None
    try:
        engine.ping()
    except DockerException as exc:
        engine.close()
        raise DockerEngineError(f"the Docker engine does not answer ({exc}); {START_HINT}") from None
    return engine
