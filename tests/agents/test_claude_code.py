"""Claude Code as an agent (agents/claude_code): its preset and transcript parser, then the REAL CLI.

The parser tests read transcripts captured from real runs of Claude Code 2.1.332 through this deployer
(tests/agents/fixtures/claude_code/, README there). The others run the real CLI, installed from npm
(``agent_clis``) and run from a copy of its ``files`` alone, under the ``local`` executor against the
session's local sandbox (``sandbox``), with the scripted model server standing in for the API.
"""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path
from typing import Any

import pytest

from ale_iac.agent_sdk import AgentInfo, CliInstall
from ale_iac.errors import ConfigError
from ale_iac.runner.evaluation import bridge_tools
from ale_iac.sandbox.handle import SandboxHandle
from tests.agents.cli_agents import (
    FIXTURES,
    PNG_MAGIC,
    check_pairing,
    deployer_module,
    load_preset,
    make_deployer,
    make_executor,
    run_unit,
    sandbox_dir,
    sandbox_handle,
    sandbox_read,
    screenshots_of,
    staged_cli,
    task_turns,
    tool_steps,
    usage,
)

AGENT = "claude_code"
CLI = "claude-code"


def parser() -> Any:
    return deployer_module(load_preset(AGENT)).transcript


def parse(name: str, status: str = "completed", exit_code: int | None = 0, error: str | None = None) -> Any:
    text = (FIXTURES / AGENT / name).read_text()
    return parser().to_trajectory(
        text,
        prompt="the prompt",
        agent=AgentInfo(name="claude-code", version="pinned", model_name="preset-model"),
        session_id="fallback",
        status=status,
        exit_code=exit_code,
        error=error,
    )


# ------------------------------------------------------------------------------------------------------
# Preset and settings
# ------------------------------------------------------------------------------------------------------


def test_preset_validates_and_bad_ones_name_the_field() -> None:
    config = load_preset(AGENT)
    cls = deployer_module(config).ClaudeCodeDeployer
    tools = bridge_tools()
    cls.validate_config(config, tools)
    assert cls.default_executor == "sandbox"
    assert cls.supported_executors == {"local", "sandbox", "docker"}
    assert cls.clis == (CLI,) and cls.model_api == "anthropic"
    cases: list[tuple[dict[str, Any], str]] = [
        ({"model": None}, "model"),
        ({"model": {"name": "gpt-5", "api": "openai"}}, "model.api"),
        ({"settings": {"max_turns": 0}}, "settings.max_turns"),
        ({"settings": {"bridge_startup_s": 61}}, "settings.bridge_startup_s"),
        ({"settings": {"retries": 3}}, "settings.retries"),
        ({"settings": {"native_tools": ["Bash", "rm -rf"]}}, "settings.native_tools"),
    ]
    for overrides, field in cases:
        with pytest.raises(ConfigError) as info:
            cls.validate_config(load_preset(AGENT, **overrides), tools)
        assert info.value.field == field, overrides


