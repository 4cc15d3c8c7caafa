"""The ``qemu`` Pulumi dynamic provider: the route and declaration under mocks, CRUD called directly (read
after a removal behind Pulumi's back), and a unit through the real Pulumi engine and a real guest."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pulumi
import pytest
from pulumi.dynamic.dynamic import serialize_provider

from ale_iac.contract import LINUX_DESKTOP_PATHS, Shape, UnitOutputs, UnitSpec
from ale_iac.errors import ConfigError
from ale_iac.images import ImageInfo
from ale_iac.infra import DeclareContext
from ale_iac.infra.host_units import declare_unit
from ale_iac.infra.mocks import RecordingMocks, install
from ale_iac.infra.qemu import QemuSandboxProvider
from ale_iac.profile import QemuRoute, parse_profile, resolve_profile
from ale_iac.substrates.qemu import runtime
from ale_iac.substrates.qemu.substrate import QemuInputs
from tests.support.sandbox import Endpoint, cmd, run, wait_for_status

REPO = Path(__file__).resolve().parents[2]
INPUT_KEYS = tuple(QemuInputs.model_fields)


def test_the_shipped_qemu_profile_routes_to_the_qemu_provider() -> None:
    loaded = resolve_profile("qemu")
    snapshot, route = loaded.profile.route(None)
    assert isinstance(route, QemuRoute) and snapshot == "cpu-free-ubuntu"
    assert route.restore is True and route.runner == "host" and route.shape == Shape(vcpus=1, memory_gb=2)


def test_a_bad_runner_names_the_field_and_the_file() -> None:
    data = {"name": "q", "snapshots": {"s": {"provider": "qemu", "runner": "vm"}}}
    with pytest.raises(ConfigError) as caught:
        parse_profile(data, "stacks/Pulumi.q.yaml")
    assert "runner" in str(caught.value) and "stacks/Pulumi.q.yaml" in str(caught.value)


def test_any_input_change_replaces() -> None:
    provider = QemuSandboxProvider()
    olds = dict.fromkeys(INPUT_KEYS, 1)
    assert provider.diff("x", olds, dict(olds)).changes is False
    result = provider.diff("x", olds, {**olds, "memory_gb": 4})
    assert result.changes is True and result.replaces == ["memory_gb"]


def test_provider_pickles_by_reference_in_a_fresh_process() -> None:
    payload = serialize_provider(QemuSandboxProvider())
    code = "import base64, sys, dill; p = dill.loads(base64.b64decode(sys.stdin.read())); print(type(p).__module__)"
    result = subprocess.run(
        [sys.executable, "-c", code], input=payload, capture_output=True, text=True, check=True, cwd="/"
    )
    assert result.stdout.strip() == "ale_iac.infra.qemu" and len(payload) < 400


@pytest.fixture
def mocks() -> Iterator[RecordingMocks]:
    yield install(RecordingMocks())


@pytest.mark.image
@pulumi.runtime.test  # type: ignore[untyped-decorator]
def test_declare_unit_under_mocks(mocks: RecordingMocks, desktop_image: ImageInfo) -> pulumi.Output[Any]:
    route = QemuRoute(provider="qemu", restore=False, runner="container", shape=Shape(vcpus=2, memory_gb=2))
    unit = UnitSpec(name="unit0", shape=Shape(memory_gb=3), labels={"run": "r1"})
    ctx = DeclareContext(stack="pytest-stack", profile="qemu", index=0, unit_count=1)
    handle = declare_unit(unit, "cpu-free-ubuntu", route, ctx)

    def check(value: dict[str, Any]) -> None:
        parsed = UnitOutputs.model_validate(value)
        assert parsed.provider == "qemu" and parsed.transport == "qemu" and parsed.container_id is None
        assert parsed.image == desktop_image.ref and parsed.paths == LINUX_DESKTOP_PATHS
        assert parsed.labels == {"run": "r1", "stack": "pytest-stack", "unit": "unit0", "profile": "qemu"}
        [guest] = mocks.of_type("pulumi-python:dynamic/ale:QemuSandbox")
        inputs = guest.inputs
        assert inputs["image_recipe"] == "desktop" and inputs["image"] == desktop_image.ref
        assert inputs["vcpus"] == 2 and inputs["memory_gb"] == 3
        assert inputs["restore"] is False and inputs["runner"] == "container"

    return handle.apply(check)


@pytest.mark.qemu
@pytest.mark.xdist_group("qemu")  # one guest boot at a time on 2 cores
@pytest.mark.timeout(1200)
def test_create_read_delete_called_directly(desktop_image: ImageInfo) -> None:
    provider = QemuSandboxProvider()
    props = {
        "name_prefix": "pytest-direct",
        "image_recipe": desktop_image.name,
        "image": desktop_image.ref,
        "vcpus": 1,
        "memory_gb": 2,
        "labels": {"stack": "pytest-direct", "unit": "u"},
    }
    created = provider.create(props)
    sandbox_id = created.id
    try:
        outs = created.outs
        assert outs is not None and outs["restored"] is True and outs["accel"] in ("tcg", "kvm")
        wait_for_status(Endpoint(outs["endpoint"], outs["endpoint_token"]))
        assert provider.read(sandbox_id, outs).id == sandbox_id
        runtime.stop(sandbox_id)  # removed behind Pulumi's back: a refresh drops it
        assert provider.read(sandbox_id, outs).id is None
    finally:
        provider.delete(sandbox_id, {})
    assert runtime.inspect(sandbox_id) is None


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ale_iac", *args], capture_output=True, text=True, cwd=REPO, timeout=1100, check=False
    )


@pytest.mark.engine
@pytest.mark.qemu
@pytest.mark.xdist_group("qemu")  # one guest boot at a time on 2 cores
@pytest.mark.timeout(1200)
def test_a_unit_through_the_real_pulumi_engine_and_destroy_leaves_nothing() -> None:
    created = _cli("sandbox", "create", "--profile", "qemu")
    assert created.returncode == 0, created.stdout + created.stderr
    stack = re.search(r"^stack:\s+(\S+)", created.stdout, re.M)
    sandbox_id = re.search(r"^resource_id:\s+(\S+)", created.stdout, re.M)
    assert stack and sandbox_id, created.stdout
    info = runtime.inspect(sandbox_id[1])
    try:
        assert re.search(r"^transport:\s+qemu$", created.stdout, re.M), created.stdout
        env = _cli("sandbox", "env", stack[1])
        values = dict(re.findall(r"export (\w+)=(\S+)", env.stdout.replace("'", "")))
        endpoint = Endpoint(values["ALE_IAC_ENDPOINT"], values["ALE_IAC_ENDPOINT_TOKEN"])
        assert run(endpoint, "id -u; hostname")["stdout"] == f"0\n{sandbox_id[1]}\n"
        shot = cmd(endpoint, "screenshot", {"format": "png"})
        png = base64.b64decode(shot["image_data"])
        assert shot["success"] and png.startswith(b"\x89PNG") and len(png) > 1000
        assert info is not None and info.running
    finally:
        destroyed = _cli("sandbox", "destroy", stack[1])
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert runtime.inspect(sandbox_id[1]) is None and not info.unit_dir.exists()
    pid = info.record.get("pid")
    assert pid is None or not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.engine
@pytest.mark.qemu
@pytest.mark.xdist_group("qemu")  # one guest boot at a time on 2 cores
@pytest.mark.timeout(1500)
def test_the_demo_experiment_on_the_qemu_profile_scores_one(tmp_path: Path) -> None:
    import json

    from ale_iac.engine import Engine
    from ale_iac.runner.evaluation import run_experiment
    from ale_iac.runner.experiment import load_experiment

    experiment = load_experiment(REPO / "examples" / "demo.yaml", {"profile": "qemu", "output_root": str(tmp_path)})
    summary = run_experiment(experiment)
    assert {o.task for o in summary.outcomes} >= {"cli-log-stats", "gui-notepad", "mixed-clipboard-total"}
    assert all(o.status == "succeeded" and o.score == 1.0 for o in summary.outcomes), summary.outcomes
    for outcome in summary.outcomes:
        record = json.loads((summary.run_dir / outcome.unit_id / "run.json").read_text())
        assert record["cleanup"] == {"mode": "destroy", "outcome": "destroyed"}
    assert "qemu" in (summary.run_dir / "experiment.json").read_text()
    assert Engine().list_stacks() == [] and runtime.list_sandboxes() == []
