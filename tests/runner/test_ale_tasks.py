"""ALE's task format (cua-bench tasks) run unchanged: loading, cards, task data, staging, scores, and
`ale-iac evaluate` end to end on the `local` profile with the scripted agent."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from ale_iac.contract import LINUX_DESKTOP_PATHS, WINDOWS_DESKTOP_PATHS
from ale_iac.errors import ConfigError
from ale_iac.runner.ale_tasks import AleSandbox, AleTask, AleUnit, LocalTaskData, as_score, load_ale_task
from ale_iac.runner.evaluation import run_experiment
from ale_iac.runner.experiment import load_experiment
from ale_iac.runner.tasks import TaskDataMissingError, download_dir
from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.substrates.local.sandboxes import LocalSandboxState
from ale_iac.task import Evaluation
from tests.support.ale_tasks import make_ale_lab
from tests.support.sandbox import handle_of


@pytest.fixture
def lab(tmp_path: Path) -> Path:
    return make_ale_lab(tmp_path)


def _load(lab: Path, ref: str, store: bool = True) -> AleTask:
    return load_ale_task(lab / "ale" / "tasks" / ref, LocalTaskData(lab / "ale-data") if store else None)


def _unit(task: AleTask) -> AleUnit:
    unit = task.for_unit()
    assert isinstance(unit, AleUnit)
    return unit


# -- loading -----------------------------------------------------------------------------------------------


def test_a_task_loads_with_its_card_and_leaves_no_module_behind(lab: Path) -> None:
    task = _load(lab, "data/sum_numbers")
    assert task.id == "data.sum_numbers" and task.domain == "data" and task.name == "sum_numbers"
    assert task.card.snapshot == "cpu-free-ubuntu" and task.card.timeout_s == 240
    assert task.card.resources.vcpus == 1 and task.card.resources.memory_gb == 1
    for name in ("cua_bench", "score_outputs", "tasks", "tasks.ale_test_config", "scripts"):
        assert name not in sys.modules, name
    # main.py keeps what it imported, the stand-in cua_bench among them
    assert task.module.cb.__name__ == "ale_iac.compat.cua_bench"
    assert task.module.score_outputs.KIND == "sum"


def test_two_tasks_with_the_same_helper_module_name_each_get_their_own(lab: Path) -> None:
    first = _load(lab, "data/sum_numbers")
    second = _load(lab, "demo/upper_word")
    third = _load(lab, "data/sum_numbers")
    assert first.module.score_outputs.KIND == "sum" and third.module.score_outputs.KIND == "sum"
    assert second.module.score("agents", "AGENTS") == 1.0 and first.module.score_outputs.score("agents", "AGENTS") == 0


def test_a_module_of_the_same_name_loaded_before_is_left_as_it_was(lab: Path) -> None:
    sentinel = type(sys)("score_outputs")
    sys.modules["score_outputs"] = sentinel
    try:
        task = _load(lab, "demo/upper_word")
        assert sys.modules["score_outputs"] is sentinel and task.module.KIND == "upper"
    finally:
        del sys.modules["score_outputs"]


def test_load_runs_once_per_unit_and_its_description_is_the_prompt(lab: Path) -> None:
    task = _load(lab, "demo/secret_token")
    one, two = _unit(task), _unit(task)
    assert one.metadata["token"] != two.metadata["token"]  # a fresh load() per unit, kept for that unit
    assert one.instruction.startswith("ALE-SECRET: copy the token")
    assert one.describe() == {
        "format": "ale",
        "domain": "demo",
        "task": "secret_token",
        "variant": "v1",
        "requires_task_data": False,
        "task_data": None,
    }


def test_a_task_list_of_domain_task_lines_under_the_tasks_root(lab: Path) -> None:
    exp = lab / "exp.yaml"
    exp.write_text(
        json.dumps(
            {
                "name": "ale",
                "agents": ["ale-agent.yaml"],
                "tasks": ["ale/selected.txt", "demo/secret_token"],
                "tasks_root": "ale",
                "task_data": "ale-data",
                "profile": "local",
            }
        )
    )
    (lab / "ale" / "selected.txt").write_text("# two of them\ndata/sum_numbers\n\ndemo/upper_word  # the other\n")
    experiment = load_experiment(exp)
    assert [t.id for t in experiment.tasks] == ["data.sum_numbers", "demo.upper_word", "demo.secret_token"]
    (lab / "ale" / "selected.txt").write_text("data/nothing_here\n")
    with pytest.raises(ConfigError, match=r"selected\.txt: line 1: 'data/nothing_here' is not a task folder"):
        load_experiment(exp)


# -- cards -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", r"task_card\.json: not valid JSON"),
        ("[1, 2]", r"task_card\.json: a task card must be a JSON object"),
        ('{"vm": {"vcpus": "many"}}', r"task_card\.json: vm\.vcpus: "),
        ('{"vm": {"timeout_s": -5}}', r"task_card\.json: vm\.timeout_s: "),
        ('{"vm": "big"}', r"task_card\.json: vm: "),
        ('{"taskPrompt": 7}', r"task_card\.json: taskPrompt: "),
    ],
)
def test_a_malformed_card_names_the_file_and_the_field(lab: Path, text: str, message: str) -> None:
    (lab / "ale" / "tasks" / "demo" / "upper_word" / "task_card.json").write_text(text)
    with pytest.raises(ConfigError, match=message):
        _load(lab, "demo/upper_word")


def test_unknown_card_fields_are_kept_and_vm_timeout_is_the_fallback(lab: Path) -> None:
    card = lab / "ale" / "tasks" / "demo" / "upper_word" / "task_card.json"
    card.write_text(
        json.dumps(
            {
                "taskPrompt": "p",
                "newField": {"x": 1},
                "vm": {"machineType": "n2-standard-4", "timeout": 99, "zone": "z"},
            }
        )
    )
    task = _load(lab, "demo/upper_word")
    assert task.card.timeout_s == 99 and task.card.resources.machine_type == "n2-standard-4"
    assert task.card.snapshot is None and task.card.instruction == "p"


def test_a_main_without_an_evaluate_is_refused(lab: Path) -> None:
    main = lab / "ale" / "tasks" / "data" / "no_data" / "main.py"
    main.write_text(
        main.read_text().replace('@cb.evaluate_task(split="train")', "").replace("def evaluate", "def grade")
    )
    with pytest.raises(ConfigError, match=r"main\.py: evaluate_task: no function decorated"):
        _load(lab, "data/no_data")


# -- task data and scores ------------------------------------------------------------------------------------


def test_missing_task_data_is_its_own_error(lab: Path) -> None:
    with pytest.raises(TaskDataMissingError, match=r"data/no_data requires task data: no .*ale-data/data/no_data"):
        _load(lab, "data/no_data").for_unit()
    with pytest.raises(TaskDataMissingError, match="names no task_data store"):
        _load(lab, "data/sum_numbers", store=False).for_unit()
    assert _unit(_load(lab, "data/sum_numbers")).data == lab / "ale-data" / "data" / "sum_numbers" / "v1"


def test_scores_come_as_the_tasks_return_them() -> None:
    assert as_score([0.5, 0.25]) == Evaluation(0.5, {"raw_scores": [0.5, 0.25]})
    assert as_score({"score": 1, "why": "ok"}) == Evaluation(1.0, {"why": "ok"})
    assert as_score({"final_score": 0.5}) == Evaluation(0.5, {})
    assert as_score(0.75) == 0.75
    for odd in ([], ["x"], {"nope": 1}, True, None):
        assert as_score(odd) == odd  # left for the runner's check, which refuses them


# -- staging with file commands only ---------------------------------------------------------------------------


class FileClient:
    """An in-memory computer-server with the file commands; a shell command fails the test."""

    def __init__(self, sep: str) -> None:
        self.sep = sep
        self.files: dict[str, bytes] = {}
        self.dirs: set[str] = set()
        self.calls: list[str] = []

    async def run_command(self, command: str, timeout: float | None = None) -> Any:
        raise AssertionError(f"staging ran a shell command: {command}")

    async def make_dir(self, path: str) -> None:
        self.calls.append(f"make_dir {path}")
        parts = path.split(self.sep)
        for i in range(1, len(parts) + 1):
            self.dirs.add(self.sep.join(parts[:i]))

    async def write_bytes(self, path: str, data: bytes, append: bool = False) -> None:
        self.calls.append(f"write_bytes {path}")
        assert path.rsplit(self.sep, 1)[0] in self.dirs, f"no folder for {path}"
        self.files[path] = data

    async def dir_exists(self, path: str) -> bool:
        return path in self.dirs

    async def file_exists(self, path: str) -> bool:
        return path in self.files

    async def list_dir(self, path: str) -> list[str]:
        prefix = path + self.sep
        return sorted({p[len(prefix) :].split(self.sep)[0] for p in [*self.files, *self.dirs] if p.startswith(prefix)})

    async def read_bytes(self, path: str) -> bytes:
        return self.files[path]

    async def delete_file(self, path: str) -> None:
        self.calls.append(f"delete_file {path}")
        del self.files[path]

    async def delete_dir(self, path: str) -> None:
        self.calls.append(f"delete_dir {path}")
        assert not await self.list_dir(path), f"{path} is not empty"
        self.dirs.discard(path)


def _handle(os_name: str) -> SandboxHandle:
    return SandboxHandle(
        stack="-",
        unit="u",
        provider="static",
        endpoint="http://127.0.0.1:9",
        os=os_name,
        snapshot="cpu-free",
        image="ale-win10",
        resource_id="r",
        paths=WINDOWS_DESKTOP_PATHS if os_name == "windows" else LINUX_DESKTOP_PATHS,
    )


def test_staging_on_windows_uses_the_ale_root_and_backslashes(lab: Path) -> None:
    # A task whose metadata names no folders: they come from the sandbox's conventions.
    main = lab / "ale" / "tasks" / "data" / "sum_numbers" / "main.py"
    main.write_text(
        main.read_text().replace('metadata=task_metadata("data", "sum_numbers")', 'metadata={"variant_name": "v1"}')
    )
    unit = _unit(_load(lab, "data/sum_numbers"))
    client = FileClient("\\")
    client.files["E:\\agenthle\\data\\sum_numbers\\v1\\reference\\stale.txt"] = b"from an earlier unit"
    client.dirs.add("E:\\agenthle\\data\\sum_numbers\\v1\\reference")
    sandbox = unit.bind(_handle("windows"), client)  # type: ignore[arg-type]
    assert isinstance(sandbox, AleSandbox)
    root = "E:\\agenthle\\data\\sum_numbers\\v1"
    assert (sandbox.input_dir, sandbox.output_dir, sandbox.software_dir) == (
        f"{root}\\input",
        f"{root}\\output",
        f"{root}\\software",
    )
    assert asyncio.run(unit.stage_inputs(sandbox)) == 2
    assert set(client.files) == {f"{root}\\input\\numbers.txt", f"{root}\\software\\tool.txt"}
    assert f"{root}\\reference" not in client.dirs  # an earlier unit's reference is gone before the agent
    assert asyncio.run(unit.stage_reference(sandbox)) == 1
    assert client.files[f"{root}\\reference\\expected.txt"] == b"12\n"
    client.files[f"{root}\\output\\sub\\r.txt"] = b"result"
    client.dirs.add(f"{root}\\output\\sub")
    pulled = lab / "pulled"
    assert asyncio.run(download_dir(client, f"{root}\\output", pulled)) == 1  # type: ignore[arg-type]
    assert (pulled / "sub" / "r.txt").read_bytes() == b"result"


@pytest.mark.sandbox
def test_staging_against_a_real_sandbox_issues_no_shell_command(
    lab: Path, local_sandbox: LocalSandboxState, monkeypatch: pytest.MonkeyPatch
) -> None:
    unit = _unit(_load(lab, "data/sum_numbers"))
    handle = handle_of(local_sandbox)
    pulled = lab / "pulled"

    async def stage() -> tuple[int, int, bool, bool, int]:
        async with handle.client() as client:
            sandbox = unit.bind(handle, client)
            assert isinstance(sandbox, AleSandbox)
            commands: list[str] = []

            async def no_shell(command: str, timeout: float | None = None) -> Any:
                commands.append(command)
                raise AssertionError(f"staging ran a shell command: {command}")

            monkeypatch.setattr(client, "run_command", no_shell)
            staged = await unit.stage_inputs(sandbox)
            hidden = not await client.dir_exists(sandbox.reference_dir)
            await client.write_text(f"{sandbox.output_dir}/sum.txt", "12\n")
            referenced = await unit.stage_reference(sandbox)
            visible = await client.read_bytes(f"{sandbox.reference_dir}/expected.txt") == b"12\n"
            count = await download_dir(client, sandbox.output_dir, pulled)
            again = await unit.stage_inputs(sandbox)  # a reused sandbox: the reference goes again
            hidden = hidden and not await client.dir_exists(sandbox.reference_dir)
            assert commands == []
            return staged, referenced, hidden, visible, count + again * 0

    staged, referenced, hidden, visible, count = asyncio.run(stage())
    assert (staged, referenced, hidden, visible, count) == (2, 1, True, True, 1)
    assert (pulled / "sum.txt").read_text() == "12\n"


# -- end to end --------------------------------------------------------------------------------------------------


@pytest.mark.sandbox
@pytest.mark.engine
@pytest.mark.timeout(480)
def test_ale_tasks_run_unchanged_under_evaluate(lab: Path) -> None:
    exp = lab / "exp.yaml"
    exp.write_text(
        json.dumps(
            {
                "name": "ale",
                "agents": ["ale-agent.yaml"],
                "tasks": ["ale/selected.txt"],
                "tasks_root": "ale/tasks",
                "task_data": "ale-data",
                "profile": "local",
                "concurrency": 3,
                "output_root": "runs",
            }
        )
    )
    summary = run_experiment(load_experiment(exp))
    by_task = {o.task: o for o in summary.outcomes}
    for task in ("demo.secret_token", "demo.upper_word", "data.sum_numbers", "gui.type_line"):
        outcome = by_task[task]
        assert (outcome.status, outcome.score) == ("succeeded", 1.0), (task, outcome)
    sums = summary.run_dir / by_task["data.sum_numbers"].unit_id
    assert json.loads((sums / "eval_result.json").read_text())["details"] == {"got": "12"}
    assert (sums / "output" / "sum.txt").read_text() == "12\n"
    run = json.loads((sums / "run.json").read_text())
    assert run["phases"]["load"]["requires_task_data"] is True
    crash = by_task["demo.crash_eval"]
    assert crash.status == "eval_failed" and "ZeroDivisionError" in (crash.error or "")
    folder = summary.run_dir / crash.unit_id
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    [error] = [e for e in events if e["event"] == "hook_error"]
    assert "Traceback" in error["traceback"] and "divides by zero on purpose" in error["traceback"]
    assert "ZeroDivisionError" in (folder / "hooks.log").read_text()
    missing = by_task["data.no_data"]
    assert missing.status == "task_data_missing" and "requires task data" in (missing.error or "")
    assert missing.stack is None and missing.agent_s == 0  # no sandbox was asked for, no agent ran
    for name in ("cua_bench", "score_outputs", "tasks"):
        assert name not in sys.modules, name
