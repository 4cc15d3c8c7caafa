"""Fail fast: what can be checked before a sandbox exists fails ``evaluate`` before anything is provisioned."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from ale_iac.agent_sdk import AgentConfig, load_deployer_class
from ale_iac.errors import ConfigError
from ale_iac.runner import evaluation
from ale_iac.runner.experiment import load_experiment
from tests.support.tasks import make_task

REPO = Path(__file__).resolve().parents[2]
SCRIPTED = REPO / "agents" / "scripted"


class _NoEngine:
    """Stands in for the engine: constructing it is the first step towards a stack."""

    def __init__(self) -> None:
        raise AssertionError("an engine was made: the run got past its checks")


def _experiment(tmp_path: Path, preset: dict[str, Any], **fields: object) -> Path:
    make_task(tmp_path, "answer")
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(preset))
    spec = {"name": "ff", "agents": ["agent.yaml"], "tasks": ["answer"], "profile": "local", **fields}
    path = tmp_path / "exp.yaml"
    path.write_text(json.dumps(spec))
    return path


def _scripted(steps: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "name": "typo",
        "deployer": str(SCRIPTED / "deployer.py") + ":ScriptedDeployer",
        "settings": {"plans": [{"match": ".", "steps": steps}]},
    }


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([{"bridge": "vm", "tool": "run_comand", "args": {"command": "true"}}], "has no tool 'run_comand'"),
        ([{"bridge": "vm", "tool": "run_command", "args": {"cmd": "true"}}], "no argument 'cmd'"),
        ([{"bridge": "vm", "tool": "run_command"}], "needs the argument 'command'"),
        ([{"bridge": "cua", "tool": "click", "args": {"coordinate": "400,300"}}], "argument 'coordinate' must be"),
        ([{"bridge": "vm", "tool": "run_command", "args": {"command": 3}}], "argument 'command' must be string"),
        ([{"bridge": "gui", "tool": "click"}], "settings.plans.0.steps.0.bridge"),
    ],
)
def test_a_bad_scripted_plan_fails_before_any_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, steps: list[dict[str, Any]], message: str
) -> None:
    monkeypatch.setattr(evaluation, "Engine", _NoEngine)
    experiment = load_experiment(_experiment(tmp_path, _scripted(steps)))
    with pytest.raises(ConfigError, match=message):
        evaluation.run_experiment(experiment)
    assert not (tmp_path / "runs").exists()  # no run folder either


def test_a_deployer_that_does_not_import_fails_before_any_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(evaluation, "Engine", _NoEngine)
    (tmp_path / "broken.py").write_text("import no_such_module_anywhere\n")
    for deployer, message in (
        ("broken.py:Agent", "importing .*broken.py failed: ModuleNotFoundError"),
        ("no.such.module:Agent", "cannot import no.such.module"),
        ("tests.support.agents:NoSuchAgent", "is not a BaseAgentDeployer subclass"),
    ):
        experiment = load_experiment(_experiment(tmp_path, {"name": "x", "deployer": deployer}))
        with pytest.raises(ConfigError, match=message):
            evaluation.run_experiment(experiment)
        (tmp_path / "answer").rename(tmp_path / f"answer-{len(deployer)}")  # make_task again next round


def test_a_missing_secret_and_an_unknown_executor_fail_before_any_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(evaluation, "Engine", _NoEngine)
    monkeypatch.delenv("ALE_TEST_NOT_SET", raising=False)
    preset = {"name": "s", "deployer": "tests.support.agents:WriterAgent", "secrets": ["ALE_TEST_NOT_SET"]}
    with pytest.raises(ConfigError, match="ALE_TEST_NOT_SET is not set"):
        evaluation.run_experiment(load_experiment(_experiment(tmp_path, preset)))
    (tmp_path / "answer").rename(tmp_path / "answer-old")
    preset = {"name": "s", "deployer": "tests.support.agents:WriterAgent", "executor": "ssh"}
    with pytest.raises(ConfigError, match="unknown executor 'ssh'"):
        evaluation.run_experiment(load_experiment(_experiment(tmp_path, preset)))


def test_the_shipped_presets_pass_the_checks() -> None:
    experiment = load_experiment(REPO / "examples" / "demo.yaml")
    evaluation.check_agents(experiment)
    for preset in ("preset.yaml", "wrong.yaml"):
        data = yaml.safe_load((SCRIPTED / preset).read_text())
        config = AgentConfig.model_validate({**data, "source_dir": str(SCRIPTED)})
        load_deployer_class(config).validate_config(config, evaluation.bridge_tools())


@pytest.mark.parametrize("executor", ["sandbox", "docker"])
def test_a_deployer_the_executor_would_not_ship_fails_before_any_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, executor: str
) -> None:
    """The sandbox and docker executors ship the preset folder (and ale_iac) only: a deployer named by an
    absolute path, or a module outside ale_iac, loads on this host but would not exist where it runs."""
    monkeypatch.setattr(evaluation, "Engine", _NoEngine)
    elsewhere = str(REPO / "agents" / "claude_code" / "deployer.py") + ":ClaudeCodeDeployer"
    preset = {"name": "cc", "deployer": elsewhere, "executor": executor, "model": "m"}
    with pytest.raises(ConfigError) as info:
        evaluation.run_experiment(load_experiment(_experiment(tmp_path, preset)))
    assert (info.value.source, info.value.field) == (str(tmp_path / "agent.yaml"), "deployer")
    assert "outside the preset folder" in info.value.detail and f"the {executor} executor ships" in info.value.detail
    (tmp_path / "answer").rename(tmp_path / "answer-old")
    preset = {**preset, "deployer": "tests.support.agents:WriterAgent"}
    with pytest.raises(ConfigError, match=f"module 'tests.support.agents' is not shipped by the {executor} executor"):
        evaluation.run_experiment(load_experiment(_experiment(tmp_path, preset)))
    assert not (tmp_path / "runs").exists()
    # The same deployer file runs on this host under the local executor: its preset passes.
    evaluation.check_agents(
        load_experiment(_experiment(tmp_path / "local", {**preset, "deployer": elsewhere, "executor": "local"}))
    )
