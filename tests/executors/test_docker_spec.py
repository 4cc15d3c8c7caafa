"""The ``docker`` executor without an engine: what it tells the entry (no secret in the spec), what the
deployer sees inside, and the errors when the engine or the image is missing (fast lane)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml

from ale_iac.agent_sdk import AgentConfig, CliInstall, ModelGrant
from ale_iac.contract import ENDPOINT_TOKEN_ENV
from ale_iac.docker_engine import client as docker_client
from ale_iac.errors import AleIacError
from ale_iac.executors.docker import DockerExecutor, _python_version
from ale_iac.executors.entry import MODEL_TOKEN_SECRET
from ale_iac.images import ensure_docker_image
from ale_iac.runner.records import REDACTED, Redactor
from ale_iac.sandbox.handle import SandboxHandle

PRESET = Path(__file__).parent / "presets" / "docker_probe"


def _executor(tmp_path: Path) -> DockerExecutor:
    data = yaml.safe_load((PRESET / "preset.yaml").read_text())
    config = AgentConfig.model_validate({**data, "source_dir": str(PRESET)})
    grant = ModelGrant(
        api="openai", model="m1", token="gw-secret-123456", tcp_root="http://127.0.0.1:9", attach_unix=lambda p: None
    )
    cli = CliInstall("codex", "1.2.3", tmp_path / "codex", "bin/codex", ("bin/codex",))
    return DockerExecutor(
        config=config,
        sandbox=SandboxHandle.for_endpoint("http://127.0.0.1:5555", token="endpoint-secret-123456"),
        work_dir=tmp_path / "agent",
        env={"ALE_TEST_API_KEY": "api-secret-123456"},
        redact=Redactor(["api-secret-123456"]),
        model=grant,
        clis={"codex": cli},
    )


def test_the_spec_names_the_secrets_and_holds_none(tmp_path: Path) -> None:
    executor = _executor(tmp_path)
    spec = executor.spec("do it", 60.0)
    text = json.dumps(spec)
    for value in ("gw-secret-123456", "endpoint-secret-123456", "api-secret-123456"):
        assert value not in text
    assert spec["secret_env"] == [] and spec["secrets_file"] == "/run/ale-iac/secrets.json"
    assert sorted(executor._secret_values()) == sorted(["ALE_TEST_API_KEY", ENDPOINT_TOKEN_ENV, MODEL_TOKEN_SECRET])
    assert spec["kind"] == "docker" and spec["work_dir"] == "/work" and spec["timeout_s"] == 60.0
    assert spec["config"]["source_dir"] == "/opt/ale-iac/preset"
    assert spec["sandbox"]["endpoint"] == "http://127.0.0.1:4002"
    assert "endpoint_token" not in spec["sandbox"] and "stack" not in spec["sandbox"]
    assert spec["relays"] == [
        {"listen_port": 4001, "unix": "/run/ale-iac/gateway.sock"},
        {"listen_port": 4002, "unix": "/run/ale-iac/sandbox.sock"},
    ]
    assert spec["model"] == {"api": "openai", "model": "m1", "base_url": "http://127.0.0.1:4001/v1"}
    assert spec["clis"] == {"codex": "/opt/ale-iac/clis/codex/bin/codex"}


def test_the_host_side_describes_the_inside(tmp_path: Path) -> None:
    executor = _executor(tmp_path)
    vm = executor.bridge("vm")
    assert vm.command == "/usr/bin/python3"
    assert vm.args == ["-m", "ale_iac.bridges", "vm", "--endpoint", "http://127.0.0.1:4002"]
    assert vm.env["PYTHONPATH"] == "/opt/ale-iac/runtime/src:/opt/ale-iac/runtime/site"
    assert ENDPOINT_TOKEN_ENV not in vm.env  # a secret: the entry adds it inside
    access = executor.model_access()
    assert (access.base_url, access.api_key) == ("http://127.0.0.1:4001/v1", "gw-secret-123456")
    assert executor.cli("codex") == "/opt/ale-iac/clis/codex/bin/codex"
    with pytest.raises(AleIacError, match="was not staged"):
        executor.cli("claude")
    labels = executor.labels()
    assert set(labels) >= {"ale-iac.home", "ale-iac.run", "ale-iac.unit", "ale-iac.owner-pid", "ale-iac.owner-start"}
    with pytest.raises(AleIacError, match="only inside the agent's container"):
        asyncio.run(executor.run(["true"], log_name="x.log"))


def test_the_host_side_files_are_the_work_dir(tmp_path: Path) -> None:
    executor = _executor(tmp_path)
    path = executor.write_text("notes/a.txt", "key api-secret-123456\n")
    assert path == str(tmp_path / "agent" / "notes" / "a.txt")
    assert executor.read_text("notes/a.txt") == f"key {REDACTED}\n"
    assert executor.exists("notes/a.txt") and not executor.exists("nope")
    with pytest.raises(ValueError, match="leaves the work dir"):
        executor.write_text("../escape.txt", "x")


def test_no_engine_says_how_to_start_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    with pytest.raises(AleIacError, match=r"scripts/dockerd\.sh"):
        docker_client(timeout=5)


def test_an_image_not_built_says_how_to_build_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ALE_IAC_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    with pytest.raises(AleIacError, match="ale-iac images build desktop"):
        ensure_docker_image("desktop")


def test_the_bundle_follows_the_image_python(tmp_path: Path) -> None:
    (tmp_path / "usr" / "bin").mkdir(parents=True)
    (tmp_path / "usr" / "bin" / "python3").symlink_to("python3.13")
    assert _python_version(tmp_path) == "3.13"
    (tmp_path / "usr" / "bin" / "python3").unlink()
    (tmp_path / "usr" / "bin" / "python3").write_text("")
    with pytest.raises(AleIacError, match="Python version"):
        _python_version(tmp_path)
