"""The real Claude Code and Codex CLIs (from npm) through ``ale-iac evaluate``, end to end: a scripted
model server on 127.0.0.1 plays the model, the run's gateway stands between, and each CLI solves the
demo task cli-log-stats for real in a sandbox.

* ``sandbox`` executor: the in-sandbox shape, on each substrate (``local``, ``docker``, ``qemu``) with the
  same deployers. The deployer and the CLI are carried into the sandbox; the CLI uses its own shell for the
  work and the cua bridge for a screenshot, and reaches its model through the unit's model channel (carried
  back over the unit's endpoint). This is docs/models.md's dry run as printed: the shipped presets,
  ``--model-plan`` and the run's own scripted model server (on another profile with ``--profile``).
* ``docker`` executor: the out-of-sandbox shape. The same deployer classes run in a container; the
  CLIs have no shell of their own and do everything through the vm and cua bridges.

Checked each time: the score, the trajectory made from the CLI's real transcript (the bridge calls
and their results), the usage the gateway recorded against what the model server served, and that the
API key appears nowhere: not in the run folder, not in the sandbox (its files and its processes'
environments, searched after the run), and that the model server saw it (the gateway swapped it in).
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ale_iac.engine import Engine, read_unit_handle
from ale_iac.llm.plan import Plan, load_plan
from ale_iac.llm.scripted import ScriptedModelServer
from ale_iac.runner import evaluation
from ale_iac.runner.evaluation import RunSummary, run_experiment
from ale_iac.runner.experiment import load_experiment
from ale_iac.runner.model_plan import PlanServer
from tests.support.runs import bridge_calls
from tests.support.sandbox import Endpoint, run
from tests.support.tasks import TCG_TASK_TIMEOUT_S, with_timeout
from tests.test_docs_models import dry_run_command

pytestmark = [pytest.mark.sandbox, pytest.mark.engine, pytest.mark.agent_clis, pytest.mark.timeout(600)]
# The xdist group per case, not per module: xdist joins every group mark a test has into one group, and the qemu
# case belongs to the qemu group alone (one TCG guest pair at a time on this host's two cores).
REAL_CLIS = pytest.mark.xdist_group("real-cli-agents")

REPO = Path(__file__).resolve().parents[2]
TASK = REPO / "examples" / "tasks" / "cli-log-stats"
PLAN_FILE = REPO / "examples" / "plans" / "cli-log-stats.yaml"
KEY_ENV = "ALE_TEST_MODEL_KEY"
OUT = "/data/tasks/cli-log-stats/output"
SUMMARY = (
    "cd /data/tasks/cli-log-stats && "
    "e=$(cat input/logs/*.log | grep -c ' level=ERROR '); "
    "w=$(cat input/logs/*.log | grep -c ' level=WARN '); "
    "t=$(grep -h ' level=ERROR ' input/logs/*.log | sed -E 's/.* host=([^ ]+) .*/\\1/' | sort | uniq -c "
    "| sort -rn | head -n 1 | awk '{print $2}'); "
    'printf \'errors=%s\\nwarnings=%s\\ntop_host=%s\\n\' "$e" "$w" "$t" > output/summary.txt && echo written'
)
PLANS = {
    # In the sandbox: the CLI's own shell does the work; the cua bridge looks at the screen.
    "sandbox": [
        {"tool": "shell", "arguments": {"command": SUMMARY}, "usage": {"input_tokens": 1000, "output_tokens": 50}},
        {"tool": "mcp:cua.screenshot", "arguments": {}, "usage": {"input_tokens": 1100, "output_tokens": 10}},
        {"text": "The summary is written.", "usage": {"input_tokens": 1200, "output_tokens": 8}},
    ],
    # Outside: everything through the two bridges.
    "docker": [
        {
            "tool": "mcp:vm.run_command",
            "arguments": {"command": SUMMARY},
            "usage": {"input_tokens": 900, "output_tokens": 40},
        },
        {"tool": "mcp:cua.screenshot", "arguments": {}, "usage": {"input_tokens": 950, "output_tokens": 10}},
        {"tool": "mcp:vm.read_text", "arguments": {"path": f"{OUT}/summary.txt"}},
        {"text": "The summary is written.", "usage": {"input_tokens": 1000, "output_tokens": 8}},
    ],
}
AGENTS = {"claude-code": "claude_code", "codex": "codex"}


@pytest.fixture
def model_key(monkeypatch: pytest.MonkeyPatch) -> str:
    key = "sk-test-" + secrets.token_urlsafe(24)
    monkeypatch.setenv(KEY_ENV, key)
    return key


def lab(tmp_path: Path, executor: str, server: ScriptedModelServer) -> Path:
    """Copies of the two agents' folders with presets pointed at the scripted server, and the experiment."""
    agents = []
    for name, folder in AGENTS.items():
        copy = tmp_path / folder
        shutil.copytree(REPO / "agents" / folder, copy, ignore=shutil.ignore_patterns("__pycache__"))
        preset = yaml.safe_load((copy / "preset.yaml").read_text())
        base = server.base_url + ("/v1" if name == "codex" else "")
        preset.update(
            executor=executor,
            model={"name": "scripted-model", "base_url": base, "api_key_secret": KEY_ENV},
        )
        (copy / "preset.yaml").write_text(yaml.safe_dump(preset))
        agents.append(f"{folder}/preset.yaml")
    spec = {
        "name": f"cli-{executor}",
        "agents": agents,
        "tasks": [str(TASK)],
        "profile": "local",
        "concurrency": 2,
        "cleanup": "retain",
        "unit_timeout_s": 240,
        "output_root": str(tmp_path / "runs"),
    }
    path = tmp_path / "exp.yaml"
    path.write_text(json.dumps(spec))
    return path


