"""What a shared stack (``shared_stack: true``) refuses, before anything is made: a run whose units' sandboxes it
could not reset between units, or would have to keep. Its runs themselves: tests/runner/test_evaluate.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ale_iac.errors import ConfigError
from ale_iac.profile import CleanupMode, parse_profile, resolve_profile
from ale_iac.runner.evaluation import run_experiment
from ale_iac.runner.experiment import load_experiment
from ale_iac.runner.shared_stack import check_shared_stack
from tests.support.tasks import make_preset, make_task


def _experiment(tmp_path: Path, **fields: object) -> Path:
    make_task(tmp_path, "answer")
    make_preset(tmp_path, "writer", "WriterAgent")
    path = tmp_path / "exp.yaml"
    spec = {"name": "t", "agents": ["writer.yaml"], "tasks": ["answer"], "shared_stack": True, **fields}
    path.write_text(json.dumps(spec))
    return path


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"cleanup": "retain"}, "cleanup 'retain' cannot keep one"),
        ({"cleanup": "retain-on-failure"}, "cleanup 'retain-on-failure' cannot keep one"),
        ({"retain_below": 0.5}, "retain_below cannot keep one"),
        ({"profile": "static"}, "cannot be made fresh between units"),
    ],
)
def test_a_run_it_cannot_serve_is_refused_naming_the_file_and_field(
    tmp_path: Path, fields: dict[str, object], says: str
) -> None:
    path = _experiment(tmp_path, **fields)
    with pytest.raises(ConfigError) as caught:
        run_experiment(load_experiment(path))
    assert caught.value.source == str(path) and caught.value.field == "shared_stack"
    assert says in caught.value.detail
    assert not (tmp_path / "runs").exists()  # refused before the run's record, engine or any stack


def test_a_route_whose_units_cannot_be_made_fresh_is_refused(tmp_path: Path) -> None:
    """``reset: none`` (a unit leased as it is) could hand one unit's leftovers to the next; ``restore`` (the
    substrate's) and ``recreate`` (the engine's: ``ale_iac.runner.shared_slots``) are served."""
    local = resolve_profile("local").profile
    experiment = load_experiment(_experiment(tmp_path))
    for reset, served in (("none", False), ("recreate", True), ("restore", True)):
        data = local.model_dump(mode="json")
        for route in data["snapshots"].values():
            route["reset"] = reset
        profile = parse_profile(data, f"{reset}.yaml").profile
        if served:
            check_shared_stack(profile, experiment.units, CleanupMode.DESTROY, None, experiment.source)
            continue
        with pytest.raises(ConfigError, match=r"reset: none\) cannot be made fresh between units") as caught:
            check_shared_stack(profile, experiment.units, CleanupMode.DESTROY, None, experiment.source)
        assert caught.value.source == str(experiment.source) and caught.value.field == "shared_stack"


def test_with_a_pool_it_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="a pool's units are shared already"):
        load_experiment(_experiment(tmp_path, pool="some-pool"))
