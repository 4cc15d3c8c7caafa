"""ALE-Claw (agents/ale_claw), the reference out-of-sandbox harness, driven by the scripted model server
through both official SDKs (Anthropic Messages, OpenAI Responses) on real local sandboxes.

The scripted plans call the harness's own tools by name (``fn:exec``, ``fn:computer``, ...). Units run
the way the runner runs them (clean task dir, input, ``setup``, a ``LocalExecutor``, install -> launch ->
parse_artifacts, then the reference and ``evaluate``); one test runs the three demo tasks through
``ale-iac evaluate`` (``run_experiment``) with the gateway in between. The model-error tests need no
sandbox: the bridges connect lazily, and the run ends before any tool is called.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shlex
import shutil
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil
import pytest
import yaml

from ale_iac.agent_sdk import AgentConfig, AgentRunResult, ModelGrant, load_deployer_class
from ale_iac.agent_sdk.trajectory import Trajectory
from ale_iac.executors.local import LocalExecutor
from ale_iac.llm.plan import plan_from
from ale_iac.llm.scripted import ScriptedModelServer, ServedRequest
from ale_iac.runner.lifecycle import build_prompt
from ale_iac.runner.records import Redactor
from ale_iac.runner.tasks import load_task, upload_dir
from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.sandbox.readiness import wait_ready
from ale_iac.substrates.local import sandboxes as local_sandboxes
from ale_iac.task import TaskSandbox

REPO = Path(__file__).resolve().parents[2]
AGENT_DIR = REPO / "agents" / "ale_claw"
TASKS_DIR = REPO / "examples" / "tasks"
DEMO_TASKS = ["cli-log-stats", "gui-notepad", "mixed-clipboard-total"]
APIS = {"anthropic": "preset.yaml", "openai": "preset-openai.yaml"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ROOT = "/data/tasks"
FAST = {"retry_base_s": 0.05, "retry_max_s": 1.0, "bridge_start_timeout_s": 60}
pytestmark = pytest.mark.xdist_group("ale-claw")


def paid_total() -> str:
    """What a model would read from the awk command's output (the scripted model cannot read)."""
    lines = (TASKS_DIR / "mixed-clipboard-total" / "input" / "orders.csv").read_text().splitlines()[1:]
    return f"{sum(float(f[3]) for f in (line.split(',') for line in lines if line) if f[2] == 'paid'):.2f}"


def fn(tool: str, **arguments: Any) -> dict[str, Any]:
    return {"tool": f"fn:{tool}", "arguments": arguments, "usage": {"input_tokens": 1000, "output_tokens": 30}}


def computer(action: str, **arguments: Any) -> dict[str, Any]:
    return fn("computer", action=action, **arguments)


def wait_for(condition: str) -> str:
    return f'timeout 10 sh -c "until {condition}; do sleep 0.05; done"'


CLI_DIR = f"{ROOT}/cli-log-stats"
SUMMARY = (
    f"cd {CLI_DIR} && e=$(cat input/logs/*.log | grep -c ' level=ERROR '); "
    "w=$(cat input/logs/*.log | grep -c ' level=WARN '); "
    "t=$(grep -h ' level=ERROR ' input/logs/*.log | sed -E 's/.* host=([^ ]+) .*/\\1/' | sort | uniq -c "
    "| sort -rn | head -n 1 | awk '{print $2}'); "
    'printf \'errors=%s\\nwarnings=%s\\ntop_host=%s\\n\' "$e" "$w" "$t" > output/summary.txt'
)
NOTE = f"{ROOT}/gui-notepad/output/note.txt"
MIXED = f"{ROOT}/mixed-clipboard-total"
TOTAL = paid_total()
DEMO_SCRIPTS: list[dict[str, Any]] = [
    {
        "match": r"summary\.txt",
        "turns": [
            fn("exec", command=SUMMARY),
            fn("read", path=f"{CLI_DIR}/output/summary.txt"),
            {"text": "summary.txt is written."},
        ],
    },
    {
        "match": "ALE Notepad",
        "turns": [
            computer("screenshot"),
            computer("click", coordinate=[400, 300]),
            computer("type", text="Dear ALE,"),
            computer("key", keys=["enter"]),
            computer("type", text="the GUI works."),
            computer("key", keys=["ctrl", "s"]),
            fn("exec", command=f"{wait_for(f'test -s {NOTE}')} && cat {NOTE}"),
            computer("screenshot"),
            {"text": "The note is saved."},
        ],
    },
    {
        "match": "ALE Form",
        "turns": [
            fn(
                "exec",
                command=f'awk -F, \'NR > 1 && $3 == "paid" {{s += $4}} END {{printf "%.2f\\n", s}}\' '
                f"{MIXED}/input/orders.csv > {MIXED}/output/total.txt && cat {MIXED}/output/total.txt",
            ),
            fn("clipboard", action="write", text=TOTAL),
            computer("screenshot"),
            computer("click", coordinate=[400, 300]),
            computer("key", keys=["shift", "insert"]),
            # xterm fetches the clipboard asynchronously: look before pressing Enter (the form mirrors its field)
            fn("exec", command=wait_for(f"grep -qxF {TOTAL} {MIXED}/app/draft.txt")),
            computer("key", keys=["enter"]),
            fn("exec", command=f"{wait_for(f'test -s {MIXED}/output/form.json')} && cat {MIXED}/output/form.json"),
            computer("screenshot"),
            {"text": "Submitted."},
        ],
    },
]
SHOTS = {"cli-log-stats": 0, "gui-notepad": 2, "mixed-clipboard-total": 2}


