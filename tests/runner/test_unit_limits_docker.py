"""A task whose card asks more CPUs than the host has, on the ``docker`` profile through ``ale-iac evaluate``:
the unit runs, fitted to the host, and its record says so with the numbers (``limits`` in run.json)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ale_iac.runner.evaluation import run_experiment
from ale_iac.runner.experiment import load_experiment
from ale_iac.substrates.docker import runtime
from tests.support.tasks import make_task

pytestmark = [pytest.mark.docker, pytest.mark.engine, pytest.mark.xdist_group("unit-limits"), pytest.mark.timeout(480)]


def test_a_card_asking_more_cpus_than_the_host_has_runs_fitted_and_says_so(tmp_path: Path, docker_image: str) -> None:
    client = runtime.client()
    try:
        host = runtime.host_resources(client)
    finally:
        client.close()
    asked = max(host.cpus, os.cpu_count() or 1) + 2
    make_task(tmp_path, "answer")
    card = tmp_path / "answer" / "task.yaml"
    card.write_text(card.read_text() + f"resources: {{vcpus: {asked}, memory_gb: 1}}\n")
    (tmp_path / "writer.yaml").write_text("name: writer\ndeployer: tests.support.agents:WriterAgent\n")
    spec = {"name": "big", "agents": ["writer.yaml"], "tasks": ["answer"], "profile": "docker"}
    (tmp_path / "exp.yaml").write_text(json.dumps(spec))

    summary = run_experiment(load_experiment(tmp_path / "exp.yaml", {"output_root": str(tmp_path / "runs")}))

    [outcome] = summary.outcomes
    assert outcome.status == "succeeded" and outcome.score == 1.0, outcome
    run = json.loads((summary.run_dir / outcome.unit_id / "run.json").read_text())
    cpu = next(limit for limit in run["limits"] if limit["name"] == "cpu")
    assert cpu["requested"] == str(asked) and not cpu["applied"], cpu
    assert f"fitted to the host: it has {host.cpus} CPUs, the shape asked {asked}" in cpu["detail"], cpu
    memory = next(limit for limit in run["limits"] if limit["name"] == "memory")
    assert memory["applied"] and memory["requested"] == "1GiB", memory
    assert run["cleanup"]["outcome"] == "destroyed"