@pytest.mark.parametrize("native", [False, True], ids=["outside", "in-sandbox"])
def test_install_writes_the_mcp_config_and_the_command_line(
    tmp_path: Path, native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outside the sandbox: both bridges and no built-in tool; inside: the cua bridge and the native
    tools, all allowed. Secrets never reach a bridge's environment."""
    config = load_preset(AGENT, secrets=["ALE_TEST_SECRET"])
    cli = CliInstall(name=CLI, version="0.0.0", root=tmp_path / "cli", entry="bin/claude", files=("bin/claude",))
    handle = SandboxHandle.for_endpoint("http://127.0.0.1:9", token="sandbox-token")
    monkeypatch.setenv("ALE_TEST_SECRET", "s3cret-value")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-the-real-key")  # the gateway's: on the host, not for the agent
    executor = make_executor(
        config,
        handle,
        tmp_path / "work",
        cli=cli,
        base_url="http://127.0.0.1:1",
        token="gw-token",
        native=native,
        env={"ALE_TEST_SECRET": "s3cret-value"},
    )
    deployer = make_deployer(executor)
    asyncio.run(deployer.install())
    work = tmp_path / "work"
    servers = json.loads((work / "claude-code" / "mcp.json").read_text())["mcpServers"]
    assert sorted(servers) == (["cua"] if native else ["cua", "vm"])
    for kind, server in servers.items():
        assert server["type"] == "stdio"
        assert server["args"][-4:] == ["mcp", kind, "--endpoint", "http://127.0.0.1:9"]
        # The endpoint's token reaches the bridge through a private file, never in this (recorded) config.
        assert "ALE_IAC_ENDPOINT_TOKEN" not in server["env"]
        assert Path(server["env"]["ALE_IAC_ENDPOINT_TOKEN_FILE"]).read_text() == "sandbox-token"
        assert "ALE_TEST_SECRET" not in server["env"]
        assert "ANTHROPIC_API_KEY" not in server["env"]
    run_dir = work / "claude-code" / "run"
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700

    argv = deployer.argv("-a prompt that looks like an option")  # type: ignore[attr-defined]
    assert argv[0] == str(cli.root / cli.entry)
    assert argv[-2:] == ["--", "-a prompt that looks like an option"]
    assert argv[argv.index("--mcp-config") + 1] == str(work / "claude-code" / "mcp.json")
    assert argv[argv.index("--max-turns") + 1] == "100"
    for flag in ("--strict-mcp-config", "--no-session-persistence", "--verbose"):
        assert flag in argv
    tools = argv[argv.index("--tools") + 1]
    allowed = argv[argv.index("--allowedTools") + 1]
    if native:
        assert tools == "Bash,Read,Write,Edit"
        assert allowed == "mcp__cua,Bash,Read,Write,Edit"
    else:
        assert tools == ""
        assert allowed == "mcp__vm,mcp__cua"
    env = deployer.launch_env()  # type: ignore[attr-defined]
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:1"
    assert env["ANTHROPIC_API_KEY"] == "gw-token"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["CLAUDE_CODE_MAX_RETRIES"] == "2"  # the preset's
    assert env["ENABLE_TOOL_SEARCH"] == "false"
    assert env["MCP_TIMEOUT"] == "60000"  # the CLI's most: a loaded host's bridge takes tens of seconds
    assert env["HOME"] == str(work / "claude-code" / "home")
    assert env["XDG_RUNTIME_DIR"] == env["CLAUDE_CODE_TMPDIR"] == str(run_dir)


# ------------------------------------------------------------------------------------------------------
# The transcript parser, on transcripts of real runs
# ------------------------------------------------------------------------------------------------------


def test_parse_a_run_through_both_bridges() -> None:
    parsed = parse("bridges.jsonl")
    trajectory = parsed.trajectory
    assert trajectory.session_id != "fallback"  # the CLI's own session id
    assert trajectory.agent.version == "2.1.332" and trajectory.agent.model_name == "scripted-model"
    assert trajectory.steps[0].source == "user" and trajectory.steps[0].message == "the prompt"
    # Steps carry the CLI's own timestamps, in order (the prompt: the first event's)
    events = [
        json.loads(line) for line in (FIXTURES / AGENT / "bridges.jsonl").read_text().splitlines() if line[:1] == "{"
    ]
    stamps = [e["timestamp"] for e in events if "timestamp" in e]
    assert trajectory.steps[0].timestamp == stamps[0]
    assert [s.timestamp for s in trajectory.steps[1:]] == sorted(s.timestamp for s in trajectory.steps[1:])
    assert {s.timestamp for s in trajectory.steps} <= set(stamps)
    steps = tool_steps(trajectory)
    names = [s.tool_calls[0].function_name for s in steps]
    assert names == [
        "mcp__vm__run_command",
        "mcp__vm__write_text",
        "mcp__vm__run_command",
        "mcp__vm__read_text",
        "mcp__cua__screenshot",
    ]
    check_pairing(trajectory)
    assert all(s.tool_calls[0].tool_call_id.startswith("toolu_") for s in steps)
    assert steps[1].tool_calls[0].arguments == {
        "path": "/tmp/ale-fixture/hello.txt",
        "content": "hello from the agent\n",
    }
    results = [s.observation.results[0] for s in steps]
    assert [r.is_error for r in results] == [False, False, False, True, False]
    assert json.loads(results[2].content)["stdout"] == "hello from the agent\n"
    assert "missing.txt" in results[3].content
    assert results[4].content == "Screenshot captured"
    [shot] = results[4].extra["screenshots"]
    assert shot == f"screenshots/step-{steps[4].step_id}.png"
    assert parsed.images[shot].startswith(PNG_MAGIC)
    assert trajectory.steps[-1].source == "agent"
    assert trajectory.steps[-1].message == "Done: the file holds the greeting."
    metrics = trajectory.final_metrics
    assert metrics is not None
    assert (metrics.total_prompt_tokens, metrics.total_completion_tokens, metrics.total_cached_tokens) == (8100, 159, 0)
    assert metrics.total_tool_calls == 5 and metrics.total_errors == 1
    assert trajectory.extra is not None and trajectory.extra["final_answer"] == "Done: the file holds the greeting."
    text = (FIXTURES / AGENT / "bridges.jsonl").read_text()
    assert parser().run_error(parser().read_transcript(text), 0) is None


def test_parse_native_tools() -> None:
    trajectory = parse("native.jsonl").trajectory
    steps = tool_steps(trajectory)
    assert [s.tool_calls[0].function_name for s in steps] == ["Bash", "Bash", "mcp__cua__screenshot"]
    check_pairing(trajectory)
    assert steps[0].tool_calls[0].arguments["command"] == "echo native > native.txt && cat native.txt"
    assert steps[0].observation.results[0].content == "native"
    failed = steps[1].observation.results[0]
    assert failed.is_error and failed.content.startswith("Exit code 1")
    assert trajectory.final_metrics is not None and trajectory.final_metrics.total_prompt_tokens == 2600


def test_parse_an_api_error() -> None:
    text = (FIXTURES / AGENT / "http500.jsonl").read_text()
    error = parser().run_error(parser().read_transcript(text), 1)
    assert error is not None and error.startswith("api_error (HTTP 500): API Error: 500")
    trajectory = parse("http500.jsonl", status="failed", exit_code=1, error=error).trajectory
    systems = [s for s in trajectory.steps if s.source == "system"]
    assert len(systems) == 1  # the CLI says it twice (a synthetic message and the result): one step
    assert systems[0].message.startswith("API Error: 500 scripted failure")
    assert tool_steps(trajectory) == []
    assert trajectory.extra is not None and trajectory.extra["terminal_reason"] == "api_error"


def test_parse_a_cli_that_never_started() -> None:
    text = (FIXTURES / AGENT / "crash.jsonl").read_text()
    error = parser().run_error(parser().read_transcript(text), 1)
    assert error == "the CLI exited 1 before writing a transcript: error: unknown option '--no-such-option'"
    trajectory = parse("crash.jsonl", status="failed", exit_code=1, error=error).trajectory
    assert [s.source for s in trajectory.steps] == ["user", "system"]
    assert trajectory.steps[1].message == error
    assert trajectory.final_metrics is not None and trajectory.final_metrics.total_prompt_tokens is None


def test_parse_a_run_cut_off_mid_call() -> None:
    """Stopped from outside (the unit's timeout) while a tool ran: the call has no result, and a
    system step says what happened."""
    lines = (FIXTURES / AGENT / "bridges.jsonl").read_text().splitlines()
    cut = next(i for i, line in enumerate(lines) if '"name":"mcp__vm__read_text"' in line)
    text = "\n".join(lines[: cut + 1])
    assert parser().run_error(parser().read_transcript(text), -9).startswith("the CLI exited -9 without a final result")
    trajectory = (
        parser()
        .to_trajectory(
            text,
            prompt="p",
            agent=AgentInfo(name="claude-code"),
            session_id="s",
            status="timeout",
            error="agent exceeded its 60 s limit",
        )
        .trajectory
    )
    last_call = tool_steps(trajectory)[-1]
    assert last_call.tool_calls[0].function_name == "mcp__vm__read_text"
    assert last_call.observation.results[0].is_error
    assert "no result" in last_call.observation.results[0].content
    assert trajectory.steps[-1].source == "system"
    assert trajectory.steps[-1].message == "the run was stopped: agent exceeded its 60 s limit"


def test_a_bridge_that_did_not_start_fails_the_run() -> None:
    events = [
        json.loads(line)
        for line in (FIXTURES / AGENT / "bridges.jsonl").read_text().splitlines()
        if line.startswith("{")
    ]
    for event in events:
        if event.get("subtype") == "init":
            event["mcp_servers"][0]["status"] = "failed"
    text = "\n".join(json.dumps(e) for e in events)
    assert parser().run_error(parser().read_transcript(text), 0) == "MCP server(s) failed to start: vm (failed)"
    trajectory = (
        parser().to_trajectory(text, prompt=None, agent=AgentInfo(name="c"), session_id="s", status="failed").trajectory
    )
    assert trajectory.steps[0].source == "system" and "vm (failed) did not start" in trajectory.steps[0].message


def test_an_event_that_does_not_fit_its_type_becomes_a_system_step() -> None:
    """An assistant event whose message is no object, a result whose token count is no number: each is named
    in a system step where it stood, and the rest of the run is read as usual."""
    events = [
        json.loads(line)
        for line in (FIXTURES / AGENT / "bridges.jsonl").read_text().splitlines()
        if line.startswith("{")
    ]
    calls = [i for i, e in enumerate(events) if e["type"] == "assistant" and "tool_use" in json.dumps(e["message"])]
    events[calls[1]]["message"] = "not an object"
    events[-1]["usage"]["input_tokens"] = "many"
    text = "\n".join(json.dumps(e) for e in events)
    trajectory = parser().to_trajectory(text, prompt="p", agent=AgentInfo(name="c"), session_id="s", status="failed")
    steps = trajectory.trajectory.steps
    unreadable = [s.message for s in steps if s.source == "system" and s.message.startswith("unreadable")]
    assert unreadable == [
        "unreadable assistant event in the transcript (message: Input should be a valid dictionary or instance of "
        "AssistantMessage)",
        "unreadable result event in the transcript (usage.input_tokens: Input should be a valid integer, unable to "
        "parse string as an integer)",
    ]
    names = [s.tool_calls[0].function_name for s in tool_steps(trajectory.trajectory)]
    assert names == ["mcp__vm__run_command", "mcp__vm__run_command", "mcp__vm__read_text", "mcp__cua__screenshot"]
    check_pairing(trajectory.trajectory)
    error = parser().run_error(parser().read_transcript(text), 0)
    assert error is not None and error.startswith("the CLI exited 0 without a final result")


# ------------------------------------------------------------------------------------------------------
# The real CLI
# ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def claude_cli(tmp_path_factory: pytest.TempPathFactory) -> CliInstall:
    return staged_cli(CLI, tmp_path_factory)


@pytest.fixture(scope="module")
def handle(local_sandbox: Any) -> SandboxHandle:
    return sandbox_handle(local_sandbox)


@pytest.mark.agent_clis
@pytest.mark.sandbox
def test_real_claude_code_solves_a_task_through_the_bridges(
    handle: SandboxHandle, claude_cli: CliInstall, tmp_path: Path
) -> None:
    with sandbox_dir(handle, "ale-claude") as folder:
        run = run_unit(load_preset(AGENT), handle, tmp_path, claude_cli, task_turns(folder))
        # The sandbox's state: the file the agent wrote through the vm bridge.
        assert asyncio.run(sandbox_read(handle, f"{folder}/hello.txt")) == "hello from the agent\n"
    assert run.result.status == "completed", run.result.error
    assert run.result.exit_code == 0
    assert run.server.plan_errors == []
    served = run.server.usage_served()
    assert served["requests"] == 6
    assert {r.auth for r in run.server.requests} == {"ok"}  # every request carried the gateway token
    assert "claude-code/transcript.jsonl" in run.result.logs

    trajectory = run.trajectory
    check_pairing(trajectory)
    steps = tool_steps(trajectory)
    calls = [(s.tool_calls[0].function_name, s.tool_calls[0].arguments) for s in steps]
    assert calls == [
        ("mcp__vm__run_command", {"command": f"mkdir -p {folder}"}),
        ("mcp__vm__write_text", {"path": f"{folder}/hello.txt", "content": "hello from the agent\n"}),
        ("mcp__vm__run_command", {"command": f"cat {folder}/hello.txt"}),
        ("mcp__vm__read_text", {"path": f"{folder}/missing.txt"}),
        ("mcp__cua__screenshot", {}),
    ]
    results = [s.observation.results[0] for s in steps]
    assert [r.is_error for r in results] == [False, False, False, True, False]
    assert json.loads(results[2].content)["stdout"] == "hello from the agent\n"
    [shot] = screenshots_of(trajectory)
    assert (run.work_dir / shot).read_bytes().startswith(PNG_MAGIC)
    assert trajectory.steps[-1].message == "Done: the file holds the greeting."
    metrics = trajectory.final_metrics
    assert metrics is not None
    assert metrics.total_prompt_tokens == served["input_tokens"] == 8100
    assert metrics.total_completion_tokens == served["output_tokens"] == 159
    assert run.token not in (run.work_dir / "claude-code" / "transcript.jsonl").read_text()


@pytest.mark.agent_clis
@pytest.mark.sandbox
def test_real_claude_code_with_its_own_shell(handle: SandboxHandle, claude_cli: CliInstall, tmp_path: Path) -> None:
    """The in-sandbox shape (emulated on this host): Bash is allowed and runs, as root, and the cua
    bridge is the only bridge."""
    turns = [
        {
            "tool": "shell",
            "arguments": {"command": "echo native > native.txt && cat native.txt"},
            "usage": usage(500, 11),
        },
        {"tool": "mcp:cua.screenshot", "arguments": {}, "usage": usage(600, 12)},
        {"text": "Done natively.", "usage": usage(700, 13)},
    ]
    run = run_unit(load_preset(AGENT), handle, tmp_path, claude_cli, turns, native=True)
    assert run.result.status == "completed", run.result.error
    assert run.server.plan_errors == []
    assert (tmp_path / "native.txt").read_text() == "native\n"  # the work dir is its cwd
    offered = run.server.requests[0].offered
    assert "Bash" in offered and not any(name.startswith("mcp__vm__") for name in offered)
    steps = tool_steps(run.trajectory)
    assert [s.tool_calls[0].function_name for s in steps] == ["Bash", "mcp__cua__screenshot"]
    assert steps[0].observation.results[0].content == "native"
    assert run.trajectory.final_metrics is not None
    assert run.trajectory.final_metrics.total_prompt_tokens == run.server.usage_served()["input_tokens"]


@pytest.mark.agent_clis
@pytest.mark.sandbox
def test_real_claude_code_reports_a_model_failure(
    handle: SandboxHandle, claude_cli: CliInstall, tmp_path: Path
) -> None:
    run = run_unit(
        load_preset(AGENT, settings={"max_retries": 0}), handle, tmp_path, claude_cli, [{"fail": "http_500"}]
    )
    assert run.result.status == "failed"
    assert run.result.exit_code == 1
    assert run.result.error is not None and "HTTP 500" in run.result.error
    assert len(run.server.requests) == 1  # no retry
    systems = [s for s in run.trajectory.steps if s.source == "system"]
    assert systems and "500" in systems[-1].message
    assert tool_steps(run.trajectory) == []


@pytest.mark.agent_clis
def test_real_claude_code_that_never_starts(claude_cli: CliInstall, tmp_path: Path) -> None:
    """A CLI that refuses its command line writes no transcript: failed, and the trajectory says why."""
    config = load_preset(AGENT, settings={"extra_args": ["--no-such-option"]})
    handle = SandboxHandle.for_endpoint("http://127.0.0.1:9")
    run = run_unit(config, handle, tmp_path, claude_cli, [{"text": "never asked"}])
    assert run.result.status == "failed"
    assert run.result.error == "the CLI exited 1 before writing a transcript: error: unknown option '--no-such-option'"
    assert run.server.requests == []
    assert [s.source for s in run.trajectory.steps] == ["user", "system"]
    assert run.trajectory.steps[1].message == run.result.error
