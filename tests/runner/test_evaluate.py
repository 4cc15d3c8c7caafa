"""`ale-iac evaluate` end to end: real engine, real local sandboxes, real records, nothing left behind."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from ale_iac.bridges.warm import sweep_stale as sweep_stale_bridges
from ale_iac.engine import Engine
from ale_iac.files import sweep_private_dirs
from ale_iac.runner.evaluation import RunSummary, print_summary, run_experiment
from ale_iac.runner.experiment import load_experiment
from ale_iac.runner.gc import collect
from ale_iac.runner.run_claims import read_claims
from ale_iac.runner.shared_slots import RECREATED, REMOVED
from ale_iac.substrates.local import sandboxes as local_sandboxes
from tests.support.engine import pulumi_clis
from tests.support.tasks import make_clean_slate_task, make_preset, make_task

# One xdist group (the module's tests on one worker; what they count is this test's home's, and the hanging
# agent's `sleep 3599` is this module's alone, so the other worker may run anything). Whole runs, up to 68 s
# each on a loaded 2-core host; the timeout lets their own deadlines (agents up in 240 s, then 180 s) fire first.
pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.engine,
    pytest.mark.xdist_group("evaluate-runs"),
    pytest.mark.timeout(480),
]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Path]:
    """A folder with trivial tasks and misbehaving agents; checks afterwards that nothing is left."""
    make_task(tmp_path, "answer")
    make_task(tmp_path, "answer-2")
    make_task(tmp_path, "broken-setup", fail_setup=True)
    make_preset(tmp_path, "writer", "WriterAgent")
    make_preset(tmp_path, "crash", "CrashAgent")
    make_preset(tmp_path, "sleepy", "SleepyAgent")
    make_preset(tmp_path, "secret", "SecretAgent", "secrets: [ALE_TEST_API_KEY]\n")
    yield tmp_path


def _experiment(lab: Path, agents: list[str], tasks: list[str], **fields: object) -> Path:
    spec = {"name": "t", "agents": [f"{a}.yaml" for a in agents], "tasks": tasks, "profile": "local", **fields}
    path = lab / "exp.yaml"
    path.write_text(json.dumps(spec))
    return path


def _run(path: Path, **overrides: object) -> RunSummary:
    return run_experiment(load_experiment(path, dict(overrides)))


def _agent_processes() -> list[str]:
    out = subprocess.run(["pgrep", "-af", "sleep 3599"], capture_output=True, text=True, check=False).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def _assert_nothing_left(engine: Engine | None = None) -> None:
    engine = engine or Engine()
    assert engine.list_stacks() == []
    assert local_sandboxes.list_sandboxes() == []
    assert not any(c.stacks for c in read_claims())
    # A killed agent is gone once the kernel delivers the kill (its runner may have just exited).
    deadline = time.monotonic() + 10
    while _agent_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _agent_processes() == []


def test_demo_experiment_scores_one_with_the_reference_agent(tmp_path: Path) -> None:
    summary = _run(REPO / "examples" / "demo.yaml", output_root=str(tmp_path), concurrency=3)
    assert {o.task for o in summary.outcomes} >= {"cli-log-stats", "gui-notepad", "mixed-clipboard-total"}
    assert all(o.status == "succeeded" and o.score == 1.0 for o in summary.outcomes), summary.outcomes
    for outcome in summary.outcomes:
        folder = summary.run_dir / outcome.unit_id
        run = json.loads((folder / "run.json").read_text())
        assert run["status"] == "succeeded" and run["cleanup"] == {"mode": "destroy", "outcome": "destroyed"}
        assert set(run["phases"]) >= {"provision", "ready", "setup", "agent", "evaluate", "cleanup"}
        trajectory = json.loads((folder / "trajectory.json").read_text())
        assert trajectory["schema_version"].startswith("ATIF") and len(trajectory["steps"]) > 1
        assert json.loads((folder / "eval_result.json").read_text())["score"] == 1.0
        events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
        assert events[0]["event"] == "phase_start" and events[-1]["phase"] == "cleanup"
    results = [json.loads(line) for line in (summary.run_dir / "results.jsonl").read_text().splitlines()]
    assert len(results) == len(summary.outcomes)
    _assert_nothing_left()


def test_a_shared_stack_run_makes_one_stack_and_resets_each_sandbox_between_units(lab: Path) -> None:
    """Four units at -j 2 on a shared stack: one ``up`` of two sandboxes and one ``destroy`` for the whole run,
    each sandbox used by two units in turn and reset between them (the task's setup refuses any file an earlier
    unit left in the home or /tmp, and leaves its own)."""
    make_clean_slate_task(lab, "clean-slate")
    summary = _run(_experiment(lab, ["writer"], ["clean-slate"], repeats=4, concurrency=2, shared_stack=True))
    assert [(o.status, o.score) for o in summary.outcomes] == [("succeeded", 1.0)] * 4, summary.outcomes
    assert {o.cleanup for o in summary.outcomes} == {"unit reset, lease released"}
    engine = Engine()
    logs = sorted((engine.home / "logs" / "stacks").glob("*.log"))
    [stack] = [log.stem for log in logs]
    assert "-shared-" in stack
    operations = [line.split()[2] for line in logs[0].read_text().splitlines() if line.startswith("====")]
    assert operations == ["up", "destroy"]  # the run's engine calls: no stack per unit
    leased: list[tuple[str, str]] = []
    for outcome in summary.outcomes:
        events = [
            json.loads(line) for line in (summary.run_dir / outcome.unit_id / "events.jsonl").read_text().splitlines()
        ]
        [lease] = [e for e in events if e["event"] == "leased"]
        leased.append((lease["stack"], lease["unit"]))
    assert {s for s, _ in leased} == {stack} and sorted(u for _, u in leased) == ["g0-u0", "g0-u0", "g0-u1", "g0-u1"]
    manifest = json.loads((summary.run_dir / "experiment.json").read_text())
    assert manifest["shared_stack"] is True
    assert not (engine.home / "leases" / stack).exists()
    _assert_nothing_left(engine)


def test_a_shared_stack_recreates_through_the_engine_and_removes_what_no_unit_needs(lab: Path) -> None:
    """A route reset by the engine (``reset: recreate``, as the clouds and kubernetes are): four units at -j 2 on a
    shared stack. The two sandboxes serve the first two units, are recreated (new sandboxes, checked clean by the
    task's setup) for the last two, then removed as each of those ends; one ``up``, targeted updates for those
    four changes (fewer when they coincide) and one ``destroy`` in all."""
    make_clean_slate_task(lab, "clean-slate")
    profile = yaml.safe_load((REPO / "stacks" / "Pulumi.local.yaml").read_text())
    profile["config"]["ale-iac:profile"]["snapshots"]["cpu-free-ubuntu"]["reset"] = "recreate"
    (lab / "Pulumi.recreating.yaml").write_text(yaml.safe_dump(profile))
    path = _experiment(lab, ["writer"], ["clean-slate"], repeats=4, concurrency=2, shared_stack=True)
    summary = _run(path, profile=str(lab / "Pulumi.recreating.yaml"))
    assert [(o.status, o.score) for o in summary.outcomes] == [("succeeded", 1.0)] * 4, summary.outcomes
    assert sorted(o.cleanup for o in summary.outcomes) == [REMOVED, REMOVED, RECREATED, RECREATED]
    engine = Engine()
    [log] = sorted((engine.home / "logs" / "stacks").glob("*.log"))
    assert "-shared-" in log.stem
    operations = [" ".join(line.split()[2:-2]) for line in log.read_text().splitlines() if line.startswith("====")]
    assert operations[0] == "up" and operations[-1] == "destroy", operations
    assert 2 <= len(operations[1:-1]) <= 4 and set(operations[1:-1]) == {"up --target"}, operations
    sandboxes: dict[str, list[str]] = {}
    for outcome in summary.outcomes:
        folder = summary.run_dir / outcome.unit_id
        [lease] = [
            e for e in map(json.loads, (folder / "events.jsonl").read_text().splitlines()) if e["event"] == "leased"
        ]
        handle = json.loads((folder / "run.json").read_text())["handle"]
        sandboxes.setdefault(lease["unit"], []).append(handle["resource_id"])
    assert sorted(sandboxes) == ["g0-u0", "g0-u1"]
    assert all(len(set(ids)) == 2 for ids in sandboxes.values()), sandboxes  # each slot: a new sandbox the 2nd time
    _assert_nothing_left(engine)


def test_a_wrong_plan_scores_below_one(tmp_path: Path) -> None:
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        json.dumps(
            {
                "name": "wrong",
                "agents": [str(REPO / "agents" / "scripted" / "wrong.yaml")],
                "tasks": [str(REPO / "examples" / "tasks" / "cli-log-stats")],
                "profile": "local",
            }
        )
    )
    summary = _run(exp, output_root=str(tmp_path / "runs"))
    [outcome] = summary.outcomes
    assert outcome.score is not None and outcome.score < 1.0
    _assert_nothing_left()


def test_cleanup_modes_do_what_they_say(lab: Path) -> None:
    engine = Engine()
    destroyed = _run(_experiment(lab, ["writer"], ["answer"], cleanup="destroy"))
    assert [o.cleanup for o in destroyed.outcomes] == ["destroyed"] and engine.list_stacks() == []

    retained = _run(_experiment(lab, ["writer", "crash"], ["answer"], cleanup="retain-on-failure", concurrency=2))
    by_agent = {o.agent: o for o in retained.outcomes}
    assert by_agent["writer"].cleanup == "destroyed" and by_agent["writer"].score == 1.0
    kept = by_agent["crash"]
    assert kept.cleanup == "retained" and kept.handle is not None
    assert [s.name for s in engine.list_stacks()] == [kept.stack]
    # gc leaves a retained stack alone; destroying it by hand leaves nothing.
    assert collect(engine).destroyed == []
    assert kept.stack is not None
    engine.destroy(kept.stack)
    assert local_sandboxes.list_sandboxes() == []

    everything = _run(_experiment(lab, ["writer"], ["answer"], cleanup="retain"))
    [unit] = everything.outcomes
    assert unit.cleanup == "retained" and unit.handle is not None
    assert unit.handle["endpoint"].startswith("http://127.0.0.1:")
    assert unit.stack is not None
    engine.destroy(unit.stack)
    _assert_nothing_left(engine)


def test_failures_get_the_right_status_and_leave_nothing(lab: Path) -> None:
    path = _experiment(lab, ["crash", "sleepy", "writer"], ["answer"], unit_timeout_s=5, concurrency=3)
    crash_sleep = _run(path)
    status = {o.agent: o.status for o in crash_sleep.outcomes}
    assert status == {"crash": "agent_failed", "sleepy": "agent_timeout", "writer": "succeeded"}
    sleepy = next(o for o in crash_sleep.outcomes if o.agent == "sleepy")
    assert "exceeded its 5 s limit" in (sleepy.error or "")
    assert 5 <= sleepy.agent_s < 30
    # A unit whose agent failed is still graded, and keeps the agent's status.
    crash = next(o for o in crash_sleep.outcomes if o.agent == "crash")
    assert crash.score is not None
    assert (crash_sleep.run_dir / crash.unit_id / "eval_result.json").is_file()
    # The summary says why, in one line per unit.
    console = Console(file=io.StringIO(), width=400)
    print_summary(crash_sleep, console)
    printed = console.file.getvalue()  # type: ignore[attr-defined]
    assert "reason" in printed and "exceeded its 5 s limit" in printed
    console = Console(file=io.StringIO(), width=400)
    setup = run_experiment(load_experiment(_experiment(lab, ["writer"], ["broken-setup"])), console=console)
    [broken] = setup.outcomes
    assert broken.status == "setup_failed" and "setup fails on purpose" in (broken.error or "")
    run = json.loads((setup.run_dir / broken.unit_id / "run.json").read_text())
    assert run["status"] == "setup_failed" and run["cleanup"]["outcome"] == "destroyed"
    # The console says where the hook's traceback is, as the unit ends and in the summary.
    hooks_log = setup.run_dir / broken.unit_id / "hooks.log"
    assert broken.hook_traceback == str(hooks_log) and "Traceback" in hooks_log.read_text()
    print_summary(setup, console)
    printed = console.file.getvalue()  # type: ignore[attr-defined]
    assert f"setup fails on purpose (the hook's traceback: {hooks_log})" in printed
    assert f"{broken.unit_id}: a task hook raised; its traceback: {hooks_log}" in printed
    _assert_nothing_left()


def test_a_sandbox_that_never_becomes_ready_is_recorded_and_destroyed(lab: Path) -> None:
    profile = lab / "Pulumi.dead.yaml"
    profile.write_text(
        "config:\n  ale-iac:profile:\n    name: dead\n    ready_timeout_s: 2\n    snapshots:\n"
        "      cpu-free-ubuntu: {provider: static, endpoints: ['http://127.0.0.1:9']}\n"
    )
    summary = _run(_experiment(lab, ["writer"], ["answer"]), profile=str(profile))
    [unit] = summary.outcomes
    assert unit.status == "not_ready"
    assert "http://127.0.0.1:9" in (unit.error or "") and "last error" in (unit.error or "")
    _assert_nothing_left()


def test_secrets_appear_nowhere_in_the_run_folder(lab: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-test-8f3b2c1d9e7a"
    monkeypatch.setenv("ALE_TEST_API_KEY", secret)
    summary = _run(_experiment(lab, ["secret"], ["answer"]))
    [unit] = summary.outcomes
    assert unit.status == "succeeded" and unit.score == 1.0
    files = [p for p in summary.run_dir.rglob("*") if p.is_file()]
    assert any(p.name == "answer.txt" for p in files)  # the output was pulled back
    for path in files:
        assert secret.encode() not in path.read_bytes(), f"secret leaked into {path}"
    assert secret not in Engine().log_path(unit.stack or "").read_text()
    _assert_nothing_left()


def test_resume_skips_finished_units_and_refuses_a_changed_experiment(lab: Path) -> None:
    path = _experiment(lab, ["writer"], ["answer", "answer-2"])
    first = _run(path)
    assert len(first.outcomes) == 2
    resumed = run_experiment(load_experiment(path), resume=True)
    assert resumed.run_dir == first.run_dir and resumed.outcomes == [] and len(resumed.skipped) == 2
    path.write_text(path.read_text().replace('"answer-2"', '"broken-setup"'))
    with pytest.raises(Exception, match="experiment changed"):
        run_experiment(load_experiment(path), resume=True)
    _assert_nothing_left()


def _start_run(lab: Path, agents: list[str], tasks: list[str], **fields: object) -> subprocess.Popen[str]:
    path = _experiment(lab, agents, tasks, **fields)
    return subprocess.Popen(
        [sys.executable, "-m", "ale_iac", "evaluate", str(path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _wait_for_agents(lab: Path, count: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 240
    while len(list(lab.glob("runs/*/*/agent/agent.log"))) < count:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() < deadline, "agents never started"
        time.sleep(0.2)


def test_sigint_during_four_units_leaves_nothing(lab: Path) -> None:
    proc = _start_run(lab, ["sleepy"], ["answer"], repeats=4, concurrency=4, unit_timeout_s=600)
    _wait_for_agents(lab, 4, proc)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 130, out
    assert "destroying in-flight units" in out
    runs = list(lab.glob("runs/*/*/run.json"))
    assert [json.loads(p.read_text())["status"] for p in runs] == ["interrupted"] * 4
    # The summary lists every interrupted unit, with its cleanup.
    table = out[out.index("results: ") :]
    for unit in (p.parent.name for p in runs):
        [row] = [line for line in table.splitlines() if unit in line]
        assert "interrupted" in row and "destroyed" in row, row
    _assert_nothing_left()


def _wait_for_a_held_up(engine: Engine) -> tuple[list[str], str]:
    """Two stacks at -j 1: the running unit's, and the next unit's, locked by its held ``up``; their names, and
    the held one's."""
    deadline = time.monotonic() + 120
    while len(stacks := [stack.name for stack in engine.list_stacks()]) < 2 or not (
        held := [stack for stack in stacks if engine.is_locked(stack)]
    ):
        assert time.monotonic() < deadline, "the next unit's stack was never made ahead, with its up held"
        time.sleep(0.2)
    return stacks, held[0]


def test_sigint_while_units_wait_removes_the_stack_made_ahead_for_the_next(lab: Path) -> None:
    """At -j 1 the next unit's stack is made (``stack init``) while the current unit runs, and its ``up`` started
    and held before it declares anything (``provision.UpAhead``); an interrupt then lets that ``up`` end with
    nothing declared and destroys the stack with the running unit's, and the unit after it never got one."""
    proc = _start_run(lab, ["sleepy"], ["answer"], repeats=3, concurrency=1, unit_timeout_s=600)
    _wait_for_agents(lab, 1, proc)
    engine = Engine()
    _wait_for_a_held_up(engine)
    assert len(engine.list_stacks()) == 2 and len(local_sandboxes.list_sandboxes()) == 1
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 130, out
    statuses = [json.loads(p.read_text())["status"] for p in lab.glob("runs/*/*/run.json")]
    assert statuses == ["interrupted"]  # the waiting units never started
    assert "not started (the run was interrupted first): 2" in out
    logs = {log: log.read_text() for log in (engine.home / "logs" / "stacks").glob("run-*.log")}
    operations = [
        tuple(line.split()[2] for line in text.splitlines() if line.startswith("====")) for text in logs.values()
    ]
    assert operations == [("up", "destroy")] * 2
    # The running unit's stack had a sandbox; the one made ahead, none.
    assert sorted(text.count("LocalSandbox") > 0 for text in logs.values()) == [False, True], logs
    _assert_nothing_left(engine)


@pytest.fixture
def private_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temp folder of the test's own (``TMPDIR``, here and for the runs it starts), short enough for the Unix
    sockets made in it. gc sweeps a killed run's folders from the temp folder of whoever runs it, so in the
    shared /tmp a gc of another test (on the other worker) may sweep this test's first, and this one's finds
    nothing (seen)."""
    folder = Path(tempfile.mkdtemp(prefix="ale-t-"))
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR anew
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_sigkilled_shared_stack_run_is_recovered_by_gc(lab: Path, private_tmp: Path) -> None:
    proc = _start_run(lab, ["sleepy"], ["answer"], repeats=3, concurrency=2, unit_timeout_s=600, shared_stack=True)
    _wait_for_agents(lab, 2, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    engine = Engine()
    [stack] = engine.list_stacks()
    assert "-shared-" in stack.name and len(local_sandboxes.list_sandboxes()) == 2
    records = engine.home / "state" / ".ale-iac" / "leases" / stack.name  # lease records and dirty markers
    assert (engine.home / "leases" / stack.name).is_dir() and records.is_dir()  # held when the run was killed
    report = collect(engine)
    assert report.destroyed == [stack.name] and report.errors == []
    assert not (engine.home / "leases" / stack.name).exists()
    assert not records.exists()
    _assert_nothing_left(engine)


def test_a_sigkilled_run_is_fully_recovered_by_gc(lab: Path, private_tmp: Path) -> None:
    proc = _start_run(lab, ["sleepy"], ["answer"], repeats=2, concurrency=2, unit_timeout_s=600)
    _wait_for_agents(lab, 2, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    engine = Engine()
    assert len(engine.list_stacks()) == 2 and len(local_sandboxes.list_sandboxes()) == 2
    dry = collect(engine, dry_run=True)
    assert len(dry.destroyed) == 2 and len(engine.list_stacks()) == 2
    # The run's warm bridge process died with its group, leaving its socket's folder: gc removes it.
    assert dry.warm_bridges_removed and sweep_stale_bridges(dry_run=True)
    assert all(Path(folder).parent == private_tmp for folder in dry.warm_bridges_removed)
    report = collect(engine)
    assert sorted(report.destroyed) == sorted(dry.destroyed) and report.errors == []
    assert report.warm_bridges_removed == dry.warm_bridges_removed and sweep_stale_bridges(dry_run=True) == []
    assert sweep_private_dirs(dry_run=True) == []  # the bridges' token files of the killed run
    _assert_nothing_left(engine)


def test_a_held_up_ends_with_its_sigkilled_runner_and_gc_recovers_the_run(lab: Path, private_tmp: Path) -> None:
    """The runner alone SIGKILLed (as the OOM killer does) while the next unit's ``up`` is held: that ``up``'s CLI
    loses its program and ends by itself (its lock left behind, as any CLI's that dies), and gc removes both
    stacks."""
    proc = _start_run(lab, ["sleepy"], ["answer"], repeats=2, concurrency=1, unit_timeout_s=600)
    _wait_for_agents(lab, 1, proc)
    engine = Engine()
    stacks, held = _wait_for_a_held_up(engine)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 60
    while pulumi_clis(held):
        assert time.monotonic() < deadline, f"the held up of {held} outlived its runner"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)  # what else of the run is left (its agent's processes, its bridges)
    report = collect(engine)
    assert sorted(report.destroyed) == sorted(stacks) and report.errors == []
    _assert_nothing_left(engine)
