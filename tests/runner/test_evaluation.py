"""What the runner writes about a run before any unit starts: where it runs, for reports and comparisons."""

from __future__ import annotations

from pathlib import Path

from ale_iac.profile import resolve_profile, stacks_dir
from ale_iac.runner.evaluation import setup_record
from ale_iac.runner.experiment import load_experiment
from tests.support.tasks import make_preset, make_task


def test_the_manifest_says_which_profile_executor_and_model_a_run_uses(tmp_path: Path) -> None:
    make_task(tmp_path, "answer")
    make_preset(tmp_path, "writer", "WriterAgent")
    make_preset(
        tmp_path, "modeled", "WriterAgent", "executor: local\nmodel: {name: m-1, base_url: 'http://127.0.0.1:9'}\n"
    )
    path = tmp_path / "exp.yaml"
    path.write_text("name: x\nagents: [writer.yaml, modeled.yaml]\ntasks: [answer]\n")
    experiment = load_experiment(path)
    record = setup_record(experiment, resolve_profile("local"))
    assert record == {
        "profile": "local",
        "profile_file": str(stacks_dir() / "Pulumi.local.yaml"),
        "pool": None,
        "shared_stack": False,
        "agents": [
            {"name": "writer", "executor": "local", "model": None, "model_base_url": None},
            {"name": "modeled", "executor": "local", "model": "m-1", "model_base_url": "http://127.0.0.1:9"},
        ],
    }
    pooled = load_experiment(path, {"pool": "local"})
    assert setup_record(pooled, None) | {"agents": []} == {
        "profile": None,
        "profile_file": None,
        "pool": "local",
        "shared_stack": False,
        "agents": [],
    }