def load_preset(api: str, **settings: Any) -> AgentConfig:
    data = yaml.safe_load((AGENT_DIR / APIS[api]).read_text())
    data["settings"] = {**data.get("settings", {}), **FAST, **settings}
    return AgentConfig.model_validate({**data, "source_dir": str(AGENT_DIR)})


def deployer_module() -> ModuleType:
    return sys.modules[load_deployer_class(load_preset("anthropic")).__module__]


@dataclass
class Run:
    result: AgentRunResult
    trajectory: Trajectory
    requests: list[ServedRequest]
    work_dir: Path
    score: float | None = None


def run_harness(
    handle: SandboxHandle,
    config: AgentConfig,
    work_dir: Path,
    scripts: list[dict[str, Any]],
    prompt: str,
    *,
    on_request: Any = None,
) -> Run:
    """install -> launch -> parse_artifacts against a scripted model server that accepts only the unit's token."""
    token = f"gw-{secrets.token_hex(8)}"
    api = config.model.api if config.model else None
    assert api is not None
    with ScriptedModelServer(plan_from({"scripts": scripts}), api_key=token, on_request=on_request) as server:
        grant = ModelGrant(
            api=api, model="scripted-model", token=token, tcp_root=server.base_url, attach_unix=lambda p: None
        )
        executor = LocalExecutor(
            config=config, sandbox=handle, work_dir=work_dir, env={}, redact=Redactor([]), model=grant
        )
        deployer = load_deployer_class(config)(executor)

        async def unit() -> tuple[AgentRunResult, Trajectory]:
            await deployer.install()
            result = await asyncio.wait_for(deployer.launch(prompt), 150)
            return result, deployer.parse_artifacts(result)

        result, trajectory = asyncio.run(unit())
        assert server.plan_errors == []
        requests = server.requests
    return Run(result, Trajectory.model_validate(trajectory.model_dump(mode="json")), requests, work_dir)


def results_of(trajectory: Trajectory) -> list[tuple[str, dict[str, Any], str, bool, dict[str, Any]]]:
    """(tool, arguments, content, is_error, extra) of every tool call, in order."""
    out = []
    for step in trajectory.steps:
        results = {r.source_call_id: r for r in (step.observation.results if step.observation else [])}
        for call in step.tool_calls or []:
            r = results[call.tool_call_id]
            out.append((call.function_name, call.arguments, r.content, r.is_error, r.extra or {}))
    return out


# ------------------------------------------------------------------------------------------------------
# Without a sandbox
# ------------------------------------------------------------------------------------------------------


def test_presets_validate_and_choose_the_sdk() -> None:
    from ale_iac.runner.evaluation import bridge_tools

    for api, preset in APIS.items():
        config = load_preset(api)
        cls = load_deployer_class(config)
        cls.validate_config(config, bridge_tools())
        assert config.model is not None and config.model.api == api
        assert config.model.api_key_secret in {"ANTHROPIC_API_KEY", "OPENAI_API_KEY"}, preset
    assert cls.supported_executors == {"local", "docker"}


