"""The ``local`` Pulumi dynamic provider: direct CRUD calls, dill round trip, declare_unit under mocks."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulumi
import pytest
from pulumi.dynamic.dynamic import serialize_provider

from ale_iac.contract import LINUX_DESKTOP_PATHS, Shape, UnitOutputs, UnitSpec
from ale_iac.errors import AleIacError
from ale_iac.images import ImageInfo
from ale_iac.infra import DeclareContext
from ale_iac.infra.host_units import HostUnitProvider, declare_unit, name_prefix, new_sandbox_id
from ale_iac.infra.local import LocalSandboxProvider
from ale_iac.infra.mocks import RecordingMocks, install
from ale_iac.profile import LocalRoute
from ale_iac.substrates.local import runtime as local_runtime
from ale_iac.substrates.local import sandboxes as local_sandboxes
from ale_iac.substrates.local.substrate import LocalInputs
from tests.support.sandbox import Endpoint, run, wait_for_status

REPO = Path(__file__).resolve().parents[2]
INPUT_KEYS = tuple(LocalInputs.model_fields)


def provider_props(image: ImageInfo, **overrides: Any) -> dict[str, Any]:
    props: dict[str, Any] = {
        "name_prefix": "pytest-unit0",
        "rootfs": str(image.rootfs),
        "image": image.ref,
        "screen_width": 1024,
        "screen_height": 768,
        "allow_outbound": False,
        "vcpus": None,
        "memory_gb": None,
        "disk_gb": 16,
        "pids_limit": 4096,
        "labels": {"stack": "pytest", "unit": "unit0", "profile": "local"},
    }
    props.update(overrides)
    return props


# --- pure functions ------------------------------------------------------------------------------


def test_sandbox_ids_are_safe_and_unique() -> None:
    assert name_prefix("My Stack", "unit_0/a") == "my-stack-unit-0-a"
    assert name_prefix("---") == "sandbox"
    long = name_prefix("s" * 80, "u")
    assert len(long) <= 41
    ids = {new_sandbox_id("stack-unit") for _ in range(50)}
    assert len(ids) == 50
    for sandbox_id in ids:
        local_sandboxes.check_sandbox_id(sandbox_id)
        assert sandbox_id.startswith("stack-unit-")


def test_any_input_change_replaces() -> None:
    provider = LocalSandboxProvider()
    olds = {
        "name_prefix": "s-u",
        "rootfs": "/r",
        "image": "desktop-abc",
        "screen_width": 1280,
        "screen_height": 800,
        "allow_outbound": False,
        "labels": {"a": "1"},
        "sandbox_id": "s-u-123456",
        "endpoint": "http://127.0.0.1:1",
    }
    same = provider.diff("s-u-123456", olds, {k: olds[k] for k in INPUT_KEYS if k in olds})
    assert same.changes is False and same.replaces == []
    for key, value in [("screen_width", 1920), ("allow_outbound", True), ("labels", {"a": "2"}), ("vcpus", 2)]:
        result = provider.diff("s-u-123456", olds, {**olds, key: value})
        assert result.changes is True
        assert result.replaces == [key]
        assert result.delete_before_replace is False


def test_an_input_added_later_replaces_no_unit_made_before_it() -> None:
    """A stack's units made by an older ale-iac lack the inputs added since (``pids_limit``, ``disk_gb``): news
    that carry those inputs' defaults change nothing; another value replaces the unit."""
    provider = LocalSandboxProvider()
    olds = {"name_prefix": "s-u", "rootfs": "/r", "image": "desktop-abc", "labels": {}, "sandbox_id": "s-u-1"}
    news = {**olds, "pids_limit": local_sandboxes.DEFAULT_PIDS_LIMIT, "disk_gb": 16}
    assert provider.diff("s-u-1", olds, news).changes is False
    assert provider.diff("s-u-1", olds, {**news, "pids_limit": 64}).replaces == ["pids_limit"]
    # checkpoint (added with docs/checkpoint.md) likewise: a pool made before it keeps its units.
    assert provider.diff("s-u-1", olds, {**news, "checkpoint": False}).changes is False
    assert provider.diff("s-u-1", olds, {**news, "checkpoint": True}).replaces == ["checkpoint"]
    assert provider.diff("s-u-1", olds, {**news, "template": False}).changes is False  # and template, after it
    assert provider.diff("s-u-1", olds, {**news, "template": True}).replaces == ["template"]


