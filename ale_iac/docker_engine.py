"""ale-iac's Docker engine, as every part of ale-iac that uses it reaches it: the ``docker`` substrate's unit
containers, the ``docker`` executor's agent containers, the ``qemu`` substrate's runner containers and the
images exported into the engine.

A leaf utility: the engine is a service of the host, not any one substrate's.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ale_iac.errors import AleIacError

if TYPE_CHECKING:
    from docker import DockerClient

START_HINT = "start it: scripts/dockerd.sh (as root; scripts/setup.sh installs the engine)"
ENGINE_ENV = "ALE_IAC_DOCKER_HOST"
ENGINE_SOCKET = os.environ.get("ALE_IAC_DOCKER_SOCKET", "/run/ale-iac/docker.sock")
"""ale-iac's own engine's socket (``scripts/dockerd.sh`` starts the engine there, with ``userns-remap``)."""


class DockerEngineError(AleIacError):
    """The engine is not reachable or does not answer; the message says how to start it."""


def engine_url() -> str:
    """The engine ale-iac uses: ``ALE_IAC_DOCKER_HOST``, else ``DOCKER_HOST``, else ale-iac's own engine
    (``scripts/dockerd.sh``: its own socket, data root and configuration, with ``userns-remap``). A user's
    engine is used only when one of the two variables names it; its units then record whether it remaps."""
    return os.environ.get(ENGINE_ENV) or os.environ.get("DOCKER_HOST") or f"unix://{ENGINE_SOCKET}"


def client(timeout: float = 60.0) -> DockerClient:
    """A client of ale-iac's engine (:func:`engine_url`) that has answered a ping."""
    import docker
    from docker.errors import DockerException

    try:
        engine = docker.DockerClient(base_url=engine_url(), timeout=int(timeout))
    except DockerException as exc:
        raise DockerEngineError(f"the Docker engine is not reachable ({exc}); {START_HINT}") from None
    try:
        engine.ping()
    except DockerException as exc:
        engine.close()
        raise DockerEngineError(f"the Docker engine does not answer ({exc}); {START_HINT}") from None
    return engine
