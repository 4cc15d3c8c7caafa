"""What a unit's record says, without a sandbox: phases, hooks' output and tracebacks, evaluation details,
trajectory paths, attempts, and the summary's mean."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from mcp.types import CallToolResult, ImageContent
from rich.console import Console

from ale_iac.agent_sdk import AgentConfig, load_deployer_class
from ale_iac.cli.sandbox import handle_text
from ale_iac.egress_policy import EgressPolicy
from ale_iac.profile import CleanupMode
from ale_iac.runner.evaluation import RunSummary, mean_line, print_summary
from ale_iac.runner.experiment import UnitPlan
from ale_iac.runner.lifecycle import RunContext, UnitOutcome, _grade, _Unit, call_hook, relative_to_record
from ale_iac.runner.provisioners import NOTHING_TO_CLEAN, Pool, PoolProvisioner, keep_sandbox
from ale_iac.runner.records import Redactor, UnitRecord
from ale_iac.runner.run_claims import RunRegistry
from ale_iac.runner.status import UnitStatus
from ale_iac.runner.tasks import Task, load_task
from ale_iac.substrates.egress import UnitEgress
from ale_iac.task import TaskSandbox
from tests.support.tasks import make_task

REPO = Path(__file__).resolve().parents[2]
HOOKS = """
import logging
from ale_iac.task import Evaluation

log = logging.getLogger(__name__)


async def setup(sandbox):
    print("setting up", sandbox)
    log.info("staged %d files", 3)
    raise ValueError("weights do not sum to one")


async def evaluate(sandbox):
    print("grading")
    return Evaluation(0.75, {"errors": {"credit": 1.0, "weight": 0.5}, "warnings": {"credit": 0.5, "weight": 0.5}})