@pytest.fixture
def engine() -> Iterator[Engine]:
    engine = Engine()
    before = {s.name for s in engine.list_stacks()}
    yield engine
    for stack in engine.list_stacks():
        if stack.name not in before:
            engine.destroy(stack.name)


# Every file of the unit changed since ``$since`` (its inode's ctime: set by the kernel on every write, rename or
# chmod, and by nothing user space can ask for), then every process's environment. The key was made for this run,
# so it can only be in a file written since the run began: the image's untouched files (gigabytes) need no reading.
# ``$since`` is this host's clock at the run's start where the unit shares it (local, docker); in a guest, the
# guest's own boot time (``btime``; its clock only moves on from there, and the image's files were all written
# before it booted, its saved state included).
KEY_SEARCH = (
    "find / \\( -path /proc -o -path /sys -o -path /dev \\) -prune -o -type f -newerct @$since -print0 2>/dev/null"
    ' | xargs -0 -r grep -lF -- "$k" 2>/dev/null; grep -lF -- "$k" /proc/[0-9]*/environ 2>/dev/null; true'
)


def assert_key_nowhere(key: str, run_dir: Path, units: list[Endpoint], since: float | None) -> None:
    """The key in no file of the run's record, and in no file nor process environment of its units: files
    changed since ``since`` (this host's clock), or since the unit's boot where it keeps a clock of its own
    (``since`` None)."""
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), f"the API key is in {path}"
    half = len(key) // 2
    start = str(int(since) - 1) if since is not None else "$(awk '/^btime/ {print $2}' /proc/stat)"
    for unit in units:
        search = run(
            unit,
            f"k={key[:half]}{key[half:]}; since={start}; {KEY_SEARCH}",
            # A unit under TCG reads its files slowly: on a loaded host that can take minutes, not the usual 60 s.
            http_timeout=600,
        )
        assert search["stdout"] == "", f"the API key is in the sandbox: {search['stdout']}"


