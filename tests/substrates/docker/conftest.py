"""The engine and the exported image for the docker substrate's tests (the executor tests' fixtures)."""

from tests.executors.conftest import docker_engine, docker_image

__all__ = ["docker_engine", "docker_image"]
