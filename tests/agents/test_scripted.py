"""The scripted reference agent (agents/scripted) on the demo tasks (examples/tasks), in a real local sandbox.

Each unit is run the way the runner runs it, by hand: clean task dir, stage input/, ``setup``, a
``LocalExecutor`` with a fresh work dir, ``install`` -> ``launch(prompt)`` -> ``parse_artifacts``, then
stage reference/ and ``evaluate``. The agent reaches the sandbox only through the two MCP bridges it
spawns. The first tests need no sandbox (plan parsing and placeholder filling).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from ale_iac.agent_sdk import AgentConfig, AgentRunResult, BaseAgentDeployer, load_deployer_class
from ale_iac.agent_sdk.trajectory import Trajectory
from ale_iac.errors import ConfigError
from ale_iac.executors.local import LocalExecutor
from ale_iac.runner.lifecycle import build_prompt
from ale_iac.runner.records import Redactor
from ale_iac.runner.tasks import load_task, load_task_list, upload_dir
from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.sandbox.readiness import wait_ready
from ale_iac.substrates.local import sandboxes as local_sandboxes
from ale_iac.task import TaskSandbox

REPO = Path(__file__).resolve().parents[2]
AGENT_DIR = REPO / "agents" / "scripted"
TASKS_DIR = REPO / "examples" / "tasks"
DEMO_TASKS = ["cli-log-stats", "gui-notepad", "mixed-clipboard-total"]
GUI_WINDOWS = [("gui-notepad", "ALE Notepad"), ("mixed-clipboard-total", "ALE Form")]
WRONG_SCORES = {"cli-log-stats": 1 / 3, "gui-notepad": 0.5, "mixed-clipboard-total": 0.5}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# One worker runs this module: its units share that worker's session sandbox, one at a time.
pytestmark = pytest.mark.xdist_group("scripted-agent")


def load_preset(file_name: str, **overrides: Any) -> AgentConfig:
    data = yaml.safe_load((AGENT_DIR / file_name).read_text())
    return AgentConfig.model_validate({**data, **overrides, "source_dir": str(AGENT_DIR)})


def one_plan(name: str, match: str, steps: list[dict[str, Any]]) -> AgentConfig:
    """The scripted agent with a single plan."""
    return load_preset("preset.yaml", name=name, settings={"plans": [{"match": match, "steps": steps}]})


def plan_for(config: AgentConfig, prompt: str) -> dict[str, Any]:
    plan: dict[str, Any] = next(p for p in config.settings["plans"] if re.search(p["match"], prompt))
    return plan


def deployer_module() -> ModuleType:
    """agents/scripted/deployer.py as the runner imports it (agents/ is not a package)."""
    return sys.modules[load_deployer_class(load_preset("preset.yaml")).__module__]


def deployer_for(config: AgentConfig, handle: SandboxHandle, work_dir: Path, env: dict[str, str]) -> BaseAgentDeployer:
    executor = LocalExecutor(config=config, sandbox=handle, work_dir=work_dir, env=env, redact=Redactor(env.values()))
    return load_deployer_class(config)(executor)


# ------------------------------------------------------------------------------------------------------
# Without a sandbox
# ------------------------------------------------------------------------------------------------------


def test_presets_and_task_list_load() -> None:
    for preset in ("preset.yaml", "wrong.yaml"):
        config = load_preset(preset)
        settings = deployer_module().parse_settings(config.name, config.settings)
        assert len(settings.plans) == len(DEMO_TASKS)
        assert load_deployer_class(config).__name__ == "ScriptedDeployer"
    folders = load_task_list(REPO / "examples" / "tasks.txt")
    assert [f.name for f in folders] == DEMO_TASKS
    for folder in folders:
        task = load_task(folder)
        assert task.id == folder.name
        assert task.reference_dir.is_dir()
        # every demo prompt is matched by exactly the plan for its task, in both presets
        prompt = build_prompt(task.card.instruction, _FakeSandbox(task.id))  # type: ignore[arg-type]
        for preset in ("preset.yaml", "wrong.yaml"):
            config = load_preset(preset)
            matching = [p for p in config.settings["plans"] if re.search(p["match"], prompt)]
            assert len(matching) == 1, (preset, task.id)
            assert task.id in json.dumps(matching[0]["steps"]), (preset, task.id)


@dataclass
class _FakeSandbox:
    task_id: str

    @property
    def input_dir(self) -> str:
        return f"/data/tasks/{self.task_id}/input"

    @property
    def output_dir(self) -> str:
        return f"/data/tasks/{self.task_id}/output"


def test_fill_replaces_only_known_placeholders() -> None:
    fill = deployer_module().fill
    variables = {"root": "/data/tasks", "n": "42"}
    args = {
        "command": "awk '{print $2} {s += $4}' {root}/x | grep {n} {unknown} {{root}}",
        "keys": ["{n}", 3, {"deep": "{root}"}],
        "count": 7,
    }
    assert fill(args, variables) == {
        "command": "awk '{print $2} {s += $4}' /data/tasks/x | grep 42 {unknown} {root}",
        "keys": ["42", 3, {"deep": "/data/tasks"}],
        "count": 7,
    }


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({}, "settings.plans"),
        ({"plans": [{"match": "(", "steps": [{"bridge": "vm", "tool": "x"}]}]}, "settings.plans.0.match"),
        ({"plans": [{"match": "x", "steps": [{"bridge": "gui", "tool": "x"}]}]}, "settings.plans.0.steps.0.bridge"),
        (
            {"plans": [{"match": "x", "steps": [{"bridge": "vm", "tool": "x", "bogus": 1}]}]},
            "settings.plans.0.steps.0.bogus",
        ),
    ],
)
def test_bad_plans_fail_at_install(tmp_path: Path, settings: dict[str, Any], field: str) -> None:
    config = load_preset("preset.yaml", settings=settings)
    deployer = deployer_for(config, SandboxHandle.for_endpoint("http://127.0.0.1:9"), tmp_path, {})
    with pytest.raises(ConfigError) as info:
        asyncio.run(deployer.install())
    assert info.value.field == field


# ------------------------------------------------------------------------------------------------------
# In a real local sandbox
# ------------------------------------------------------------------------------------------------------


@dataclass
class UnitResult:
    result: AgentRunResult
    trajectory: Trajectory
    score: float | None
    work_dir: Path
    prompt: str


@pytest.fixture(scope="module")
def handle(local_sandbox: Any) -> SandboxHandle:
    sandbox = SandboxHandle.for_endpoint(str(local_sandbox.endpoint), token=local_sandboxes.auth_token(local_sandbox))
    asyncio.run(wait_ready(sandbox, 90))
    return sandbox


@pytest.fixture
def clean_task_dirs(handle: SandboxHandle) -> Iterator[None]:
    """Afterwards: stop the demo apps the tasks started and remove every demo task's data."""
    yield

    async def cleanup() -> None:
        async with handle.client() as client:
            for task_id in DEMO_TASKS:
                task_dir = shlex.quote(f"{handle.paths.task_data_root}/{task_id}")
                pid_file = f"/tmp/ale-demo-{task_id}.pid"  # the GUI tasks' apps (PID_FILE in their main.py)
                await client.run_command(
                    f'if test -s {pid_file}; then kill "$(cat {pid_file})" 2>/dev/null; fi; '
                    f"rm -rf {pid_file} {task_dir}"
                )

    asyncio.run(cleanup())


