"""The ``sandbox`` executor against a real local sandbox: the deployer is shipped in and runs inside
(its shell is the sandbox's), the bridges are started inside, and whatever way the run ends (done,
its own deadline, a cancel, a crash) nothing of it keeps running in the sandbox."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from ale_iac.agent_sdk import AgentConfig, AgentRunResult, load_deployer_class
from ale_iac.egress_policy import EgressPolicy
from ale_iac.executors.sandbox import SandboxExecutor
from ale_iac.runner.records import Redactor
from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.substrates.egress import PROXY_ENV
from ale_iac.substrates.local.sandboxes import LocalSandboxState
from tests.support.sandbox import handle_of, run

pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group("sandbox-executor"), pytest.mark.timeout(300)]

PROBE = Path(__file__).parent / "presets" / "probe"


def probe_config(**settings: Any) -> AgentConfig:
    data = yaml.safe_load((PROBE / "preset.yaml").read_text())
    return AgentConfig.model_validate({**data, "settings": settings, "source_dir": str(PROBE)})


def executor_for(config: AgentConfig, handle: SandboxHandle, work_dir: Path, **kwargs: Any) -> SandboxExecutor:
    work_dir.mkdir(parents=True, exist_ok=True)
    return SandboxExecutor(config=config, sandbox=handle, work_dir=work_dir, env={}, redact=Redactor(), **kwargs)


async def run_probe(executor: SandboxExecutor, prompt: str, timeout_s: float) -> AgentRunResult:
    deployer = load_deployer_class(executor.config)(executor)
    return await executor.run_deployer(deployer, prompt, timeout_s)


def in_sandbox(state: LocalSandboxState, command: str) -> dict[str, Any]:
    return run(state, command)


@pytest.fixture(scope="module")
def sandbox(local_sandbox: LocalSandboxState) -> LocalSandboxState:
    return local_sandbox


def test_the_deployer_runs_inside_the_sandbox(sandbox: LocalSandboxState, tmp_path: Path) -> None:
    executor = executor_for(probe_config(), handle_of(sandbox), tmp_path / "unit" / "agent")
    result = asyncio.run(run_probe(executor, "look around", 120))
    assert result.status == "completed", (result, (tmp_path / "unit" / "agent" / "_entry.log").read_text())

    mirror = tmp_path / "unit" / "agent"
    report = json.loads((mirror / "report.json").read_text())
    assert report["kind"] == "sandbox" and report["native_shell"] is True
    assert report["shell_exit"] == 0
    # The sandbox's own hostname, seen by the deployer's Python and by its shell.
    hostname = in_sandbox(sandbox, "hostname")["stdout"].strip()
    assert report["hostname"] == hostname
    assert (mirror / "shell.log").read_text().splitlines()[0] == hostname
    # The cua bridge, started inside over stdio, answered with an image.
    assert "screenshot" in report["cua_tools"] and "image" in report["screenshot"]
    # Without a grant there is no model, and the deployer was told so.
    assert "has no model" in report["model"]["error"]
    # The work dir is in the sandbox; the prompt reached the deployer there; the secrets file is gone.
    remote = executor.remote_work_dir
    assert in_sandbox(sandbox, f"cat {remote}/prompt-seen.txt")["stdout"] == "look around"
    assert in_sandbox(sandbox, f"test -e {remote}/_secrets.json")["return_code"] != 0
    # The host mirror has the agent's files, not the entry's private ones.
    assert not (mirror / "_spec.json").exists() and not (mirror / "_pid").exists()
    assert (mirror / "install.log").read_text() == "kind=sandbox native_shell=True\n"
    assert not [line for line in (mirror / "env.txt").read_text().splitlines() if "_proxy=" in line.lower()]


def test_a_deployer_in_a_unit_with_egress_sees_the_proxy_variables(sandbox: LocalSandboxState, tmp_path: Path) -> None:
    """The agent's process, started through the computer-server, has the unit's command environment (the egress
    proxy's variables: ``SandboxHandle.command_env``), and so has what it runs."""
    handle = handle_of(sandbox).with_egress(EgressPolicy(allow=["pypi.org"]).model_dump(mode="json"))
    executor = executor_for(probe_config(), handle, tmp_path / "unit" / "agent")
    result = asyncio.run(run_probe(executor, "look around", 120))
    assert result.status == "completed", (result, (tmp_path / "unit" / "agent" / "_entry.log").read_text())
    seen = [
        line for line in (tmp_path / "unit" / "agent" / "env.txt").read_text().splitlines() if "_proxy=" in line.lower()
    ]
    assert sorted(seen) == sorted(f"{name}={value}" for name, value in PROXY_ENV.items())


def test_its_own_deadline_kills_what_it_started(sandbox: LocalSandboxState, tmp_path: Path) -> None:
    executor = executor_for(probe_config(mode="hang"), handle_of(sandbox), tmp_path / "unit" / "agent")
    result = asyncio.run(run_probe(executor, "hang", 3))
    assert result.status == "timeout", result
    assert "started" in (tmp_path / "unit" / "agent" / "hang.log").read_text()  # there was a child to kill
    assert in_sandbox(sandbox, "pgrep -f 'slee[p] 3600'")["return_code"] == 1


def test_a_cancelled_run_leaves_nothing_running(sandbox: LocalSandboxState, tmp_path: Path) -> None:
    executor = executor_for(probe_config(mode="hang"), handle_of(sandbox), tmp_path / "unit" / "agent")

    async def scenario() -> None:
        task = asyncio.create_task(run_probe(executor, "hang", 600))
        deadline = time.monotonic() + 120
        # Wait (by probing the sandbox) until the agent's child runs, then cancel as the runner would.
        while (await asyncio.to_thread(in_sandbox, sandbox, "pgrep -f 'slee[p] 3600'"))["return_code"] != 0:
            assert time.monotonic() < deadline, "the in-sandbox agent never started"
            assert not task.done(), task.result()
            await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert in_sandbox(sandbox, "pgrep -f 'slee[p] 3600'")["return_code"] == 1
    assert in_sandbox(sandbox, "pgrep -f 'ale_iac[.]executors[.]entry'")["return_code"] == 1


def test_a_deployer_that_raises_gives_a_failed_result(sandbox: LocalSandboxState, tmp_path: Path) -> None:
    executor = executor_for(probe_config(mode="crash"), handle_of(sandbox), tmp_path / "unit" / "agent")
    result = asyncio.run(run_probe(executor, "crash", 60))
    assert result.status == "failed"
    assert "probe asked to crash in install" in (result.error or "")
    assert "RuntimeError" in (tmp_path / "unit" / "agent" / "_entry.log").read_text()


def test_secrets_never_go_into_a_sandbox(sandbox: LocalSandboxState, tmp_path: Path) -> None:
    config = probe_config().model_copy(update={"secrets": ["SOME_KEY"]})
    executor = SandboxExecutor(
        config=config,
        sandbox=handle_of(sandbox),
        work_dir=tmp_path,
        env={"SOME_KEY": "s3cret-value-123"},
        redact=Redactor(["s3cret-value-123"]),
    )
    with pytest.raises(Exception, match="secrets never enter a sandbox"):
        asyncio.run(run_probe(executor, "x", 60))