def test_exec_pages_cut_at_line_ends_and_join_to_the_whole() -> None:
    tools = deployer_module().tools
    text = "".join(f"line {n}\n" for n in range(3000))
    pages = [tools.page_of(text, p, 1000)[0] for p in range(1, tools.page_of(text, 1, 1000)[1] + 1)]
    assert "".join(pages) == text
    assert all(len(p) <= 1000 and p.endswith("\n") for p in pages)
    cut = tools.truncate_middle("a" * 5000 + "TAIL", 600, "ask for less")
    assert len(cut) < 700 and cut.endswith("TAIL") and "characters truncated; ask for less" in cut
    assert tools.binary_kind(b"\x89PNG\r\n\x1a\nxxxx") == "PNG image"
    assert tools.binary_kind(b"abc\x00def") == "binary data"
    assert tools.binary_kind("héllo".encode()) is None
    assert tools.binary_kind(b"\xff\xfe" + b"a" * 100) == "binary data (not UTF-8)"


def _png(width: int, height: int) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), "white").save(out, format="PNG")
    return out.getvalue()


def test_context_view_drops_and_downscales_old_screenshots_and_cuts_old_outputs() -> None:
    ctx = deployer_module().context
    history = [ctx.Turn("user", "the task")]
    for n in range(5):
        history.append(ctx.Turn("assistant", "", [ctx.Call(f"c{n}", "computer", {})]))
        shot = ctx.Shot(_png(800, 600), "image/png", f"screenshots/step-{n + 3}.png")
        history.append(ctx.Turn("tool", results=[ctx.Result(f"c{n}", "computer", "x" * 5000, False, [shot])]))
    policy = ctx.Policy(
        context_limit_tokens=200_000,
        max_tokens=4096,
        budget_fraction=0.8,
        keep_screenshots=2,
        downscale_screenshots=1,
        recent_turns=2,
        old_output_chars=500,
    )
    view, stats = ctx.render(history, policy)
    images = [[ctx.png_size(i.data) for i in r.images] for t in view for r in t.results]
    assert images == [[], [], [(400, 300)], [(800, 600)], [(800, 600)]]
    assert (stats.screenshots_full, stats.screenshots_downscaled, stats.screenshots_dropped) == (2, 1, 2)
    texts = [r.text for t in view for r in t.results]
    assert "saved as screenshots/step-3.png" in texts[0] and "old output dropped" in texts[0]
    assert len(texts[2]) < 700 and texts[3] == texts[4] == "x" * 5000
    assert stats.outputs_truncated == 3 and stats.turns_elided == 0
    # the history itself is untouched: the next view may differ
    assert all(len(r.text) == 5000 for t in history for r in t.results)

    # Past the budget, old turns are elided, oldest first, but every call keeps its result.
    tight = ctx.Policy(**{**policy.__dict__, "context_limit_tokens": 6000, "max_tokens": 1000})
    view, stats = ctx.render(history, tight)
    assert stats.turns_elided > 0 and stats.estimated_tokens <= (6000 - 1000) * 0.8
    assert view[0].text == "the task"
    assert [r.call_id for t in view for r in t.results] == [f"c{n}" for n in range(5)]
    with pytest.raises(ctx.ContextFullError, match="budget"):
        ctx.render(history, ctx.Policy(**{**policy.__dict__, "context_limit_tokens": 1200, "max_tokens": 1000}))


NOWHERE = SandboxHandle.for_endpoint("http://127.0.0.1:9")  # the bridges connect lazily; no tool is called


@pytest.mark.parametrize(
    ("api", "mode", "times"),
    [("anthropic", "http_429", 2), ("anthropic", "http_529", 1), ("openai", "http_429", 1), ("openai", "http_529", 2)],
)
def test_a_retryable_model_error_backs_off_and_the_run_goes_on(tmp_path: Path, api: str, mode: str, times: int) -> None:
    scripts = [{"match": ".", "turns": [{"fail": mode, "times": times}, {"text": "all done"}]}]
    run = run_harness(NOWHERE, load_preset(api), tmp_path, scripts, "a task")
    assert run.result.status == "completed", run.result.error
    served = [r.served for r in run.requests if r.api]
    assert served == [f"fail:{mode}"] * times + ["text"]
    (step,) = [s for s in run.trajectory.steps if s.source == "agent"]
    assert step.message == "all done"
    assert step.extra is not None
    attempts = step.extra["failed_attempts"]
    status = int(mode.removeprefix("http_"))
    assert [(a["status"], a["retryable"], a["backoff_s"]) for a in attempts] == [
        (status, True, 0.05 * 2**n) for n in range(times)
    ]
    assert run.trajectory.extra is not None and run.trajectory.extra["status"] == "completed"