async def run_unit(
    handle: SandboxHandle,
    config: AgentConfig,
    task_name: str,
    work_dir: Path,
    env: dict[str, str] | None = None,
    prompt_suffix: str = "",
    grade: bool = True,
) -> UnitResult:
    """One unit as the runner runs it; the reference is staged only after the agent has finished."""
    task = load_task(TASKS_DIR / task_name)
    async with handle.client() as client:
        sandbox = TaskSandbox(handle, client, task.id)
        await client.run_command(f"rm -rf {shlex.quote(sandbox.task_dir)}")
        await client.run_command(f"mkdir -p {shlex.quote(sandbox.input_dir)} {shlex.quote(sandbox.output_dir)}")
        if task.input_dir.is_dir():
            await upload_dir(client, task.input_dir, sandbox.input_dir)
        setup = task.hook("setup")
        if setup is not None:
            await setup(sandbox)
        prompt = build_prompt(task.card.instruction, sandbox) + prompt_suffix
        deployer = deployer_for(config, handle, work_dir, env or {})
        await deployer.install()
        # the hidden reference is not in the sandbox while the agent runs
        assert not await sandbox.exists(sandbox.reference_dir)
        result = await deployer.launch(prompt)
        trajectory = deployer.parse_artifacts(result)
        score = None
        if grade:
            await upload_dir(client, task.reference_dir, sandbox.reference_dir)
            score = float(await task.module.evaluate(sandbox))
    return UnitResult(result, trajectory, score, work_dir, prompt)


