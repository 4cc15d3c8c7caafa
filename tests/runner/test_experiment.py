"""Experiment specs, task folders and agent presets: loading and the errors bad input gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from ale_iac.errors import ConfigError
from ale_iac.runner.experiment import load_experiment

MAIN = "async def setup(sandbox):\n    pass\n\nasync def evaluate(sandbox):\n    return 1.0\n"
PRESET = "name: noop\ndeployer: ale_iac.agent_sdk:BaseAgentDeployer\n"


def _task(root: Path, task_id: str, card: str | None = None, main: str = MAIN) -> Path:
    folder = root / task_id
    folder.mkdir(parents=True)
    (folder / "task.yaml").write_text(card or f"id: {task_id}\ninstruction: do {task_id}\n")
    (folder / "main.py").write_text(main)
    return folder


def _experiment(tmp_path: Path, body: str) -> Path:
    (tmp_path / "noop.yaml").write_text(PRESET)
    path = tmp_path / "exp.yaml"
    path.write_text(body)
    return path


def test_units_are_agents_times_tasks_times_repeats(tmp_path: Path) -> None:
    _task(tmp_path / "tasks", "a")
    _task(tmp_path / "tasks", "b")
    (tmp_path / "list.txt").write_text("# two tasks\ntasks/a\n\ntasks/b  # second\n")
    path = _experiment(tmp_path, "name: e\nagents: [noop.yaml]\ntasks: [list.txt]\nrepeats: 2\n")
    experiment = load_experiment(path)
    assert [u.unit_id for u in experiment.units] == ["noop__a__r0", "noop__a__r1", "noop__b__r0", "noop__b__r1"]
    assert experiment.output_root == tmp_path / "runs"


def test_flags_override_the_file_and_change_the_fingerprint(tmp_path: Path) -> None:
    _task(tmp_path, "a")
    path = _experiment(tmp_path, "name: e\nagents: [noop.yaml]\ntasks: [a]\ncleanup: retain\n")
    plain = load_experiment(path)
    flagged = load_experiment(path, {"cleanup": "destroy", "concurrency": 4, "pool": "pool-x"})
    assert flagged.spec.cleanup is not None and flagged.spec.cleanup.value == "destroy"
    assert flagged.spec.concurrency == 4 and flagged.spec.pool == "pool-x" and flagged.spec.profile is None
    assert plain.fingerprint() != flagged.fingerprint()
    # Concurrency does not change what the units are, so it does not block --resume.
    assert load_experiment(path, {"concurrency": 3}).fingerprint() == plain.fingerprint()


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("name: e\nagents: [noop.yaml]\ntasks: [a]\nconcurency: 2\n", "exp.yaml: concurency: unknown key"),
        ("name: e\nagents: [noop.yaml]\ntasks: [a]\nrepeats: 0\n", "exp.yaml: repeats: Input should be greater"),
        ("name: e\nagents: [noop.yaml]\ntasks: [a]\ncleanup: sometimes\n", "exp.yaml: cleanup: Input should be"),
        ("name: e\nagents: [noop.yaml]\ntasks: [a]\nprofile: local\npool: p\n", "give either profile or pool"),
        ("name: e\nagents: [missing]\ntasks: [a]\n", "exp.yaml: agents: no agent preset 'missing'"),
        ("name: e\nagents: [noop.yaml]\ntasks: [nowhere]\n", "exp.yaml: tasks: 'nowhere' is neither"),
        ("name: e\nagents: [noop.yaml]\ntasks: [a, a]\n", "exp.yaml: tasks: task ids listed twice: a"),
        ("agents: [noop.yaml]\ntasks: [a]\n", "exp.yaml: name: required field is missing"),
    ],
)
def test_bad_experiments_name_the_file_and_field(tmp_path: Path, body: str, fragment: str) -> None:
    _task(tmp_path, "a")
    path = _experiment(tmp_path, body)
    with pytest.raises(ConfigError) as info:
        load_experiment(path)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("card", "main", "fragment"),
    [
        ("id: a\ninstruction: x\nresources: {vcpu: 2}\n", MAIN, "task.yaml: resources.vcpu: unknown key"),
        ("id: A B\ninstruction: x\n", MAIN, "task.yaml: id:"),
        ("id: a\n", MAIN, "task.yaml: instruction: required field is missing"),
        ("id: a\ninstruction: x\n", "def evaluate(sandbox):\n    return 1\n", "main.py: evaluate: must be an async"),
        ("id: a\ninstruction: x\n", "async def setup(s):\n    pass\n", "main.py: evaluate: missing"),
        ("id: a\ninstruction: x\n", "import nonexistent_mod\n", "main.py: import failed: ModuleNotFoundError"),
    ],
)
def test_bad_task_folders_name_the_file_and_field(tmp_path: Path, card: str, main: str, fragment: str) -> None:
    _task(tmp_path, "a", card=card, main=main)
    path = _experiment(tmp_path, "name: e\nagents: [noop.yaml]\ntasks: [a]\n")
    with pytest.raises(ConfigError) as info:
        load_experiment(path)
    assert fragment in str(info.value)


def test_bad_agent_preset_names_its_file(tmp_path: Path) -> None:
    _task(tmp_path, "a")
    path = _experiment(tmp_path, "name: e\nagents: [noop.yaml]\ntasks: [a]\n")
    (tmp_path / "noop.yaml").write_text(PRESET + "modell: x\n")
    with pytest.raises(ConfigError, match=r"noop\.yaml: modell: unknown key"):
        load_experiment(path)


def test_every_problem_of_the_spec_is_reported_at_once_with_the_closest_key(tmp_path: Path) -> None:
    _task(tmp_path, "a")
    path = _experiment(tmp_path, "name: e\nagents: [noop.yaml]\ntasks: [a]\nrepeats: 0\ntimout_s: 60\nconcurency: 2\n")
    with pytest.raises(ConfigError) as info:
        load_experiment(path)
    assert sorted(str(info.value).splitlines()) == [
        f"{path}: concurency: unknown key (did you mean 'concurrency'?)",
        f"{path}: repeats: Input should be greater than or equal to 1",
        f"{path}: timout_s: unknown key (did you mean 'unit_timeout_s'?)",
    ]


def test_problems_of_presets_and_tasks_are_reported_together(tmp_path: Path) -> None:
    _task(tmp_path, "a", card="id: a\ninstruction: x\ntimeout: 5\n")
    _task(tmp_path, "b")
    path = _experiment(tmp_path, "name: e\nagents: [noop.yaml, missing]\ntasks: [a, nowhere, b]\n")
    (tmp_path / "noop.yaml").write_text(PRESET + "modell: x\n")
    with pytest.raises(ConfigError) as info:
        load_experiment(path)
    lines = str(info.value).splitlines()
    assert lines[0] == f"{tmp_path / 'noop.yaml'}: modell: unknown key (did you mean 'model'?)"
    assert lines[1].startswith(f"{path}: agents: no agent preset 'missing'")
    assert lines[2] == f"{tmp_path / 'a' / 'task.yaml'}: timeout: unknown key (did you mean 'timeout_s'?)"
    assert lines[3] == f"{path}: tasks: 'nowhere' is neither a task folder nor a list file"
    assert len(lines) == 4