def test_retries_run_out_with_a_clear_status(tmp_path: Path) -> None:
    scripts = [{"match": ".", "turns": [{"fail": "http_529"}]}]
    run = run_harness(NOWHERE, load_preset("anthropic", model_retries=2), tmp_path, scripts, "a task")
    assert run.result.status == "failed"
    assert run.result.error is not None
    assert run.result.error.startswith("model API error 529 (still failing after 2 retries)")
    assert [r.served for r in run.requests if r.api] == ["fail:http_529"] * 3
    assert run.trajectory.steps[-1].source == "system" and "529" in run.trajectory.steps[-1].message


@pytest.mark.parametrize(
    ("api", "mode"),
    [("anthropic", "http_400"), ("anthropic", "http_401"), ("openai", "http_400"), ("openai", "http_401")],
)
def test_a_non_retryable_model_error_ends_the_run_at_once(tmp_path: Path, api: str, mode: str) -> None:
    scripts = [{"match": ".", "turns": [{"fail": mode}, {"text": "never"}]}]
    run = run_harness(NOWHERE, load_preset(api), tmp_path, scripts, "a task")
    status = mode.removeprefix("http_")
    assert run.result.status == "failed"
    assert run.result.error is not None
    assert run.result.error.startswith(f"model API error {status} (not retryable): HTTP {status}")
    assert [r.served for r in run.requests if r.api] == [f"fail:{mode}"]  # exactly one request: no retry
    last = run.trajectory.steps[-1]
    assert last.source == "system" and f"model API error {status}" in last.message
    assert run.trajectory.extra is not None and run.trajectory.extra["status"] == "failed"


def test_the_step_limit_ends_the_run(tmp_path: Path) -> None:
    scripts = [{"match": ".", "turns": [fn("clipboard", action="bogus")] * 5 + [{"text": "late"}]}]
    run = run_harness(NOWHERE, load_preset("openai", max_steps=3), tmp_path, scripts, "a task")
    assert run.result.status == "failed"
    assert run.result.error == "step limit reached: 3 model turns without a final answer"
    # the bad action is a tool error the model sees; the loop went on
    assert [r[3] for r in results_of(run.trajectory)] == [True, True, True]
    assert "unknown action 'bogus'" in results_of(run.trajectory)[0][2]


# ------------------------------------------------------------------------------------------------------
# In a real local sandbox
# ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def handle(local_sandbox: Any) -> SandboxHandle:
    sandbox = SandboxHandle.for_endpoint(str(local_sandbox.endpoint), token=local_sandboxes.auth_token(local_sandbox))
    asyncio.run(wait_ready(sandbox, 90))
    return sandbox


def _sandbox_run(handle: SandboxHandle, command: str) -> str:
    async def go() -> str:
        async with handle.client() as client:
            result = await client.run_command(command)
            return str(result.stdout)

    return asyncio.run(go())


@pytest.fixture
def clean_task_dirs(handle: SandboxHandle) -> Iterator[None]:
    yield
    for task_id in DEMO_TASKS:
        pid_file = f"/tmp/ale-demo-{task_id}.pid"
        _sandbox_run(
            handle,
            f'if test -s {pid_file}; then kill "$(cat {pid_file})" 2>/dev/null; fi; '
            f"rm -rf {pid_file} {shlex.quote(f'{ROOT}/{task_id}')}",
        )


@pytest.fixture
def scratch(handle: SandboxHandle) -> Iterator[str]:
    path = f"/tmp/ale-claw-{secrets.token_hex(4)}"
    yield path
    _sandbox_run(handle, f"rm -rf {shlex.quote(path)}")


