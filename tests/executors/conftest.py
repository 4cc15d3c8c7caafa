"""Fixtures of the executor tests: the Docker engine and the runtime image in it (``docker`` marker)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ale_iac.errors import AleIacError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def docker_engine() -> None:
    """A Docker engine that answers: started by scripts/dockerd.sh if none runs (it is left running)."""
    from ale_iac.images import docker_client

    try:
        docker_client(timeout=10).close()
        return
    except AleIacError:
        pass
    proc = subprocess.run(["bash", str(REPO / "scripts" / "dockerd.sh")], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"scripts/dockerd.sh failed:\n{proc.stdout}{proc.stderr}"
    docker_client(timeout=10).close()


@pytest.fixture(scope="session")
def docker_image(docker_engine: None) -> str:
    """The desktop image in the engine (imported from the built rootfs once); its tag."""
    from ale_iac.images import ensure_docker_image

    return ensure_docker_image("desktop", log=lambda line: print(line, file=sys.stderr))
