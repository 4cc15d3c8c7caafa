"""``--resume``: which run it continues, what a crashed attempt left, and what counts as the same experiment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ale_iac import procs
from ale_iac.errors import AleIacError
from ale_iac.runner.evaluation import MANIFEST, latest_run_dir, recover_crashed_attempt
from ale_iac.runner.experiment import load_experiment
from ale_iac.runner.run_claims import RunRegistry, read_claims, runs_dir
from tests.support.tasks import make_preset, make_task


def _lab(tmp_path: Path, name: str, task: str = "answer") -> Path:
    if not (tmp_path / task).exists():
        make_task(tmp_path, task)
    if not (tmp_path / "writer.yaml").exists():
        make_preset(tmp_path, "writer", "WriterAgent")
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps({"name": name, "agents": ["writer.yaml"], "tasks": [task], "output_root": "runs"}))
    return path


def _fake_run(root: Path, run_id: str, name: str, mtime: float) -> Path:
    folder = root / run_id
    folder.mkdir(parents=True)
    (folder / MANIFEST).write_text(json.dumps({"run_id": run_id, "spec": {"name": name}}))
    os.utime(folder / MANIFEST, (mtime, mtime))
    return folder


def test_latest_run_is_found_by_the_name_in_its_manifest(tmp_path: Path) -> None:
    newcomer = load_experiment(_lab(tmp_path, "newcomer"))
    broken = load_experiment(_lab(tmp_path, "newcomer-broken"))
    root = newcomer.output_root
    assert latest_run_dir(newcomer) is None
    mine = _fake_run(root, "newcomer-20261201-040000-00001", "newcomer", 1_000)
    # newer, and its folder name starts with "newcomer-": the old pattern picked it
    theirs = _fake_run(root, "newcomer-broken-20261201-050000-00002", "newcomer-broken", 2_000)
    assert latest_run_dir(newcomer) == mine
    assert latest_run_dir(broken) == theirs
    newer = _fake_run(root, "newcomer-20261201-060000-00003", "newcomer", 3_000)
    assert latest_run_dir(newcomer) == newer


def _dead_pid() -> int:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    return int(proc.stdout)


def _claim(run_id: str, pid: int, stacks: list[str], retained: list[str]) -> None:
    runs_dir().mkdir(parents=True, exist_ok=True)
    data = {
        "run_id": run_id,
        "pid": pid,
        "pid_start": procs.start_time(pid),
        "run_dir": "",
        "stacks": stacks,
        "retained": retained,
    }
    (runs_dir() / f"{run_id}.json").write_text(json.dumps(data))


def test_resume_destroys_what_the_crashed_attempt_claimed_and_says_so(tmp_path: Path) -> None:
    _claim("t-1", _dead_pid(), ["run-a-1", "run-b-2"], ["run-kept-3"])
    _claim("other-run", _dead_pid(), ["run-other-4"], [])
    destroyed: list[str] = []
    said: list[str] = []

    def destroy(stack: str) -> bool:
        destroyed.append(stack)
        return stack != "run-b-2"  # already gone: not reported as destroyed

    assert recover_crashed_attempt("t-1", destroy, said.append) == ["run-a-1"]
    assert destroyed == ["run-a-1", "run-b-2"]  # never another run's stacks, never a retained one
    assert said == ["destroyed stack run-a-1, left by the crashed earlier attempt of this run"]
    # the resumed run keeps what the earlier attempt retained on purpose (gc must keep off it)
    registry = RunRegistry("t-1", tmp_path, keep_retained=True)
    registry.close()
    [claim] = [c for c in read_claims() if c.run_id == "t-1"]
    assert claim.retained == ["run-kept-3"] and claim.stacks == []
    assert recover_crashed_attempt("never-ran", destroy, said.append) == []


def test_resume_refuses_while_the_earlier_attempt_still_runs() -> None:
    _claim("t-2", os.getpid(), ["run-live-1"], [])
    with pytest.raises(AleIacError, match="still running"):
        recover_crashed_attempt("t-2", lambda stack: True, print)


@pytest.mark.parametrize(
    "change",
    [
        "main.py",  # a grading weight: one run would mix two graders
        "input/question.txt",
        "reference/answer.txt",
        "task.yaml",
    ],
)
def test_the_fingerprint_covers_what_decides_a_score(tmp_path: Path, change: str) -> None:
    path = _lab(tmp_path, "exp")
    before = load_experiment(path).fingerprint()
    assert load_experiment(path).fingerprint() == before  # stable
    target = tmp_path / "answer" / change
    target.write_text(target.read_text() + "\n# changed\n")
    assert load_experiment(path).fingerprint() != before


def test_the_fingerprint_covers_the_agent_preset_and_its_deployer(tmp_path: Path) -> None:
    path = _lab(tmp_path, "exp")
    before = load_experiment(path).fingerprint()
    preset = tmp_path / "writer.yaml"
    preset.write_text(preset.read_text() + "settings: {linger_s: 1}\n")
    with_settings = load_experiment(path).fingerprint()
    assert with_settings != before
    deployer = tmp_path / "deployer.py"
    deployer.write_text("from tests.support.agents import WriterAgent as Agent\n")
    preset.write_text("name: writer\ndeployer: deployer.py:Agent\n")
    first = load_experiment(path).fingerprint()
    deployer.write_text("from tests.support.agents import WriterAgent as Agent\nWEIGHT = 2\n")
    assert load_experiment(path).fingerprint() != first
