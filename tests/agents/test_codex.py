"""Codex as an agent (agents/codex): its preset, config.toml and transcript parser, then the REAL CLI.

The parser tests read transcripts captured from real runs of Codex 0.171.0 through this deployer
(tests/agents/fixtures/codex/, README there). The others run the real CLI, installed from npm
(``agent_clis``) and run from a copy of its ``files`` alone, under the ``local`` executor against the
session's local sandbox (``sandbox``), with the scripted model server standing in for the API.
"""

from __future__ import annotations

import asyncio
import json
import tomllib
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

AGENT = "codex"
CLI = "codex"


def parser() -> Any:
    return deployer_module(load_preset(AGENT)).transcript


def parse_text(text: str, status: str = "completed", exit_code: int | None = 0, error: str | None = None) -> Any:
    return parser().to_trajectory(
        text,
        prompt="the prompt",
        agent=AgentInfo(name="codex", version="0.171.0", model_name="preset-model"),
        session_id="fallback",
        status=status,
        exit_code=exit_code,
        error=error,
    )


def fixture(name: str) -> str:
    return (FIXTURES / AGENT / name).read_text()


# ------------------------------------------------------------------------------------------------------
# Preset, settings, config.toml
# ------------------------------------------------------------------------------------------------------


def test_preset_validates_and_bad_ones_name_the_field() -> None:
    config = load_preset(AGENT)
    cls = deployer_module(config).CodexDeployer
    tools = bridge_tools()
    cls.validate_config(config, tools)
    assert cls.default_executor == "sandbox"
    assert cls.supported_executors == {"local", "sandbox", "docker"}
    assert cls.clis == (CLI,) and cls.model_api == "openai"
    cases: list[tuple[dict[str, Any], str]] = [
        ({"model": None}, "model"),
        ({"model": {"name": "claude", "api": "anthropic"}}, "model.api"),
        ({"settings": {"max_retries": -1}}, "settings.max_retries"),
        ({"settings": {"bridge_startup_s": 5}}, "settings.bridge_startup_s"),
        ({"settings": {"sandbox": "off"}}, "settings.sandbox"),
    ]
    for overrides, field in cases:
        with pytest.raises(ConfigError) as info:
            cls.validate_config(load_preset(AGENT, **overrides), tools)
        assert info.value.field == field, overrides


def test_toml_strings_survive_every_character() -> None:
    module = deployer_module(load_preset(AGENT))
    nasty = 'quote " backslash \\ newline \n tab \t bell \x07 del \x7f emoji \U0001f600 accent é'
    value = {"env": {"A B": nasty, "PATH": "/usr/bin"}, "args": ["-m", nasty], "n": 0, "on": True}
    text = "\n".join(f"{k} = {module.toml_value(v)}" for k, v in value.items())
    assert tomllib.loads(text) == value