def raw_calls(work_dir: Path) -> list[dict[str, Any]]:
    lines = (work_dir / "scripted" / "calls.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == "call"]


@pytest.mark.sandbox
@pytest.mark.usefixtures("clean_task_dirs")
@pytest.mark.parametrize("task_name", DEMO_TASKS)
def test_right_plan_scores_one(handle: SandboxHandle, tmp_path: Path, task_name: str) -> None:
    config = load_preset("preset.yaml")
    unit = asyncio.run(run_unit(handle, config, task_name, tmp_path))
    assert unit.result.status == "completed", unit.result.error
    assert unit.score == 1.0

    # The trajectory: valid ATIF, the prompt, then one agent step per tool call of the plan.
    trajectory = Trajectory.model_validate(unit.trajectory.model_dump(mode="json"))
    steps = trajectory.steps
    plan_steps = plan_for(config, unit.prompt)["steps"]
    calls = raw_calls(tmp_path)
    assert len(calls) == len(plan_steps)
    assert len(steps) == 1 + len(calls)
    assert steps[0].source == "user" and steps[0].message == unit.prompt
    for step, plan_step, call in zip(steps[1:], plan_steps, calls, strict=True):
        assert step.source == "agent" and step.tool_calls is not None and step.observation is not None
        assert step.tool_calls[0].function_name == f"{plan_step['bridge']}.{plan_step['tool']}"
        assert step.tool_calls[0].arguments == call["arguments"]
        assert step.observation.results[0].content == call["result"]
        assert step.observation.results[0].is_error is False
        assert call["duration_s"] >= 0
    assert trajectory.final_metrics is not None
    assert trajectory.final_metrics.total_tool_calls == len(calls)

    # Screenshots: one PNG file per screenshot call, referenced by work-dir-relative path.
    shots = [
        path
        for step in steps[1:]
        for path in ((step.observation.results[0].extra or {}).get("screenshots", []) if step.observation else [])
    ]
    assert len(shots) == sum(1 for s in plan_steps if s["tool"] == "screenshot")
    for rel in shots:
        assert not Path(rel).is_absolute()
        assert (tmp_path / rel).read_bytes().startswith(PNG_MAGIC)
    on_disk = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.glob("screenshots/*"))
    assert on_disk == sorted(shots)


@pytest.mark.sandbox
@pytest.mark.usefixtures("clean_task_dirs")
@pytest.mark.parametrize("task_name", DEMO_TASKS)
def test_wrong_plan_scores_below_one(handle: SandboxHandle, tmp_path: Path, task_name: str) -> None:
    unit = asyncio.run(run_unit(handle, load_preset("wrong.yaml"), task_name, tmp_path))
    assert unit.result.status == "completed", unit.result.error  # it ran cleanly; the work is wrong
    assert unit.score is not None and unit.score < 1.0
    assert unit.score == pytest.approx(WRONG_SCORES[task_name])