"""


def _task(tmp_path: Path, main: str) -> Task:
    folder = tmp_path / "hooked"
    folder.mkdir()
    (folder / "task.yaml").write_text("id: hooked\ninstruction: do it\n")
    (folder / "main.py").write_text(main)
    return load_task(folder)


def test_hook_output_and_traceback_go_into_the_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    task = _task(tmp_path, HOOKS)
    record = UnitRecord(tmp_path / "unit", Redactor())
    sandbox = cast(TaskSandbox, "<sandbox>")
    with pytest.raises(ValueError, match="weights"):
        asyncio.run(call_hook(task, "setup", sandbox, record))
    assert "setting up" not in capsys.readouterr().out  # not on the terminal: in the record
    log = (record.folder / "hooks.log").read_text()
    assert "setting up <sandbox>" in log and "INFO ale_tasks.hooked: staged 3 files" in log
    assert 'main.py", line 11, in setup' in log and "ValueError: weights do not sum to one" in log
    events = [json.loads(line) for line in (record.folder / "events.jsonl").read_text().splitlines()]
    [error] = [e for e in events if e["event"] == "hook_error"]
    assert error["hook"] == "setup" and "Traceback" in error["traceback"] and "line 11" in error["traceback"]
    assert record.event_counts["hook_error"] == 1  # what the unit's outcome points the console at


def test_the_summary_says_where_a_hooks_traceback_is_and_what_never_started(tmp_path: Path) -> None:
    failed = _outcome(UnitStatus.SETUP_FAILED, None)
    failed.error, failed.hook_traceback = "ValueError: weights", str(tmp_path / "u" / "hooks.log")
    summary = RunSummary("r", tmp_path, [failed], interrupted=True, not_started=["u2", "u3"])
    console = Console(file=io.StringIO(), width=300)
    print_summary(summary, console)
    printed = console.file.getvalue()  # type: ignore[attr-defined]
    assert f"u: a task hook raised; its traceback: {tmp_path / 'u' / 'hooks.log'}" in printed
    assert "not started (the run was interrupted first): 2" in printed


def test_hooks_running_side_by_side_keep_their_output_apart(tmp_path: Path) -> None:
    main = (
        "import asyncio\n\nasync def evaluate(sandbox):\n"
        + "".join(
            f"    print('{sandbox_line}', sandbox)\n    await asyncio.sleep(0.01)\n" for sandbox_line in ("a", "b", "c")
        )
        + "    return 1.0\n"
    )
    task = _task(tmp_path, main)
    records = [UnitRecord(tmp_path / f"u{i}", Redactor()) for i in range(3)]

    async def both() -> None:
        await asyncio.gather(*(call_hook(task, "evaluate", cast(TaskSandbox, i), r) for i, r in enumerate(records)))

    asyncio.run(both())
    for i, record in enumerate(records):
        lines = (record.folder / "hooks.log").read_text().splitlines()[1:]
        assert lines == [f"a {i}", f"b {i}", f"c {i}"]


def test_evaluate_may_return_details_beside_the_score(tmp_path: Path) -> None:
    task = _task(tmp_path, HOOKS)
    record = UnitRecord(tmp_path / "unit", Redactor())
    score = asyncio.run(_grade(task, cast(TaskSandbox, None), record))
    result = json.loads((record.folder / "eval_result.json").read_text())
    assert score == 0.75 and result["score"] == 0.75
    assert result["details"]["warnings"] == {"credit": 0.5, "weight": 0.5}
    assert "grading" in (record.folder / "hooks.log").read_text()


def _unit(tmp_path: Path) -> _Unit:
    make_task(tmp_path, "answer")
    plan = UnitPlan(
        unit_id="a__answer__r0",
        agent=AgentConfig(name="a", deployer="tests.support.agents:WriterAgent"),
        task=load_task(tmp_path / "answer"),
        repeat=0,
    )
    ctx = RunContext(
        run_id="r",
        run_dir=tmp_path / "run",
        provisioner=lambda _plan: cast(Any, None),
        registry=RunRegistry("r", tmp_path / "run"),
        cleanup=CleanupMode.DESTROY,
        unit_timeout_s=10,
        redactor=Redactor(),
        secrets_env={},
    )
    return _Unit(plan, ctx)


def test_a_failed_phase_says_so_with_its_error(tmp_path: Path) -> None:
    unit = _unit(tmp_path)

    async def phases() -> None:
        async with unit.phase("agent", UnitStatus.AGENT_FAILED) as done:
            done.update(ok=False, agent_status="failed", error="agent crashed")
        async with unit.phase("evaluate", UnitStatus.EVAL_FAILED):
            raise RuntimeError("evaluate blew up")

    with pytest.raises(RuntimeError):
        asyncio.run(phases())
    unit.record.write_run()
    phases_ = json.loads((unit.record.folder / "run.json").read_text())["phases"]
    assert phases_["agent"]["ok"] is False and phases_["agent"]["agent_status"] == "failed"
    assert phases_["evaluate"]["ok"] is False and phases_["evaluate"]["error"] == "RuntimeError: evaluate blew up"
    assert "seconds" in phases_["evaluate"]


def test_an_egress_that_fails_to_close_is_on_the_record_and_the_cleanup_still_runs(tmp_path: Path) -> None:
    unit = _unit(tmp_path)
    egress = UnitEgress("http://127.0.0.1:9", "x" * 32, EgressPolicy(allow=["allowed.test"]), root=tmp_path / "eg")
    egress._start_proxy()  # a real proxy, no channel: the record is what fails
    egress._wait_ready()
    unit.egress = egress
    (unit.record.folder / "egress.jsonl").mkdir()  # its attempts cannot be written: close_egress raises
    outcome = asyncio.run(unit.release(PoolProvisioner(Pool("p", {}), lease_timeout_s=1), None))
    assert outcome.cleanup == NOTHING_TO_CLEAN
    events = [json.loads(line) for line in (unit.record.folder / "events.jsonl").read_text().splitlines()]
    [failed] = [e for e in events if e["event"] == "egress_close_failed"]
    assert failed["error"].startswith("IsADirectoryError") and failed["left_for_gc"] is None  # the proxy stopped
    assert [e["phase"] for e in events if e["event"] == "phase_end"] == ["cleanup"]
    assert egress.proc is not None and egress.proc.poll() is not None and not egress.folder.exists()


def test_a_second_attempt_is_marked_in_the_events(tmp_path: Path) -> None:
    first = _unit(tmp_path)
    first.record.phase_start("setup")  # killed here: no phase_end, status running
    first.record.write_run(stack="run-first-1")
    first.record.close()
    again = _Unit(first.plan, first.ctx)
    again.record.close()
    events = [json.loads(line) for line in (first.record.folder / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["phase_start", "attempt"]
    assert events[1] | {"t": None} == {
        "t": None,
        "event": "attempt",
        "attempt": 2,
        "previous_status": "running",
        "previous_stack": "run-first-1",
    }
    assert json.loads((first.record.folder / "run.json").read_text())["attempt"] == 2


def test_screenshots_in_the_trajectory_are_relative_to_it() -> None:
    data = {
        "steps": [
            {"step_id": 1, "extra": {"screenshots": ["screenshots/step-1.png"]}},
            {"step_id": 2, "observation": {"results": [{"extra": {"screenshots": ["screenshots/step-2.png"]}}]}},
        ],
        "extra": {"status": "completed"},
    }
    out = relative_to_record(data, "agent")
    assert out["steps"][0]["extra"]["screenshots"] == ["agent/screenshots/step-1.png"]
    assert out["steps"][1]["observation"]["results"][0]["extra"]["screenshots"] == ["agent/screenshots/step-2.png"]
    assert out["extra"] == {"status": "completed", "artifacts_dir": "."}


class _Executor:
    """Just enough of an executor for the scripted deployer's records and trajectory."""

    def __init__(self, work_dir: Path) -> None:
        self.config = AgentConfig(
            name="scripted", deployer="deployer.py:ScriptedDeployer", source_dir=str(REPO / "agents" / "scripted")
        )
        self.work_dir = work_dir
        self.env: dict[str, str] = {}

    def write_text(self, rel: str, text: str) -> None:
        (self.work_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (self.work_dir / rel).write_text(text)

    def write_bytes(self, rel: str, data: bytes) -> None:
        (self.work_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (self.work_dir / rel).write_bytes(data)

    def exists(self, rel: str) -> bool:
        return (self.work_dir / rel).exists()

    def read_text(self, rel: str) -> str:
        return (self.work_dir / rel).read_text()


def test_scripted_trajectory_times_and_screenshot_names_match_its_steps(tmp_path: Path) -> None:
    executor = _Executor(tmp_path)
    deployer: Any = load_deployer_class(executor.config)(cast(Any, executor))
    png = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()
    outcome = deployer._outcome(1, CallToolResult(content=[ImageContent(type="image", data=png, mimeType="image/png")]))
    assert outcome.screenshots == ["screenshots/step-2.png"] and (tmp_path / "screenshots/step-2.png").exists()
    log = [
        {"type": "start", "t": "2026-12-01T04:00:00.000Z", "session_id": "s", "prompt": "do it", "plan_index": 0},
        {"type": "call", "t": "2026-12-01T04:00:02.000Z", "n": 1, "bridge": "cua", "tool": "screenshot",
         "arguments": {}, "result": "", "started_at": "2026-12-01T04:00:01.000Z", "screenshots": outcome.screenshots},
        {"type": "end", "t": "2026-12-01T04:00:03.000Z", "status": "completed"},
    ]  # fmt: skip
    executor.write_text("scripted/calls.jsonl", "".join(json.dumps(r) + "\n" for r in log))
    trajectory = deployer.parse_artifacts(SimpleNamespace(status="completed", error=None))
    user, call = trajectory.steps
    assert user.timestamp == "2026-12-01T04:00:00.000Z" and user.timestamp <= call.timestamp
    assert call.step_id == 2 and call.observation.results[0].extra["screenshots"] == ["screenshots/step-2.png"]


def _outcome(status: UnitStatus, score: float | None) -> UnitOutcome:
    return UnitOutcome("u", "a", "t", 0, status, score, None, None, "destroyed", 1.0, 1.0)


def test_the_mean_says_how_it_was_formed() -> None:
    outcomes = [
        _outcome(UnitStatus.SUCCEEDED, 1.0),
        _outcome(UnitStatus.AGENT_FAILED, 0.5),
        _outcome(UnitStatus.SETUP_FAILED, None),
    ]
    assert mean_line(outcomes) == (
        "mean score 0.750 over 2 graded unit(s) of 3; includes units whose agent did not complete, graded on what "
        "they left (1 agent_failed); not graded, so not in the mean: 1 setup_failed"
    )
    assert mean_line([_outcome(UnitStatus.SETUP_FAILED, None)]) is None


def test_retention_modes_and_the_threshold() -> None:
    ok, failed = UnitStatus.SUCCEEDED, UnitStatus.AGENT_FAILED
    assert not keep_sandbox(CleanupMode.DESTROY, failed, 0.0, None)
    assert keep_sandbox(CleanupMode.RETAIN, ok, 1.0, None)
    assert keep_sandbox(CleanupMode.RETAIN_ON_FAILURE, failed, 1.0, None)
    assert not keep_sandbox(CleanupMode.RETAIN_ON_FAILURE, ok, 0.2, None)
    assert keep_sandbox(CleanupMode.RETAIN_ON_FAILURE, ok, 0.2, 0.5)
    assert keep_sandbox(CleanupMode.DESTROY, ok, 0.2, 0.5)
    assert not keep_sandbox(CleanupMode.DESTROY, ok, 0.5, 0.5)
    assert not keep_sandbox(CleanupMode.DESTROY, UnitStatus.INTERRUPTED, None, 0.5)


def test_sandbox_create_prints_json_only_with_json() -> None:
    summary = {"stack": "sbx-local-abc", "endpoint": "http://127.0.0.1:1234", "labels": {"a": "b"}}
    assert json.loads(handle_text(summary, as_json=True)) == summary
    text = handle_text(summary, as_json=False)
    assert text.splitlines() == ["stack:    sbx-local-abc", "endpoint: http://127.0.0.1:1234", 'labels:   {"a": "b"}']
    with pytest.raises(ValueError):
        json.loads(text)