@pytest.mark.parametrize("native", [False, True], ids=["outside", "in-sandbox"])
def test_install_writes_config_toml_and_the_command_line(
    tmp_path: Path, native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outside the sandbox: both bridges and no shell; inside: the cua bridge, the shell, and Codex's
    own command sandbox off. Secrets never reach a bridge's environment."""
    config = load_preset(AGENT, secrets=["ALE_TEST_SECRET"])
    cli = CliInstall(name=CLI, version="0.0.0", root=tmp_path / "cli", entry="bin/codex", files=("bin/codex",))
    handle = SandboxHandle.for_endpoint("http://127.0.0.1:9", token="sandbox-token")
    monkeypatch.setenv("ALE_TEST_SECRET", "s3cret-value")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-the-real-key")  # the gateway's: on the host, not for the agent
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
    codex_home = tmp_path / "work" / "codex" / "codex-home"
    toml = tomllib.loads((codex_home / "config.toml").read_text())
    assert toml["model"] == "scripted-model" and toml["model_provider"] == "ale"
    assert toml["analytics"] == {"enabled": False} and toml["features"] == {"plugins": False}
    provider = toml["model_providers"]["ale"]
    assert provider["base_url"] == "http://127.0.0.1:1/v1" and provider["wire_api"] == "responses"
    assert provider["env_key"] == "OPENAI_API_KEY"
    assert provider["request_max_retries"] == provider["stream_max_retries"] == 2  # the preset's
    servers = toml["mcp_servers"]
    assert sorted(servers) == (["cua"] if native else ["cua", "vm"])
    for kind, server in servers.items():
        assert server["args"][-4:] == ["mcp", kind, "--endpoint", "http://127.0.0.1:9"]
        assert server["required"] is True and server["default_tools_approval_mode"] == "approve"
        assert server["startup_timeout_sec"] == 120  # longer than Codex's own wait: a loaded host's bridge
        # The endpoint's token reaches the bridge through a private file, never in this (recorded) config.
        assert "ALE_IAC_ENDPOINT_TOKEN" not in server["env"]
        assert Path(server["env"]["ALE_IAC_ENDPOINT_TOKEN_FILE"]).read_text() == "sandbox-token"
        assert "ALE_TEST_SECRET" not in server["env"]
        assert "OPENAI_API_KEY" not in server["env"]

    argv = deployer.argv("-a prompt that looks like an option")  # type: ignore[attr-defined]
    assert argv[:3] == [str(cli.root / cli.entry), "exec", "--json"]
    assert "--skip-git-repo-check" in argv and "--ephemeral" not in argv
    assert argv[-2:] == ["--", "-a prompt that looks like an option"]
    if native:
        assert argv[argv.index("-s") + 1] == "danger-full-access"
        assert "shell_tool" not in argv
    else:
        assert "-s" not in argv
        assert argv[argv.index("shell_tool") - 1] == "--disable"
    env = deployer.launch_env()  # type: ignore[attr-defined]
    assert env == {
        "CODEX_HOME": str(codex_home),
        "HOME": str(tmp_path / "work" / "codex" / "home"),
        "OPENAI_API_KEY": "gw-token",
    }


# ------------------------------------------------------------------------------------------------------
# The transcript parser, on transcripts of real runs
# ------------------------------------------------------------------------------------------------------


def test_parse_a_run_through_both_bridges() -> None:
    parsed = parse_text(fixture("bridges.jsonl"))
    trajectory = parsed.trajectory
    assert trajectory.session_id != "fallback"  # the CLI's thread id
    assert trajectory.steps[0].source == "user" and trajectory.steps[0].message == "the prompt"
    steps = tool_steps(trajectory)
    assert [s.tool_calls[0].function_name for s in steps] == [
        "mcp__vm__run_command",
        "mcp__vm__write_text",
        "mcp__vm__run_command",
        "mcp__vm__read_text",
        "mcp__cua__screenshot",
    ]
    check_pairing(trajectory)
    assert [s.tool_calls[0].tool_call_id for s in steps] == ["item_1", "item_2", "item_3", "item_4", "item_5"]
    assert steps[1].tool_calls[0].arguments == {
        "path": "/tmp/ale-fixture/hello.txt",
        "content": "hello from the agent\n",
    }
    results = [s.observation.results[0] for s in steps]
    assert [r.is_error for r in results] == [False, False, False, True, False]
    assert "hello from the agent" in results[2].content
    assert "missing.txt" in results[3].content
    [shot] = results[4].extra["screenshots"]
    assert shot == f"screenshots/step-{steps[4].step_id}.png"
    assert parsed.images[shot].startswith(PNG_MAGIC)
    assert trajectory.steps[-1].source == "agent"
    assert trajectory.steps[-1].message == "Done: the file holds the greeting."
    metrics = trajectory.final_metrics
    assert metrics is not None
    assert (metrics.total_prompt_tokens, metrics.total_completion_tokens, metrics.total_cached_tokens) == (8100, 159, 0)
    assert metrics.total_tool_calls == 5 and metrics.total_errors == 1
    # Codex's warning about an unknown model's metadata is kept, as a system step
    assert any(s.source == "system" and "Model metadata" in s.message for s in trajectory.steps)
    assert parser().run_error(parser().read_transcript(fixture("bridges.jsonl")), 0) is None


def test_parse_the_native_shell() -> None:
    trajectory = parse_text(fixture("native.jsonl")).trajectory
    steps = tool_steps(trajectory)
    assert [s.tool_calls[0].function_name for s in steps] == ["exec_command", "exec_command", "mcp__cua__screenshot"]
    check_pairing(trajectory)
    assert steps[0].tool_calls[0].arguments["command"].endswith("'echo native > native.txt && cat native.txt'")
    assert steps[0].observation.results[0].content == "native\n\n[exit code 0]"
    failed = steps[1].observation.results[0]
    assert (
        failed.is_error and "No such file or directory" in failed.content and failed.content.endswith("[exit code 1]")
    )
    assert trajectory.final_metrics is not None and trajectory.final_metrics.total_prompt_tokens == 2600


def test_parse_a_failed_turn() -> None:
    text = fixture("http500.jsonl")
    error = parser().run_error(parser().read_transcript(text), 1)
    assert error is not None and error.startswith("turn failed: ")
    trajectory = parse_text(text, status="failed", exit_code=1, error=error).trajectory
    assert trajectory.steps[-1].source == "system" and trajectory.steps[-1].message == error
    assert tool_steps(trajectory) == []
    assert trajectory.final_metrics is not None and trajectory.final_metrics.total_prompt_tokens is None


def test_parse_a_cli_that_never_started() -> None:
    text = fixture("crash.jsonl")
    error = parser().run_error(parser().read_transcript(text), 2)
    assert error is not None and error.startswith("the CLI exited 2 before writing a transcript: ")
    assert "unexpected argument '--no-such-option'" in error
    trajectory = parse_text(text, status="failed", exit_code=2, error=error).trajectory
    assert [s.source for s in trajectory.steps] == ["user", "system"]
    assert trajectory.steps[1].message == error


def test_parse_a_run_cut_off_mid_call() -> None:
    """Stopped from outside (the unit's timeout) while a tool ran: the call has no result, and a
    system step says what happened."""
    lines = fixture("bridges.jsonl").splitlines()
    cut = next(i for i, line in enumerate(lines) if '"item.started"' in line and '"read_text"' in line)
    text = "\n".join(lines[: cut + 1])
    assert parser().run_error(parser().read_transcript(text), -9).startswith("the CLI exited -9 without completing")
    trajectory = parse_text(text, status="timeout", exit_code=None, error="agent exceeded its 60 s limit").trajectory
    last_call = tool_steps(trajectory)[-1]
    assert last_call.tool_calls[0].function_name == "mcp__vm__read_text"
    assert last_call.observation.results[0].is_error
    assert "no result" in last_call.observation.results[0].content
    assert trajectory.steps[-1].message == "the run was stopped: agent exceeded its 60 s limit"


def test_an_event_that_does_not_fit_its_type_becomes_a_system_step() -> None:
    """A tool item whose server is no string, a completed turn whose token count is no number: each is named
    in a system step where it stood, and the rest of the run is read as usual."""
    lines = fixture("bridges.jsonl").splitlines()
    events = {i: json.loads(line) for i, line in enumerate(lines) if line.startswith("{")}
    write = next(i for i, e in events.items() if e["type"] == "item.completed" and e["item"]["id"] == "item_2")
    events[write]["item"]["server"] = 7
    turn = next(i for i, e in events.items() if e["type"] == "turn.completed")
    events[turn]["usage"]["input_tokens"] = "many"
    text = "\n".join(json.dumps(events[i]) if i in events else line for i, line in enumerate(lines))
    trajectory = parse_text(text, status="failed", exit_code=0).trajectory
    unreadable = [s.message for s in trajectory.steps if s.source == "system" and s.message.startswith("unreadable")]
    assert unreadable == [
        "unreadable item.completed event in the transcript (item.mcp_tool_call.server: Input should be a valid string)",
        "unreadable turn.completed event in the transcript (usage.input_tokens: Input should be a valid integer, "
        "unable to parse string as an integer)",
    ]
    steps = tool_steps(trajectory)
    assert len(steps) == 5 and "no result" in steps[1].observation.results[0].content  # its end was unreadable
    assert steps[2].observation.results[0].content.startswith("exit_code: 0")
    check_pairing(trajectory)
    error = parser().run_error(parser().read_transcript(text), 0)
    assert error is not None and error.startswith("the CLI exited 0 without completing a turn")


# ------------------------------------------------------------------------------------------------------
# The real CLI
# ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def codex_cli(tmp_path_factory: pytest.TempPathFactory) -> CliInstall:
    return staged_cli(CLI, tmp_path_factory)


@pytest.fixture(scope="module")
def handle(local_sandbox: Any) -> SandboxHandle:
    return sandbox_handle(local_sandbox)


@pytest.mark.agent_clis
@pytest.mark.sandbox
def test_real_codex_solves_a_task_through_the_bridges(
    handle: SandboxHandle, codex_cli: CliInstall, tmp_path: Path
) -> None:
    with sandbox_dir(handle, "ale-codex") as folder:
        run = run_unit(load_preset(AGENT), handle, tmp_path, codex_cli, task_turns(folder))
        assert asyncio.run(sandbox_read(handle, f"{folder}/hello.txt")) == "hello from the agent\n"
    assert run.result.status == "completed", run.result.error
    assert run.result.exit_code == 0
    assert run.server.plan_errors == []
    served = run.server.usage_served()
    assert served["requests"] == 6
    assert {r.auth for r in run.server.requests} == {"ok"}  # every request carried the gateway token
    offered = run.server.requests[0].offered
    assert not any(name in offered for name in ("exec_command", "shell", "shell_command"))  # no host shell

    trajectory = run.trajectory
    assert trajectory.agent.version == codex_cli.version  # as the CLI itself says (codex --version)
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
    assert "hello from the agent" in results[2].content
    [shot] = screenshots_of(trajectory)
    assert (run.work_dir / shot).read_bytes().startswith(PNG_MAGIC)
    assert trajectory.steps[-1].message == "Done: the file holds the greeting."
    metrics = trajectory.final_metrics
    assert metrics is not None
    assert metrics.total_prompt_tokens == served["input_tokens"] == 8100
    assert metrics.total_completion_tokens == served["output_tokens"] == 159
    rollouts = list((tmp_path / "codex" / "codex-home" / "sessions").rglob("rollout-*.jsonl"))
    assert len(rollouts) == 1  # Codex's own full record is kept in the work dir
    assert run.token not in (tmp_path / "codex" / "transcript.jsonl").read_text()


@pytest.mark.agent_clis
@pytest.mark.sandbox
def test_real_codex_with_its_own_shell(handle: SandboxHandle, codex_cli: CliInstall, tmp_path: Path) -> None:
    """The in-sandbox shape (emulated on this host): the shell tool runs, with Codex's own command
    sandbox off, and the cua bridge is the only bridge."""
    turns = [
        {
            "tool": "shell",
            "arguments": {"command": "echo native > native.txt && cat native.txt"},
            "usage": usage(500, 11),
        },
        {"tool": "mcp:cua.screenshot", "arguments": {}, "usage": usage(600, 12)},
        {"text": "Done natively.", "usage": usage(700, 13)},
    ]
    run = run_unit(load_preset(AGENT), handle, tmp_path, codex_cli, turns, native=True)
    assert run.result.status == "completed", run.result.error
    assert run.server.plan_errors == []
    assert (tmp_path / "native.txt").read_text() == "native\n"  # the work dir is its cwd
    offered = run.server.requests[0].offered
    assert "exec_command" in offered and not any(name.startswith("mcp__vm/") for name in offered)
    steps = tool_steps(run.trajectory)
    assert [s.tool_calls[0].function_name for s in steps] == ["exec_command", "mcp__cua__screenshot"]
    assert steps[0].observation.results[0].content.startswith("native\n")
    assert run.trajectory.final_metrics is not None
    assert run.trajectory.final_metrics.total_prompt_tokens == run.server.usage_served()["input_tokens"]


@pytest.mark.agent_clis
@pytest.mark.sandbox
def test_real_codex_reports_a_model_failure(handle: SandboxHandle, codex_cli: CliInstall, tmp_path: Path) -> None:
    run = run_unit(load_preset(AGENT, settings={"max_retries": 0}), handle, tmp_path, codex_cli, [{"fail": "http_500"}])
    assert run.result.status == "failed"
    assert run.result.exit_code == 1
    assert run.result.error is not None and run.result.error.startswith("turn failed: ")
    assert len([r for r in run.server.requests if r.served == "fail:http_500"]) == 1  # no retry
    assert run.trajectory.steps[-1].source == "system"
    assert run.trajectory.steps[-1].message == run.result.error
    assert tool_steps(run.trajectory) == []


@pytest.mark.agent_clis
def test_real_codex_that_never_starts(codex_cli: CliInstall, tmp_path: Path) -> None:
    """A CLI that refuses its command line writes no transcript: failed, and the trajectory says why."""
    config = load_preset(AGENT, settings={"extra_args": ["--no-such-option"]})
    handle = SandboxHandle.for_endpoint("http://127.0.0.1:9")
    run = run_unit(config, handle, tmp_path, codex_cli, [{"text": "never asked"}])
    assert run.result.status == "failed" and run.result.exit_code == 2
    assert run.result.error is not None
    assert "unexpected argument '--no-such-option'" in run.result.error
    assert run.server.requests == []
    assert [s.source for s in run.trajectory.steps] == ["user", "system"]
    assert json.dumps(run.trajectory.steps[1].message).count("--no-such-option") >= 1
