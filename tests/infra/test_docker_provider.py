"""The ``docker`` Pulumi dynamic provider: declaration under mocks, CRUD called directly (read after a
removal behind Pulumi's back), and a unit through the real Pulumi engine and the real Docker engine."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulumi
import pytest
from pulumi.dynamic.dynamic import serialize_provider

from ale_iac.contract import LINUX_DESKTOP_PATHS, Shape, UnitOutputs, UnitSpec
from ale_iac.images import ImageInfo
from ale_iac.infra import DeclareContext
from ale_iac.infra.docker import DockerSandboxProvider
from ale_iac.infra.host_units import declare_unit
from ale_iac.infra.mocks import RecordingMocks, install
from ale_iac.profile import DockerRoute, resolve_profile
from ale_iac.substrates.docker import runtime
from ale_iac.substrates.docker.substrate import DockerInputs
from tests.support.sandbox import Endpoint, run, wait_for_status

REPO = Path(__file__).resolve().parents[2]
INPUT_KEYS = tuple(DockerInputs.model_fields)


def test_the_shipped_docker_profile_routes_to_the_docker_provider() -> None:
    loaded = resolve_profile("docker")
    snapshot, route = loaded.profile.route(None)
    assert isinstance(route, DockerRoute) and route.allow_outbound is False and snapshot == "cpu-free-ubuntu"


def test_any_input_change_replaces() -> None:
    provider = DockerSandboxProvider()
    olds = dict.fromkeys(INPUT_KEYS, 1)
    assert provider.diff("x", olds, dict(olds)).changes is False
    result = provider.diff("x", olds, {**olds, "shm_gb": 9})
    assert result.changes is True and result.replaces == ["shm_gb"]


def test_provider_pickles_by_reference_in_a_fresh_process() -> None:
    payload = serialize_provider(DockerSandboxProvider())
    code = "import base64, sys, dill; p = dill.loads(base64.b64decode(sys.stdin.read())); print(type(p).__module__)"
    result = subprocess.run(
        [sys.executable, "-c", code], input=payload, capture_output=True, text=True, check=True, cwd="/"
    )
    assert result.stdout.strip() == "ale_iac.infra.docker" and len(payload) < 400


@pytest.fixture
def mocks() -> Iterator[RecordingMocks]:
    yield install(RecordingMocks())


@pytest.mark.image
@pulumi.runtime.test  # type: ignore[untyped-decorator]
def test_declare_unit_under_mocks(mocks: RecordingMocks, desktop_image: ImageInfo) -> pulumi.Output[Any]:
    route = DockerRoute(provider="docker", shm_gb=2, pids_limit=512, shape=Shape(vcpus=2, memory_gb=2))
    unit = UnitSpec(name="unit0", shape=Shape(memory_gb=4), labels={"run": "r1"})
    ctx = DeclareContext(stack="pytest-stack", profile="docker", index=0, unit_count=1)
    handle = declare_unit(unit, "cpu-free-ubuntu", route, ctx)

    def check(value: dict[str, Any]) -> None:
        parsed = UnitOutputs.model_validate(value)
        assert parsed.provider == "docker" and parsed.transport == "docker"
        assert parsed.image == desktop_image.ref and parsed.paths == LINUX_DESKTOP_PATHS
        assert parsed.labels == {"run": "r1", "stack": "pytest-stack", "unit": "unit0", "profile": "docker"}
        [container] = mocks.of_type("pulumi-python:dynamic/ale:DockerSandbox")
        inputs = container.inputs
        assert inputs["image_recipe"] == "desktop" and inputs["image"] == desktop_image.ref
        assert inputs["vcpus"] == 2 and inputs["memory_gb"] == 4 and inputs["shm_gb"] == 2
        assert inputs["pids_limit"] == 512 and inputs["allow_outbound"] is False

    return handle.apply(check)


@pytest.mark.docker
def test_create_read_delete_called_directly(docker_image: str) -> None:
    provider = DockerSandboxProvider()
    props = {
        "name_prefix": "pytest-direct",
        "image_recipe": "desktop",
        "image": "desktop",
        "vcpus": 1,
        "memory_gb": 1,
        "labels": {"stack": "pytest-direct", "unit": "u"},
    }
    created = provider.create(props)
    sandbox_id = created.id
    try:
        outs = created.outs
        assert outs is not None and outs["image_tag"] == docker_image and outs["container_id"]
        wait_for_status(Endpoint(outs["endpoint"], outs["endpoint_token"]))
        assert provider.read(sandbox_id, outs).id == sandbox_id
        # Removed behind Pulumi's back: a refresh drops it.
        runtime.stop(sandbox_id)
        assert provider.read(sandbox_id, outs).id is None
    finally:
        provider.delete(sandbox_id, {})
    assert runtime.inspect(sandbox_id) is None


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ale_iac", *args], capture_output=True, text=True, cwd=REPO, timeout=400, check=False
    )


@pytest.mark.engine
@pytest.mark.docker
def test_a_unit_through_the_real_pulumi_engine_and_destroy_leaves_nothing(docker_image: str) -> None:
    created = _cli("sandbox", "create", "--profile", "docker")
    assert created.returncode == 0, created.stdout + created.stderr
    stack = re.search(r"^stack:\s+(\S+)", created.stdout, re.M)
    sandbox_id = re.search(r"^resource_id:\s+(\S+)", created.stdout, re.M)
    assert stack and sandbox_id, created.stdout
    try:
        assert re.search(r"^transport:\s+docker$", created.stdout, re.M), created.stdout
        env = _cli("sandbox", "env", stack[1])
        values = dict(re.findall(r"export (\w+)=(\S+)", env.stdout.replace("'", "")))
        endpoint = Endpoint(values["ALE_IAC_ENDPOINT"], values["ALE_IAC_ENDPOINT_TOKEN"])
        assert run(endpoint, "id -u")["stdout"] == "0\n"
        assert runtime.inspect(sandbox_id[1]) is not None
    finally:
        destroyed = _cli("sandbox", "destroy", stack[1])
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    client = runtime.client()
    label = {"label": f"{runtime.LABEL_SANDBOX}={sandbox_id[1]}"}
    try:
        left = (
            client.containers.list(all=True, filters=label)
            + client.networks.list(filters=label)
            + client.volumes.list(filters=label)
        )
    finally:
        client.close()
    assert left == []