def solve(handle: SandboxHandle, api: str, task_name: str, work_dir: Path) -> Run:
    task = load_task(TASKS_DIR / task_name)

    async def stage() -> str:
        async with handle.client() as client:
            sandbox = TaskSandbox(handle, client, task.id)
            await client.run_command(f"rm -rf {shlex.quote(sandbox.task_dir)}")
            await client.run_command(f"mkdir -p {shlex.quote(sandbox.input_dir)} {shlex.quote(sandbox.output_dir)}")
            if task.input_dir.is_dir():
                await upload_dir(client, task.input_dir, sandbox.input_dir)
            setup = task.hook("setup")
            if setup is not None:
                await setup(sandbox)
            return build_prompt(task.card.instruction, sandbox)

    async def grade() -> float:
        async with handle.client() as client:
            sandbox = TaskSandbox(handle, client, task.id)
            assert not await sandbox.exists(sandbox.reference_dir)
            await upload_dir(client, task.reference_dir, sandbox.reference_dir)
            return float(await task.module.evaluate(sandbox))

    prompt = asyncio.run(stage())
    run = run_harness(handle, load_preset(api), work_dir, DEMO_SCRIPTS, prompt)
    run.score = asyncio.run(grade())
    return run


@pytest.mark.sandbox
@pytest.mark.usefixtures("clean_task_dirs")
@pytest.mark.parametrize("api", list(APIS))
@pytest.mark.parametrize("task_name", DEMO_TASKS)
def test_it_solves_the_demo_tasks_by_its_tools_alone(
    handle: SandboxHandle, tmp_path: Path, api: str, task_name: str
) -> None:
    run = solve(handle, api, task_name, tmp_path)
    assert run.result.status == "completed", run.result.error
    assert run.score == 1.0
    index = run.requests[0].script
    assert index is not None and index == DEMO_TASKS.index(task_name)
    script = DEMO_SCRIPTS[index]
    tool_turns = [t for t in script["turns"] if "tool" in t]
    check_complete(run, tool_turns, len(script["turns"]))
    shots = [p for *_, extra in results_of(run.trajectory) for p in extra.get("screenshots", [])]
    assert len(shots) == SHOTS[task_name]
    for rel in shots:
        assert not Path(rel).is_absolute() and (tmp_path / rel).read_bytes().startswith(PNG_MAGIC)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.glob("screenshots/*")) == sorted(shots)


def check_complete(run: Run, tool_turns: list[dict[str, Any]], turns: int) -> None:
    """The trajectory has every model turn (with the API's usage), every call with its result."""
    steps = run.trajectory.steps
    assert [s.source for s in steps[:2]] == ["system", "user"]
    agent = [s for s in steps if s.source == "agent"]
    assert len(agent) == turns == len([r for r in run.requests if r.api])
    calls = results_of(run.trajectory)
    assert [(c[0], c[1]) for c in calls] == [(t["tool"].removeprefix("fn:"), t["arguments"]) for t in tool_turns]
    assert not any(c[3] for c in calls), [c[2] for c in calls if c[3]]
    for step in agent:
        assert step.extra is not None and step.extra["usage"]["prompt_tokens"] > 0
    metrics = run.trajectory.final_metrics
    assert metrics is not None
    assert metrics.total_prompt_tokens == sum(r.input_tokens for r in run.requests)
    assert metrics.total_completion_tokens == sum(r.output_tokens for r in run.requests)
    assert metrics.total_tool_calls == len(tool_turns)