@pytest.mark.parametrize("clock", ["host", "boot"])
def test_the_key_search_finds_a_key_written_since_the_start(
    computer_server_endpoint: Endpoint, tmp_path: Path, clock: str
) -> None:
    """What ``assert_key_nowhere`` relies on: a file written after ``since`` (on disk and on a tmpfs) and a
    process's environment are found, by either clock."""
    key = "sk-test-" + secrets.token_urlsafe(24)
    since = time.time() if clock == "host" else None
    record = tmp_path / "record"
    record.mkdir()
    seeded = run(
        computer_server_endpoint,
        f"mkdir -p /root/.keytest && echo {key} > /root/.keytest/disk && echo {key} > /tmp/keytest-tmpfs && "
        f"(K={key} sleep 60 >/dev/null 2>&1 &) && echo ok",
    )
    assert seeded["stdout"].strip() == "ok", seeded
    try:
        with pytest.raises(AssertionError) as found:
            assert_key_nowhere(key, record, [computer_server_endpoint], since)
        for where in ("/root/.keytest/disk", "/tmp/keytest-tmpfs", "/environ"):
            assert where in str(found.value), found.value
    finally:
        run(computer_server_endpoint, "rm -rf /root/.keytest /tmp/keytest-tmpfs; pkill -f 'sleep 60' ; true")


def dry_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, profile: str) -> tuple[RunSummary, dict[str, int], str]:
    """docs/models.md's dry run as printed (the shipped presets, ``--model-plan``, no key in the environment)
    on ``profile``, retaining the sandboxes; the served totals from the run's scripted model server, and its
    throwaway key. On ``qemu`` (TCG here) the task's limit is raised (``with_timeout``), nothing else."""
    for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    started: list[PlanServer] = []

    class Recorded(PlanServer):
        def start(self) -> None:
            super().start()
            started.append(self)

    monkeypatch.setattr(evaluation, "PlanServer", Recorded)
    argv = dry_run_command()
    overrides = {
        "model_plan": str(REPO / argv[argv.index("--model-plan") + 1]),
        "cleanup": "retain",
        "profile": profile,
    }
    if profile == "qemu":
        overrides["tasks"] = [str(with_timeout(TASK, tmp_path))]
        overrides["unit_timeout_s"] = TCG_TASK_TIMEOUT_S
    experiment = load_experiment(REPO / argv[1], {**overrides, "output_root": str(tmp_path / "runs")})
    summary = run_experiment(experiment)
    log = (summary.run_dir / "model_server.log").read_text()
    found = re.search(r"served (\d+) request\(s\), (\d+) input and (\d+) output tokens; 0 plan error\(s\)", log)
    assert found, log
    # Claude Code sends its preset's model name; Codex its scripted_name (so that it offers its MCP tools).
    assert "(anthropic, claude-sonnet-4-5)" in log and "(openai, scripted-model)" in log, log
    served = dict(zip(("requests", "input_tokens", "output_tokens"), map(int, found.groups()), strict=True))
    return summary, served, started[0].key


