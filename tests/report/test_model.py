"""Reading a run back from its record: finished, failed, caught midway, or tampered with."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from ale_iac.report import load_run
from ale_iac.report.compare import compare
from tests.support.runs import Unit, grid, make_run


def test_a_finished_run_reads_back_unit_by_unit(tmp_path: Path) -> None:
    run = load_run(make_run(tmp_path, [Unit(screenshots=3, tokens=True), Unit(task="t2", state="agent_failed")]))
    assert run.experiment == "synth" and run.run_id == "synth-20261201-040000-00001" and not run.in_progress
    ok, failed = run.units
    assert (ok.status, ok.score, ok.cleanup_mode, ok.cleanup_outcome) == ("succeeded", 1.0, "destroy", "destroyed")
    assert [p.name for p in ok.phases] == ["provision", "ready", "setup", "agent", "evaluate", "cleanup"]
    assert ok.phase_seconds()["provision"] == 3.0 and ok.phases[1].offset_s == 3.0
    assert ok.trajectory is not None and ok.trajectory.screenshots == 3 and ok.trajectory.tool_calls == 7
    assert ok.trajectory.tokens == {"prompt_tokens": 8400.0, "completion_tokens": 560.0}
    assert ok.errors == [] and ok.logs == [] and ok.outputs == [("answer.txt", 3)]
    # The failed unit: the agent's error (once, though run.json says it too) with the events before it,
    # the tool error, its log's end.
    assert failed.failed and failed.status == "agent_failed" and failed.score == 0.0
    kinds = [(e.kind, e.phase) for e in failed.errors]
    assert kinds == [("phase failed", "agent"), ("tool error", "agent")]
    assert failed.errors[0].message == "agent crashed (exit -11)" and failed.errors[0].context[-1].kind == "phase_start"
    assert failed.errors[1].step_id == 7 and "No such file" in failed.errors[1].message
    [log] = failed.logs
    assert log.name == "agent/agent.log" and log.text.endswith("Segmentation fault\n")
    assert run.mean_score == 0.5 and run.count("failed") == 1


def test_a_run_caught_midway_reads_as_far_as_it_got(tmp_path: Path) -> None:
    units = [
        Unit(task="done"),
        Unit(task="broken", state="setup_failed"),
        Unit(task="busy", state="running"),
        Unit(task="stopped", state="interrupted"),
        Unit(task="later", state="queued"),
    ]
    now = dt.datetime(2026, 12, 1, 4, 1, 0, tzinfo=dt.UTC)
    run = load_run(make_run(tmp_path, units), now=now)
    assert run.in_progress and run.problems == []
    by_task = {u.task: u for u in run.units}
    busy = by_task["busy"]
    assert busy.running and busy.current_phase == "agent" and busy.finished_at is None
    assert busy.phases[-1].seconds is None and busy.problems == []  # the half-written last event line is no problem
    assert busy.elapsed_s(now) == 55.0  # started at +5 s on the run's clock
    assert by_task["later"].queued and by_task["later"].phases == []
    broken = by_task["broken"]
    # Said three times in the record (the hook's error, the phase's end, the unit's error): shown once,
    # with the hook's traceback and its output.
    [error] = broken.errors
    assert (error.kind, error.phase, error.message) == ("hook_error", "setup", "RuntimeError: setup fails on purpose")
    assert error.detail is not None and error.detail.startswith("Traceback")
    assert [log.name for log in broken.logs] == ["hooks.log"] and "staging..." in broken.logs[0].text
    assert broken.trajectory is None and broken.failed
    stopped = by_task["stopped"]
    assert stopped.status == "interrupted" and [(e.kind, e.phase) for e in stopped.errors] == [("interrupted", "agent")]
    assert run.count("running") == 1 and run.count("queued") == 1 and run.count("failed") == 2


def test_missing_and_broken_files_are_listed_not_fatal(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, [Unit(), Unit(task="t2")])
    (run_dir / "experiment.json").unlink()
    (run_dir / "synthetic__task-1__r0" / "run.json").write_text("{not json")
    (run_dir / "synthetic__t2__r0" / "trajectory.json").write_text('{"steps": [{"source": 7, "tool_calls": "x"}]}')
    events = run_dir / "synthetic__t2__r0" / "events.jsonl"
    lines = events.read_text().splitlines()
    events.write_text("\n".join([lines[0], "garbage", *lines[1:]]) + "\n")
    run = load_run(run_dir)
    assert any("experiment.json is missing" in p for p in run.problems)
    assert [u.unit_id for u in run.units] == ["synthetic__t2__r0", "synthetic__task-1__r0"]
    second, first = run.units
    assert any("run.json: not readable JSON" in p for p in first.problems)
    assert first.phases and first.status == "running"  # no run.json end: as a unit still going
    assert "events.jsonl line 2: not JSON; skipped" in second.problems
    assert second.trajectory is not None and second.trajectory.steps[0].unreadable
    assert any(p.startswith("step 1: unreadable") for p in second.problems)


def test_a_screenshot_path_cannot_leave_the_record(tmp_path: Path) -> None:
    secret = tmp_path / "outside.png"
    secret.write_bytes(b"\x89PNG not yours")
    run_dir = make_run(tmp_path / "runs", [Unit(screenshots=2)])
    unit_dir = run_dir / "synthetic__task-1__r0"
    (unit_dir / "agent" / "screenshots" / "link.png").symlink_to(secret)
    trajectory = json.loads((unit_dir / "trajectory.json").read_text())
    results = [r for s in trajectory["steps"] for r in (s.get("observation") or {}).get("results", [])]
    shots = [r for r in results if (r.get("extra") or {}).get("screenshots")]
    shots[0]["extra"]["screenshots"] = ["screenshots/link.png"]
    shots[1]["extra"]["screenshots"] = ["../../../../outside.png"]
    (unit_dir / "trajectory.json").write_text(json.dumps(trajectory))
    [unit] = load_run(run_dir).units
    assert unit.trajectory is not None and unit.trajectory.screenshots == 0
    assert sum("points outside the unit's record" in p for p in unit.problems) == 2


def test_two_runs_compare_per_agent_and_task(tmp_path: Path) -> None:
    this = load_run(make_run(tmp_path, grid(1, 2, repeats=2, screenshots=0)))
    units = grid(1, 2, repeats=2, screenshots=0)
    units[0].state = "agent_failed"  # agent0 on task-0 scores 0 in one of its two repeats
    units[3].state = "queued"  # task-1's second repeat never ran
    other = load_run(make_run(tmp_path, units, stamp="20261202-040000-00002"))
    result = compare(this, other)
    assert result.same_experiment
    rows = {(r.agent, r.task): r for r in result.rows}
    task0 = rows[("agent0", "task-0")]
    assert task0.this is not None and task0.other is not None
    assert (task0.this.units, task0.this.score, task0.other.units, task0.other.score) == (2, 1.0, 2, 0.5)
    assert task0.score_delta == 0.5
    assert task0.seconds_delta is not None and abs(task0.seconds_delta) < 1.0
    task1 = rows[("agent0", "task-1")]
    assert task1.other is not None and task1.other.units == 1 and task1.score_delta == 0.0


def test_an_agent_failure_recorded_by_an_older_runner_is_still_shown(tmp_path: Path) -> None:
    """Records made before phases carried ``ok: false`` have the agent's error in run.json only."""
    run_dir = make_run(tmp_path, [Unit(state="agent_failed", screenshots=0)])
    events = run_dir / "synthetic__task-1__r0" / "events.jsonl"
    events.write_text(events.read_text().replace('"ok": false', '"ok": true'))
    [unit] = load_run(run_dir).units
    first = unit.errors[0]
    assert (first.kind, first.phase, first.message) == ("agent_failed", "agent", "agent crashed (exit -11)")
    assert unit.errors[0].context[-1].kind == "phase_end"