@pytest.mark.sandbox
def test_paging_truncation_edit_errors_binary_and_terminal(handle: SandboxHandle, tmp_path: Path, scratch: str) -> None:
    d = scratch
    turns = [
        fn("exec", command="seq 1 20000"),
        fn("exec", output_id="out-1", page=2),
        fn("exec", output_id="out-9"),
        fn("write", path=f"{d}/sub/f.txt", content="alpha\nbeta\nalpha\n"),
        fn("edit", path=f"{d}/sub/f.txt", old_string="gamma", new_string="x"),
        fn("edit", path=f"{d}/sub/f.txt", old_string="alpha", new_string="x"),
        fn("edit", path=f"{d}/sub/f.txt", old_string="beta", new_string="BETA"),
        fn("read", path=f"{d}/sub/f.txt", offset=2, limit=1),
        fn("exec", command=f"printf 'ab\\000cd' > {d}/bin"),
        fn("read", path=f"{d}/bin"),
        fn("terminal", action="start", command="sh"),
        fn("terminal", action="send", session=1, input="echo hi-$((6*7))\n", timeout_ms=5000),
        fn("terminal", action="kill", session=1),
        {"text": "done"},
    ]
    run = run_harness(
        handle, load_preset("anthropic", page_chars=4000), tmp_path, [{"match": ".", "turns": turns}], "t"
    )
    assert run.result.status == "completed", run.result.error
    calls = results_of(run.trajectory)
    page1, page2, unknown, wrote, absent, twice, edited, read, _, binary, started, sent, _ = calls
    # paging: a page ends with a marker that says how to get the next one; page 2 starts where 1 ended
    assert page1[2].startswith("exit_code: 0\nstdout:\n1\n2\n")
    first_lines = page1[2].splitlines()
    marker = first_lines[-1]
    assert marker.startswith("[output out-1: page 1 of ") and '"output_id": "out-1", "page": 2' in marker
    assert len(page1[2]) < 4000 + len(marker) + 2
    last_number = int(first_lines[-2])
    assert page2[2].splitlines()[0] == str(last_number + 1)
    assert page2[4]["output"]["page"] == 2
    assert unknown[3] and "no output 'out-9'" in unknown[2]
    # write creates the folder; edit errors are clear and change nothing
    assert not wrote[3] and wrote[2] == f"wrote 17 bytes to {d}/sub/f.txt"
    assert absent[3] and "old_string was not found" in absent[2] and "nothing was changed" in absent[2]
    assert twice[3] and "occurs 2 times" in twice[2] and "lines 1, 3" in twice[2]
    assert not edited[3] and edited[2] == f"edited {d}/sub/f.txt: replaced 1 occurrence at line 2"
    assert read[2] == "2\tBETA\n[lines 2-2 of 3; the rest: read with offset=3]"
    assert _sandbox_run(handle, f"cat {d}/sub/f.txt") == "alpha\nBETA\nalpha\n"
    assert binary[3] and "binary file (binary data, 5 bytes)" in binary[2]
    assert started[2].startswith("session 1 started") and "hi-42" in sent[2]


@pytest.mark.sandbox
def test_old_screenshots_leave_the_context_but_stay_files(handle: SandboxHandle, tmp_path: Path) -> None:
    turns = [computer("screenshot")] * 4 + [{"text": "seen"}]
    config = load_preset("openai", keep_screenshots=1, downscale_screenshots=1)
    run = run_harness(handle, config, tmp_path, [{"match": ".", "turns": turns}], "look")
    assert run.result.status == "completed", run.result.error
    agent = [s for s in run.trajectory.steps if s.source == "agent"]
    seen = [(s.extra or {})["context"] for s in agent]
    assert [(c["screenshots_full"], c["screenshots_downscaled"], c["screenshots_dropped"]) for c in seen] == [
        (0, 0, 0),
        (1, 0, 0),
        (1, 1, 0),
        (1, 1, 1),
        (1, 1, 2),
    ]
    assert len(list(tmp_path.glob("screenshots/*.png"))) == 4


def _bridge_pids(kind: str) -> list[int]:
    found = []
    for child in psutil.Process().children(recursive=False):
        try:
            cmdline = child.cmdline()
        except psutil.Error:
            continue
        if "mcp" in cmdline and kind in cmdline and child.status() != psutil.STATUS_ZOMBIE:
            found.append(child.pid)
    return found


def _kill_bridge(kind: str) -> int:
    (pid,) = _bridge_pids(kind)
    psutil.Process(pid).kill()
    psutil.Process(pid).wait(10)
    return pid