@pytest.mark.parametrize(
    ("provider", "path"),
    [
        (HostUnitProvider(), "ale_iac.infra.host_units.HostUnitProvider"),
        # The path a stack made before one provider served every substrate has in its state.
        (LocalSandboxProvider(), "ale_iac.infra.local.LocalSandboxProvider"),
    ],
)
def test_provider_pickles_by_reference_in_a_fresh_process(provider: HostUnitProvider, path: str) -> None:
    """What the engine's provider process does: dill.loads the provider from the resource state."""
    payload = serialize_provider(provider)
    code = textwrap.dedent(
        """
        import base64, sys, dill
        provider = dill.loads(base64.b64decode(sys.stdin.read()))
        cls = type(provider)
        print(cls.__module__ + "." + cls.__qualname__)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], input=payload, capture_output=True, text=True, check=True, cwd="/"
    )
    assert result.stdout.strip() == path
    assert len(payload) < 400, "the provider must pickle by reference, not by value"


def test_declare_unit_needs_a_built_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALE_IAC_CACHE", str(tmp_path / "empty-cache"))
    route = LocalRoute(provider="local")
    ctx = DeclareContext(stack="s", profile="local", index=0, unit_count=1)
    with pytest.raises(AleIacError, match=r"image 'desktop' is not built; run: ale-iac images build desktop"):
        declare_unit(UnitSpec(name="u"), "desktop", route, ctx)


# --- under Pulumi mocks --------------------------------------------------------------------------


@pytest.fixture
def mocks() -> Iterator[RecordingMocks]:
    yield install(RecordingMocks())


@pytest.mark.image
@pulumi.runtime.test  # type: ignore[untyped-decorator]
def test_declare_unit_under_mocks(mocks: RecordingMocks, desktop_image: ImageInfo) -> pulumi.Output[Any]:
    route = LocalRoute(provider="local", screen_width=1024, shape=Shape(vcpus=1, memory_gb=2))
    unit = UnitSpec(name="unit0", snapshot="desktop", shape=Shape(memory_gb=4), labels={"run": "r1", "stack": "x"})
    ctx = DeclareContext(stack="pytest-stack", profile="local", index=0, unit_count=1)
    handle = declare_unit(unit, "desktop", route, ctx)

    def check(value: dict[str, Any]) -> None:
        parsed = UnitOutputs.model_validate(value)
        assert parsed.provider == "local" and parsed.unit == "unit0" and parsed.os == "linux"
        [sandbox] = mocks.of_type("pulumi-python:dynamic/ale:LocalSandbox")
        assert parsed.endpoint.startswith("http://127.0.0.1:") and parsed.resource_id == "pytest-stack-unit0-mock"
        assert parsed.image == desktop_image.ref
        assert parsed.snapshot == "desktop"
        assert parsed.paths == LINUX_DESKTOP_PATHS
        assert parsed.managed is True
        assert parsed.labels == {"run": "r1", "stack": "pytest-stack", "unit": "unit0", "profile": "local"}
        # Every field, but egress and port_forward: a unit without a policy exports none, and only a Kubernetes unit
        # has a port-forward (UnitOutputs.to_output), so a local unit exports what it did before the fields.
        assert set(value) == set(UnitOutputs.model_fields) - {"egress", "port_forward"}
        inputs = sandbox.inputs
        assert sandbox.name == "unit0" and sandbox.parent is None
        assert inputs["rootfs"] == str(desktop_image.rootfs)
        assert inputs["screen_width"] == 1024 and inputs["screen_height"] == 800
        assert inputs["vcpus"] == 1 and inputs["memory_gb"] == 4  # the task's shape over the route's
        assert inputs["allow_outbound"] is False
        assert "__provider" in inputs

    return handle.apply(check)


# --- the provider for real -----------------------------------------------------------------------


@pytest.mark.sandbox
def test_create_and_delete_called_directly(desktop_image: ImageInfo) -> None:
    provider = LocalSandboxProvider()
    result = provider.create(provider_props(desktop_image, vcpus=1))
    try:
        outs = result.outs or {}
        assert result.id == outs["sandbox_id"] and result.id.startswith("pytest-unit0-")
        assert outs["endpoint"] == f"http://127.0.0.1:{outs['host_port']}"
        assert outs["image"] == desktop_image.ref
        assert {record["name"] for record in outs["limits"]} == {"vcpus", "pids_limit", "disk_gb"}
        assert len(outs["endpoint_token"]) >= 32  # marked secret by the resource (SECRET_OUTPUTS)
        json.dumps(outs)  # everything in the state is plain JSON
        endpoint = Endpoint(outs["endpoint"], outs["endpoint_token"])
        wait_for_status(endpoint)
        assert run(endpoint, "xdpyinfo | grep dimensions")["stdout"].split()[1] == "1024x768"
        assert provider.read(result.id, outs).id == result.id
    finally:
        provider.delete(result.id, result.outs or {})
    assert local_sandboxes.load_state(result.id) is None
    provider.delete(result.id, result.outs or {})  # idempotent
    assert provider.read(result.id, result.outs or {}).id is None


@pytest.mark.sandbox
def test_provider_round_trips_through_dill_and_runs_in_a_subprocess(desktop_image: ImageInfo) -> None:
    """Like the engine's provider process: unpickle the provider, create, then delete a sandbox."""
    payload = serialize_provider(HostUnitProvider())
    props = {**provider_props(desktop_image, name_prefix="pytest-dill"), "substrate": "local"}
    code = textwrap.dedent(
        """
        import base64, json, sys, dill
        data = json.loads(sys.stdin.read())
        provider = dill.loads(base64.b64decode(data["provider"]))
        result = provider.create(data["props"])
        print(json.dumps({"id": result.id, "outs": result.outs}), flush=True)
        sys.stdin.close()
        """
    )
    created = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps({"provider": payload, "props": props}),
        capture_output=True,
        text=True,
        check=False,
        cwd="/",
        timeout=120,
    )
    assert created.returncode == 0, created.stderr
    reply = json.loads(created.stdout)
    sandbox_id = reply["id"]
    try:
        # The creating process has exited; the sandbox lives on, detached from it.
        state = local_sandboxes.load_state(sandbox_id)
        assert state is not None and local_sandboxes.is_alive(state)
        wait_for_status(Endpoint(reply["outs"]["endpoint"], reply["outs"]["endpoint_token"]))
        delete_code = textwrap.dedent(
            """
            import base64, json, sys, dill
            data = json.loads(sys.stdin.read())
            provider = dill.loads(base64.b64decode(data["provider"]))
            provider.delete(data["id"], data["outs"])
            """
        )
        deleted = subprocess.run(
            [sys.executable, "-c", delete_code],
            input=json.dumps({"provider": payload, "id": sandbox_id, "outs": reply["outs"]}),
            capture_output=True,
            text=True,
            check=False,
            cwd="/",
            timeout=60,
        )
        assert deleted.returncode == 0, deleted.stderr
        assert local_sandboxes.load_state(sandbox_id) is None
    finally:
        local_runtime.stop(sandbox_id)