DOCKER_SETUP = {
    "profile": "docker",
    "profile_file": "/src/stacks/Pulumi.docker.yaml",
    "pool": None,
    "agents": [{"name": "synthetic", "executor": "docker", "model": "claude-x", "model_base_url": None}],
}


def test_where_a_run_ran_comes_from_its_manifest_or_an_older_records_spec(tmp_path: Path) -> None:
    run = load_run(make_run(tmp_path, [Unit()], setup=DOCKER_SETUP))
    assert (run.profile, run.profile_file, run.pool) == ("docker", "/src/stacks/Pulumi.docker.yaml", None)
    setup = run.agent_setup("synthetic")
    assert setup is not None and (setup.executor, setup.model) == ("docker", "claude-x")
    # A manifest from before it said so: the spec names no profile or pool (so `local`), and the unit's
    # run.json names no executor (the deployer's default, unknown here) and no model.
    older = load_run(make_run(tmp_path, [Unit()], stamp="20261202-040000-00002"))
    assert (older.profile, older.pool) == ("local", None)
    [agent] = older.agent_setups
    assert (agent.name, agent.executor, agent.model) == ("synthetic", None, None)
    assert compare(run, older).setup_differs and not compare(run, run).setup_differs


def test_what_the_grader_returned_beside_the_score_is_read(tmp_path: Path) -> None:
    details = {"errors": {"credit": 1.0, "weight": 0.5}, "warnings": 0}
    graded, plain = load_run(make_run(tmp_path, [Unit(details=details), Unit(task="t2")])).units
    assert graded.grading == details and plain.grading == {}