@pytest.mark.sandbox
def test_a_killed_bridge_is_restarted_and_only_safe_calls_are_retried(
    handle: SandboxHandle, tmp_path: Path, scratch: str
) -> None:
    d = scratch
    killed: list[int] = []
    errors: list[BaseException] = []

    def on_request(request: ServedRequest) -> None:
        try:
            if request.api is None:
                return
            if request.turn in (1, 2):  # before a read (safe: retried) and before an exec (dead before sending)
                killed.append(_kill_bridge("vm"))
            elif request.turn == 3:  # during an exec: once the command has started

                def later() -> None:
                    try:
                        _sandbox_run(handle, wait_for(f"test -f {d}/started"))
                        killed.append(_kill_bridge("vm"))
                    except BaseException as exc:
                        errors.append(exc)

                threading.Thread(target=later, daemon=True).start()
        except BaseException as exc:
            errors.append(exc)

    turns = [
        fn("write", path=f"{d}/a.txt", content="one\n"),
        fn("read", path=f"{d}/a.txt"),
        fn("exec", command=f"echo ran >> {d}/log"),
        fn("exec", command=f"echo once >> {d}/count; touch {d}/started; sleep 20"),
        fn("exec", command=f"cat {d}/log {d}/count"),
        {"text": "recovered"},
    ]
    run = run_harness(
        handle, load_preset("anthropic"), tmp_path, [{"match": ".", "turns": turns}], "t", on_request=on_request
    )
    assert errors == []
    assert len(killed) == 3 and len(set(killed)) == 3
    assert run.result.status == "completed", run.result.error
    _, read, first, during, check = results_of(run.trajectory)
    # the read: the bridge died under it, was restarted, and the read retried once
    assert not read[3] and "one" in read[2]
    assert [c.get("restarted") or c.get("retried") for c in read[4]["bridge_calls"]] == [True, True]
    # the exec after a death while idle: restarted before sending, sent once
    assert not first[3] and first[4]["bridge_calls"][0]["reason"] == "found dead before the call"
    # the exec during which the bridge died: restarted, NOT retried, and the model is told so
    assert during[3] and "was NOT retried" in during[2]
    assert not check[3] and "ran\nonce\n" in check[2]
    assert run.trajectory.extra is not None and run.trajectory.extra["bridge_restarts"] == {"vm": 3, "cua": 0}


# ------------------------------------------------------------------------------------------------------
# Through `ale-iac evaluate`
# ------------------------------------------------------------------------------------------------------


@pytest.mark.sandbox
@pytest.mark.engine
@pytest.mark.timeout(600)
@pytest.mark.parametrize("executor", ["local", pytest.param("docker", marks=pytest.mark.docker)])
def test_evaluate_runs_it_on_the_three_demo_tasks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, executor: str
) -> None:
    """Through the gateway (the model server accepts only the real key); under ``docker`` the harness runs
    in a container with the image's Python 3.13 and the runtime bundle (the SDKs included)."""
    from ale_iac.engine import Engine
    from ale_iac.runner.evaluation import run_experiment
    from ale_iac.runner.experiment import load_experiment

    key = "sk-test-" + secrets.token_urlsafe(16)
    monkeypatch.setenv("ALE_CLAW_TEST_KEY", key)
    copy = tmp_path / "ale_claw"
    shutil.copytree(AGENT_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    engine = Engine()
    before = {s.name for s in engine.list_stacks()}
    with ScriptedModelServer(plan_from({"scripts": DEMO_SCRIPTS}), api_key=key) as server:
        preset = yaml.safe_load((copy / "preset.yaml").read_text())
        preset["model"] = {
            "name": "scripted-model",
            "api": "anthropic",
            "base_url": server.base_url,
            "api_key_secret": "ALE_CLAW_TEST_KEY",
        }
        preset["settings"] = {**preset["settings"], **FAST}
        preset["executor"] = executor
        (copy / "preset.yaml").write_text(yaml.safe_dump(preset))
        spec = {
            "name": "ale-claw-demo",
            "agents": ["ale_claw/preset.yaml"],
            "tasks": [str(REPO / "examples" / "tasks.txt")],
            "profile": "local",
            "concurrency": 2,
            "cleanup": "destroy",
            "unit_timeout_s": 240,
            "output_root": str(tmp_path / "runs"),
        }
        (tmp_path / "exp.yaml").write_text(json.dumps(spec))
        try:
            summary = run_experiment(load_experiment(tmp_path / "exp.yaml"))
        finally:
            for stack in engine.list_stacks():
                if stack.name not in before:
                    engine.destroy(stack.name)
        assert server.plan_errors == []
    scores = {o.task: o.score for o in summary.outcomes}
    assert scores == dict.fromkeys(DEMO_TASKS, 1.0), summary
    for path in (tmp_path / "runs").rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), path
    trajectories = list((tmp_path / "runs").rglob("trajectory.json"))
    assert len(trajectories) == 3
    for path in trajectories:
        data = Trajectory.model_validate_json(path.read_text())
        assert data.final_metrics is not None and data.final_metrics.total_prompt_tokens