@pytest.mark.parametrize(
    ("executor", "profile"),
    [
        pytest.param("sandbox", "local", marks=REAL_CLIS),
        pytest.param("sandbox", "docker", marks=[pytest.mark.docker, REAL_CLIS], id="sandbox-on-docker"),
        pytest.param(
            "sandbox", "qemu", marks=[pytest.mark.qemu, pytest.mark.xdist_group("qemu")], id="sandbox-on-qemu"
        ),
        pytest.param("docker", "local", marks=[pytest.mark.docker, REAL_CLIS]),
    ],
)
def test_real_clis_solve_a_task_through_the_gateway(
    executor: str, profile: str, tmp_path: Path, model_key: str, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In the sandbox: the docs' dry run (``--model-plan``) exactly, on each substrate; in a container: the
    presets pointed at a scripted model server of the test's own, with a key of its own."""
    began = time.time()
    if executor == "sandbox":
        summary, served, model_key = dry_run(tmp_path, monkeypatch, profile)
        assert (
            load_plan(PLAN_FILE).scripts[0].turns
            == Plan.model_validate({"scripts": [{"match": ".", "turns": PLANS["sandbox"]}]}).scripts[0].turns
        )
    else:
        plan = Plan.model_validate({"scripts": [{"match": "summary.txt", "turns": PLANS[executor]}]})
        with ScriptedModelServer(plan, api_key=model_key) as server:
            summary = run_experiment(load_experiment(lab(tmp_path, executor, server)))
            served = server.usage_served()
            assert server.plan_errors == []
    by_agent = {o.agent: o for o in summary.outcomes}
    assert set(by_agent) == set(AGENTS)
    handles = []
    total = {"requests": 0, "input_tokens": 0, "output_tokens": 0}
    for name, outcome in by_agent.items():
        unit = summary.run_dir / outcome.unit_id
        assert outcome.status == "succeeded" and outcome.score == 1.0, (outcome, (unit / "events.jsonl").read_text())
        trajectory = json.loads((unit / "trajectory.json").read_text())
        calls = bridge_calls(trajectory)
        names = [c[0] for c in calls]
        assert any("screenshot" in n for n in names), names
        if executor == "docker":
            run_cmd = next(c for c in calls if c[0].endswith("run_command"))
            assert "written" in run_cmd[1] and not run_cmd[2], run_cmd
            read = next(c for c in calls if c[0].endswith("read_text"))
            assert "errors=" in read[1], read
        else:
            shell = calls[0]
            assert "written" in shell[1] and not shell[2], shell
        assert trajectory["final_metrics"]["total_tool_calls"] == len(PLANS[executor]) - 1
        usage = json.loads((unit / "model_usage.json").read_text())
        assert usage["errors"] == 0 and usage["refused"] == 0, usage
        assert usage["requests"] == len(PLANS[executor]), (name, usage)
        for field in total:
            total[field] += usage[field]
        assert outcome.stack is not None
        handles.append(read_unit_handle(outcome.stack, None))
    assert total == served
    units = [Endpoint(handle.endpoint, handle.token()) for handle in handles]
    assert_key_nowhere(model_key, summary.run_dir, units, since=None if profile == "qemu" else began)


@REAL_CLIS
@pytest.mark.parametrize("cleanup", ["retain-on-failure", "destroy"])
def test_a_unit_timeout_kills_the_in_sandbox_agent(
    cleanup: str, tmp_path: Path, model_key: str, engine: Engine
) -> None:
    """The model never answers (a stream that starts and hangs): each CLI waits until the unit's
    deadline. Then it is dead before cleanup, whether the unit is retained or destroyed, and its record says
    why. (``retain`` takes the same path as ``retain-on-failure`` for a unit that failed; the cleanup modes
    themselves are tested in tests/runner/test_evaluate.py.)"""
    plan = Plan.model_validate({"scripts": [{"match": "summary.txt", "turns": [{"fail": "hang"}]}]})
    with ScriptedModelServer(plan, api_key=model_key) as server:
        path = lab(tmp_path, "sandbox", server)
        spec = json.loads(path.read_text())
        path.write_text(json.dumps({**spec, "cleanup": cleanup, "unit_timeout_s": 15}))
        summary = run_experiment(load_experiment(path))
    for outcome in summary.outcomes:
        unit = summary.run_dir / outcome.unit_id
        assert outcome.status == "agent_timeout", outcome
        result = json.loads((unit / "agent_result.json").read_text())
        assert result["status"] == "timeout" and "15 s" in result["error"], result
        trajectory = json.loads((unit / "trajectory.json").read_text())
        assert "exceeded its 15 s limit" in trajectory["steps"][-1]["message"], trajectory["steps"][-1]
        if cleanup == "destroy":
            assert outcome.cleanup == "destroyed"
            continue
        assert outcome.cleanup == "retained" and outcome.stack is not None
        handle = read_unit_handle(outcome.stack, None)
        left = run(
            Endpoint(handle.endpoint, handle.token()),
            "pgrep -af 'ale_iac[.]executors[.]entry|claude[.]exe|/code[x]|ale_iac[.]bridges'; true",
        )
        assert left["stdout"] == "", f"{outcome.agent} left processes in its sandbox: {left['stdout']}"
    if cleanup == "destroy":
        assert [s.name for s in engine.list_stacks() if s.name.startswith("run-")] == []