@pytest.mark.sandbox
@pytest.mark.usefixtures("clean_task_dirs")
@pytest.mark.parametrize(("task_name", "title"), GUI_WINDOWS)
def test_gui_setup_on_a_reused_sandbox_leaves_one_window(handle: SandboxHandle, task_name: str, title: str) -> None:
    """Set up twice, wiping the task dir in between as the runner does: the first app is replaced."""
    task = load_task(TASKS_DIR / task_name)

    async def scenario() -> str:
        async with handle.client() as client:
            sandbox = TaskSandbox(handle, client, task.id)
            for _ in range(2):
                await client.run_command(f"rm -rf {shlex.quote(sandbox.task_dir)}")
                if task.input_dir.is_dir():
                    await upload_dir(client, task.input_dir, sandbox.input_dir)
                await task.module.setup(sandbox)
            # Retried: a search fails outright when another window vanishes under it (BadWindow).
            search = f"until out=$(xdotool search --onlyvisible --name '^{title}$' 2>/dev/null); do sleep 0.05; done"
            listing = await client.run_command(f"timeout 20 sh -c {shlex.quote(search + '; echo $out')}")
            return listing.stdout

    assert len(asyncio.run(scenario()).split()) == 1


@pytest.mark.sandbox
@pytest.mark.usefixtures("clean_task_dirs")
def test_unknown_tool_fails_before_any_call(handle: SandboxHandle, tmp_path: Path) -> None:
    steps: list[dict[str, Any]] = [
        {"bridge": "vm", "tool": "run_command", "args": {"command": "true"}},
        {"bridge": "cua", "tool": "clik", "args": {"coordinate": [1, 1]}},
    ]
    config = one_plan("scripted-typo", "summary", steps)
    unit = asyncio.run(run_unit(handle, config, "cli-log-stats", tmp_path, grade=False))
    assert unit.result.status == "failed"
    assert unit.result.error is not None
    assert "plan 0 step 2: the cua bridge has no tool 'clik'" in unit.result.error
    assert "click" in unit.result.error  # the message lists what the bridge does have
    assert raw_calls(tmp_path) == []  # checked before the first call
    assert [s.source for s in unit.trajectory.steps] == ["user"]
    assert unit.trajectory.extra is not None and unit.trajectory.extra["status"] == "failed"


@pytest.mark.sandbox
@pytest.mark.usefixtures("clean_task_dirs")
def test_no_matching_plan_and_tool_errors(handle: SandboxHandle, tmp_path: Path) -> None:
    # No plan matches: failed, with the patterns tried, and no bridge is started.
    config = one_plan(
        "scripted-nomatch", "^NOPE$", [{"bridge": "vm", "tool": "run_command", "args": {"command": "true"}}]
    )
    unit = asyncio.run(run_unit(handle, config, "cli-log-stats", tmp_path / "a", grade=False))
    assert unit.result.status == "failed"
    assert unit.result.error == "no plan matches the prompt (plans tried: '^NOPE$')"

    # A tool error fails the run unless the step expects it; save_as feeds later steps.
    missing = "{task_data_root}/cli-log-stats/no-such-file"
    steps: list[dict[str, Any]] = [
        {"bridge": "vm", "tool": "run_command", "args": {"command": "echo '  hello '"}, "save_as": "greeting"},
        {"bridge": "vm", "tool": "read_text", "args": {"path": missing}, "expect_error": True},
        {"bridge": "vm", "tool": "write_clipboard", "args": {"text": "<{greeting}>"}},
        {"bridge": "vm", "tool": "read_clipboard", "save_as": "clip"},
        {"bridge": "vm", "tool": "read_text", "args": {"path": missing}},
        {"bridge": "vm", "tool": "run_command", "args": {"command": "true"}},
    ]
    config = one_plan("scripted-errors", "summary", steps)
    unit = asyncio.run(run_unit(handle, config, "cli-log-stats", tmp_path / "b", grade=False))
    assert unit.result.status == "failed"
    assert unit.result.error is not None
    assert unit.result.error.startswith("plan 0 step 5 (vm.read_text) failed: ")
    assert "no-such-file" in unit.result.error
    calls = raw_calls(tmp_path / "b")
    assert [c["is_error"] for c in calls] == [False, True, False, False, True]  # the 6th never ran
    assert calls[2]["arguments"] == {"text": "<hello>"}
    assert calls[3]["result"] == "<hello>"
    observed = [s.observation.results[0].is_error for s in unit.trajectory.steps[1:] if s.observation]
    assert observed == [False, True, False, False, True]


