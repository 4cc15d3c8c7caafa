"""A run that follows a model plan (``evaluate --model-plan``): the scripted model server in a process of its
own, no API key, and a plan error that ends the unit as an agent failure with its reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from ale_iac import procs
from ale_iac.errors import ConfigError
from ale_iac.runner import evaluation
from ale_iac.runner.experiment import load_experiment
from ale_iac.runner.model_plan import PlanServer
from ale_iac.runner.records import MANIFEST
from tests.support.cli import ale_iac
from tests.support.tasks import make_task

REPO = Path(__file__).resolve().parents[2]
ALE_CLAW = REPO / "agents" / "ale_claw" / "preset.yaml"
PLAN = {"scripts": [{"match": "list the files", "turns": [{"text": "Two files."}]}]}


def _experiment(tmp_path: Path, plan: Any = PLAN, **fields: object) -> Path:
    make_task(tmp_path, "answer")
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan))
    spec = {"name": "mp", "agents": [str(ALE_CLAW)], "tasks": ["answer"], "profile": "local"}
    spec |= {"model_plan": "plan.yaml", "output_root": str(tmp_path / "runs"), **fields}
    path = tmp_path / "exp.yaml"
    path.write_text(json.dumps(spec))
    return path


def _ask(root: str, key: str | None) -> httpx.Response:
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "list the files"}]}
    return httpx.post(root + "/v1/messages", json=body, headers={"x-api-key": key} if key else {}, timeout=30)


def test_the_plan_server_answers_only_its_key_and_is_stopped_by_its_pid(tmp_path: Path) -> None:
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(PLAN))
    server = PlanServer(tmp_path / "plan.yaml", tmp_path / "model_server.log")
    server.start()
    pid = server.pid
    try:
        upstream = server.upstream
        assert upstream.base_url("openai") == upstream.root + "/v1" and upstream.base_url("anthropic") == upstream.root
        assert _ask(upstream.root, upstream.api_key).json()["content"][0]["text"] == "Two files."
        assert _ask(upstream.root, "sk-some-other-key").status_code == 401
    finally:
        server.close()
    assert pid is not None and not procs.alive(pid)
    log = (tmp_path / "model_server.log").read_text()
    assert "served 1 request(s)" in log and upstream.api_key not in log


DIES = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from ale_iac.runner.model_plan import PlanServer
    server = PlanServer(Path(sys.argv[1]), Path(sys.argv[2]))
    server.start()
    print(server.pid, flush=True)
    os._exit(130)  # what a run's second interrupt does: no cleanup at all
    """
)


def test_the_plan_server_ends_with_its_run_however_the_run_ends(tmp_path: Path) -> None:
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(PLAN))
    done = subprocess.run(
        [sys.executable, "-c", DIES, str(tmp_path / "plan.yaml"), str(tmp_path / "log")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 130, done.stderr
    assert procs.wait_gone(int(done.stdout), None, timeout=30)


def test_a_bad_model_plan_fails_when_the_experiment_loads(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as missing:
        load_experiment(_experiment(tmp_path / "a", model_plan="no-such-plan.yaml"))
    assert (missing.value.field, missing.value.source) == ("model_plan", str(tmp_path / "a" / "exp.yaml"))
    bad = {"scripts": [{"match": "x", "turns": [{"tool": "run_command"}]}]}
    with pytest.raises(ConfigError) as invalid:
        load_experiment(_experiment(tmp_path / "b", bad))
    assert (invalid.value.source, invalid.value.field) == (str(tmp_path / "b" / "plan.yaml"), "scripts.0.turns.0.tool")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "writer.yaml").write_text("name: writer\ndeployer: tests.support.agents:WriterAgent\n")
    with pytest.raises(ConfigError, match="model_plan: no agent of this experiment uses a model"):
        load_experiment(_experiment(tmp_path / "c", agents=["writer.yaml"]))


def test_the_flag_names_a_plan_relative_to_the_current_folder(tmp_path: Path) -> None:
    bad = {"scripts": [{"match": "x", "turns": [{"fail": "http_999"}]}]}
    (tmp_path / "flag-plan.yaml").write_text(yaml.safe_dump(bad))
    done = ale_iac("evaluate", str(_experiment(tmp_path)), "--model-plan", str(tmp_path / "flag-plan.yaml"))
    assert done.returncode == 2, done.stderr
    assert f"{tmp_path / 'flag-plan.yaml'}: scripts.0.turns.0.fail" in done.stderr
    assert not (tmp_path / "runs").exists()


class _NoEngine:
    def __init__(self) -> None:
        raise AssertionError("an engine was made: the run got past its checks")


def test_a_run_that_follows_a_plan_needs_no_api_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(evaluation, "Engine", _NoEngine)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(AssertionError, match="an engine was made"):
        evaluation.run_experiment(load_experiment(_experiment(tmp_path)))
    spec = json.loads((tmp_path / "exp.yaml").read_text())
    (tmp_path / "exp.yaml").write_text(json.dumps({k: v for k, v in spec.items() if k != "model_plan"}))
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY is not set"):
        evaluation.run_experiment(load_experiment(tmp_path / "exp.yaml"))


@pytest.mark.sandbox
@pytest.mark.engine
@pytest.mark.timeout(480)
def test_a_plan_error_ends_the_unit_as_an_agent_failure_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No script matches the task: the agent gets an error answer (HTTP 400), and the unit ends
    ``agent_failed`` (graded on what it left) with the plan error, quoting the task's own text, as its reason."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    summary = evaluation.run_experiment(load_experiment(_experiment(tmp_path)))
    [outcome] = summary.outcomes
    unit = summary.run_dir / outcome.unit_id
    assert outcome.status == "agent_failed" and outcome.score == 0.0, outcome
    assert outcome.error is not None
    assert outcome.error.startswith("plan error: no script matches the prompt 'Answer the question in question.txt."), (
        outcome.error
    )
    run = json.loads((unit / "run.json").read_text())
    assert run["error"] == outcome.error and run["model_plan"]["file"] == str(tmp_path / "plan.yaml"), run
    manifest = json.loads((summary.run_dir / MANIFEST).read_text())
    assert manifest["model_plan"] == run["model_plan"]
    calls = json.loads((unit / "model_usage.json").read_text())["calls"]
    assert calls and calls[0]["status"] == 400 and calls[0]["upstream_error"] == outcome.error, calls
    events = [json.loads(line) for line in (unit / "events.jsonl").read_text().splitlines()]
    assert [e["error"] for e in events if e["event"] == "plan_error"] == [outcome.error]
    # The server was stopped by the run (it prints its totals when its stdin closes), its key nowhere.
    log = (summary.run_dir / "model_server.log").read_text()
    assert "PLAN ERROR: no script matches" in log and f"{len(calls)} plan error(s)" in log, log
    assert os.environ.get("ALE_IAC_MODEL_PLAN_KEY") is None
