"""A task that allocates more memory than its shape gives it, through ``ale-iac evaluate`` on the
``local`` profile: the sandbox's memory limit kills it, and the unit's record says so (``limits`` and
``oom_kills`` in run.json, the ``oom_killed`` event, a line in the unit's error)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ale_iac.engine import Engine
from ale_iac.runner.evaluation import run_experiment
from ale_iac.runner.experiment import load_experiment
from ale_iac.substrates.local import sandboxes as local_sandboxes
from tests.support.tasks import make_task

# One xdist group: the module's tests on one worker (what they count is their own home's).
pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.engine,
    pytest.mark.needs_root,
    pytest.mark.xdist_group("unit-limits"),
    pytest.mark.timeout(480),
]

REPO = Path(__file__).resolve().parents[2]
HOG = "b = b'x' * (1536 * 2**20); open('{task_data_root}/hog/output/answer.txt', 'w').write('42')"
PRESET = {
    "name": "hog",
    "deployer": f"{REPO}/agents/scripted/deployer.py:ScriptedDeployer",
    "executor": "local",
    "settings": {
        "plans": [
            {
                "match": "question",
                "steps": [
                    # Touches 1.5 GiB in a sandbox of 0.75 GiB: the kernel kills it before it writes the answer.
                    {"bridge": "vm", "tool": "run_command", "args": {"command": f'python3 -c "{HOG}"'}},
                    {"bridge": "vm", "tool": "read_text", "args": {"path": "{task_data_root}/hog/output/answer.txt"}},
                ],
            }
        ]
    },
}


def test_a_task_over_its_memory_shape_is_killed_and_the_unit_is_marked_so(tmp_path: Path) -> None:
    make_task(tmp_path, "hog")
    card = tmp_path / "hog" / "task.yaml"
    card.write_text(card.read_text() + "resources: {memory_gb: 0.75}\n")
    (tmp_path / "hog.yaml").write_text(json.dumps(PRESET))
    spec = {"name": "oom", "agents": ["hog.yaml"], "tasks": ["hog"], "profile": "local"}
    (tmp_path / "exp.yaml").write_text(json.dumps(spec))

    summary = run_experiment(load_experiment(tmp_path / "exp.yaml", {}))

    [outcome] = summary.outcomes
    folder = summary.run_dir / outcome.unit_id
    run = json.loads((folder / "run.json").read_text())
    memory = next(limit for limit in run["limits"] if limit["name"] == "memory_gb")
    assert memory["applied"] and memory["requested"] == "0.75", memory
    assert str(int(0.75 * 2**30)) in memory["detail"], memory
    assert run["oom_kills"] >= 1, run
    # The answer was never written: the agent's read of it fails, and the unit's error says why.
    assert run["status"] == outcome.status == "agent_failed", run
    assert "memory limit (0.75 GiB) killed" in run["error"], run["error"]
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    [oom] = [e for e in events if e["event"] == "oom_killed"]
    assert oom["oom_kills"] == run["oom_kills"] and oom["memory_gb"] == "0.75", oom
    # Read before the cleanup, which then destroyed the sandbox as usual.
    kinds = [(e["event"], e.get("phase")) for e in events]
    assert kinds.index(("oom_killed", None)) < kinds.index(("phase_start", "cleanup")), kinds
    assert run["cleanup"]["outcome"] == "destroyed"
    assert Engine().list_stacks() == [] and local_sandboxes.list_sandboxes() == []


def test_a_unit_within_its_shape_records_its_limits_and_no_kill(tmp_path: Path) -> None:
    make_task(tmp_path, "answer")
    (tmp_path / "writer.yaml").write_text("name: writer\ndeployer: tests.support.agents:WriterAgent\n")
    spec = {"name": "fits", "agents": ["writer.yaml"], "tasks": ["answer"], "profile": "local"}
    (tmp_path / "exp.yaml").write_text(json.dumps(spec))

    summary = run_experiment(load_experiment(tmp_path / "exp.yaml", {}))

    [outcome] = summary.outcomes
    assert outcome.status == "succeeded" and outcome.error is None, outcome
    run = json.loads((summary.run_dir / outcome.unit_id / "run.json").read_text())
    assert run["oom_kills"] == 0 and {limit["name"] for limit in run["limits"]} >= {"pids_limit", "disk_gb"}, run
    events = (summary.run_dir / outcome.unit_id / "events.jsonl").read_text()
    assert "oom_killed" not in events