@pytest.mark.sandbox
@pytest.mark.usefixtures("clean_task_dirs")
def test_secret_appears_in_no_file(handle: SandboxHandle, tmp_path: Path) -> None:
    secret = f"sk-scripted-{secrets.token_hex(12)}"
    config = load_preset("preset.yaml", secrets=["ALE_SCRIPTED_TEST_KEY"])
    # The secret even reaches the agent's prompt (as a task might quote a credential): it must still not
    # land in any file the agent writes (raw log, plan, bridge logs, screenshots) nor in its trajectory.
    unit = asyncio.run(
        run_unit(
            handle,
            config,
            "mixed-clipboard-total",
            tmp_path,
            env={"ALE_SCRIPTED_TEST_KEY": secret},
            prompt_suffix=f"\n(The service key is {secret}.)",
        )
    )
    assert unit.result.status == "completed", unit.result.error
    assert unit.score == 1.0
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.suffix == ".png" for p in files)
    for path in files:
        assert secret.encode() not in path.read_bytes(), f"secret found in {path.relative_to(tmp_path)}"
    log = (tmp_path / "scripted" / "calls.jsonl").read_text()
    assert "The service key is ***." in log
    assert json.loads(log.splitlines()[0])["secrets"] == ["ALE_SCRIPTED_TEST_KEY"]  # the name, not the value
    assert secret not in unit.trajectory.model_dump_json()


def _bridge_children() -> list[str]:
    """Command lines of this process's children that are MCP bridges."""
    found = []
    me = str(os.getpid())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        ppid = stat.rsplit(")", 1)[1].split()[1]
        if ppid == me and " mcp " in cmdline:
            found.append(cmdline)
    return found


@pytest.mark.sandbox
@pytest.mark.usefixtures("clean_task_dirs")
def test_cancel_mid_plan_records_it_and_stops_the_bridges(handle: SandboxHandle, tmp_path: Path) -> None:
    """The runner enforces its timeout by cancelling launch(): the log says so and no bridge survives."""
    pid_file = "/tmp/scripted-cancel-test.pid"
    steps: list[dict[str, Any]] = [
        {"bridge": "cua", "tool": "cursor_position"},
        {"bridge": "vm", "tool": "run_command", "args": {"command": f"echo $$ > {pid_file}; exec sleep 120"}},
    ]
    config = one_plan("scripted-slow", "summary", steps)

    async def scenario() -> None:
        task = load_task(TASKS_DIR / "cli-log-stats")
        async with handle.client() as client:
            sandbox = TaskSandbox(handle, client, task.id)
            await client.run_command(f"rm -f {pid_file}")
            deployer = deployer_for(config, handle, tmp_path, {})
            await deployer.install()
            launch = asyncio.create_task(deployer.launch(build_prompt(task.card.instruction, sandbox)))
            try:
                # cancel once the long command is running (its pid file exists), like a timeout would
                deadline = asyncio.get_running_loop().time() + 60
                while not await sandbox.exists(pid_file):
                    assert not launch.done(), launch.result()
                    assert asyncio.get_running_loop().time() < deadline, "the plan never reached its 2nd step"
                    await asyncio.sleep(0.1)
                assert _bridge_children(), "the bridges should be running now"
                launch.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await launch
            finally:
                await client.run_command(f'test -s {pid_file} && kill "$(cat {pid_file})"; rm -f {pid_file}')

    asyncio.run(scenario())
    assert _bridge_children() == []
    records = [json.loads(line) for line in (tmp_path / "scripted" / "calls.jsonl").read_text().splitlines()]
    assert records[-1]["type"] == "end" and records[-1]["status"] == "cancelled"
    assert [r["tool"] for r in records if r["type"] == "call"] == ["cursor_position"]
