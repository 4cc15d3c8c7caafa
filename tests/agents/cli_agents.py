"""What the tests of the real agent CLIs (test_claude_code.py, test_codex.py) share: presets, executors,
the CLIs as a minimal copy, the fixtures captured from real runs, and a unit run against the scripted
model server."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import pytest
import yaml

from ale_iac.agent_sdk import (
    AgentConfig,
    AgentRunResult,
    BaseAgentDeployer,
    CliInstall,
    ModelGrant,
    load_deployer_class,
)
from ale_iac.agent_sdk.clis import ensure_cli
from ale_iac.agent_sdk.trajectory import Trajectory
from ale_iac.executors.local import LocalExecutor
from ale_iac.llm.plan import plan_from
from ale_iac.llm.scripted import ScriptedModelServer
from ale_iac.runner.records import Redactor
from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.sandbox.readiness import wait_ready
from ale_iac.substrates.local import sandboxes as local_sandboxes

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PROMPT = "Write the greeting to a file in the sandbox, check it, and look at the screen."


class NativeShellExecutor(LocalExecutor):
    """The in-sandbox shape emulated on this host: the agent keeps its own shell (which runs here,
    in the test's work dir) and gets only the cua bridge. The sandbox executor's own tests run it
    inside a sandbox."""

    native_shell: ClassVar[bool] = True


def load_preset(agent: str, **overrides: Any) -> AgentConfig:
    folder = REPO / "agents" / agent
    data = yaml.safe_load((folder / "preset.yaml").read_text())
    return AgentConfig.model_validate({**data, **overrides, "source_dir": str(folder)})


def deployer_module(config: AgentConfig) -> ModuleType:
    """agents/<name>/deployer.py as the runner imports it (agents/ is not a package)."""
    import sys

    return sys.modules[load_deployer_class(config).__module__]


def staged_copy(install: CliInstall, dest: Path) -> CliInstall:
    """``install``'s ``files`` alone, in ``dest`` (hard links where they can be): what an executor
    carries elsewhere. Running from it shows that the files are enough."""
    for rel in install.files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(install.root / rel, target)
        except OSError:
            import shutil

            shutil.copy2(install.root / rel, target)
    return CliInstall(name=install.name, version=install.version, root=dest, entry=install.entry, files=install.files)


def staged_cli(name: str, factory: pytest.TempPathFactory) -> CliInstall:
    return staged_copy(ensure_cli(name), factory.mktemp(f"{name}-copy"))


def make_executor(
    config: AgentConfig,
    handle: SandboxHandle,
    work_dir: Path,
    *,
    cli: CliInstall,
    base_url: str,
    token: str,
    native: bool = False,
    env: dict[str, str] | None = None,
) -> LocalExecutor:
    deployer_cls = load_deployer_class(config)
    assert deployer_cls.model_api is not None
    env = env or {}
    grant = ModelGrant(
        api=deployer_cls.model_api, model="scripted-model", token=token, tcp_root=base_url, attach_unix=lambda p: None
    )
    cls = NativeShellExecutor if native else LocalExecutor
    return cls(
        config=config,
        sandbox=handle,
        work_dir=work_dir,
        env=env,
        redact=Redactor(env.values()),
        model=grant,
        clis={cli.name: cli},
    )


def make_deployer(executor: LocalExecutor) -> BaseAgentDeployer:
    return load_deployer_class(executor.config)(executor)


@dataclass
class Run:
    result: AgentRunResult
    trajectory: Trajectory
    server: ScriptedModelServer
    work_dir: Path
    token: str


def run_unit(
    config: AgentConfig,
    handle: SandboxHandle,
    work_dir: Path,
    cli: CliInstall,
    turns: list[dict[str, Any]],
    *,
    native: bool = False,
    prompt: str = PROMPT,
) -> Run:
    """install -> launch -> parse_artifacts against a scripted model server that serves ``turns``
    and accepts only the unit's gateway token."""
    token = f"gw-{secrets.token_hex(8)}"
    plan = plan_from({"scripts": [{"match": ".", "turns": turns}]})
    with ScriptedModelServer(plan, api_key=token) as server:
        executor = make_executor(
            config, handle, work_dir, cli=cli, base_url=server.base_url, token=token, native=native
        )
        deployer = make_deployer(executor)

        async def unit() -> tuple[AgentRunResult, Trajectory]:
            await deployer.install()
            result = await asyncio.wait_for(deployer.launch(prompt), 150)
            return result, deployer.parse_artifacts(result)

        result, trajectory = asyncio.run(unit())
    return Run(result, Trajectory.model_validate(trajectory.model_dump(mode="json")), server, work_dir, token)


def sandbox_handle(state: Any) -> SandboxHandle:
    handle = SandboxHandle.for_endpoint(str(state.endpoint), token=local_sandboxes.auth_token(state))
    asyncio.run(wait_ready(handle, 90))
    return handle


@contextlib.contextmanager
def sandbox_dir(handle: SandboxHandle, prefix: str) -> Iterator[str]:
    """A fresh folder path in the sandbox (not created), removed afterwards."""
    path = f"/tmp/{prefix}-{secrets.token_hex(4)}"
    try:
        yield path
    finally:

        async def remove() -> None:
            async with handle.client() as client:
                await client.run_command(f"rm -rf {shlex.quote(path)}")

        asyncio.run(remove())


async def sandbox_read(handle: SandboxHandle, path: str) -> str:
    async with handle.client() as client:
        text: str = await client.read_text(path)
        return text


def task_turns(folder: str) -> list[dict[str, Any]]:
    """A small real task through both bridges: make a folder, write a file, read it back, fail to
    read a missing one (a tool error the agent sees), take a screenshot, answer."""
    return [
        {"tool": "mcp:vm.run_command", "arguments": {"command": f"mkdir -p {folder}"}, "usage": usage(1100, 50)},
        {
            "tool": "mcp:vm.write_text",
            "arguments": {"path": f"{folder}/hello.txt", "content": "hello from the agent\n"},
            "usage": usage(1200, 40),
        },
        {"tool": "mcp:vm.run_command", "arguments": {"command": f"cat {folder}/hello.txt"}, "usage": usage(1300, 30)},
        {"tool": "mcp:vm.read_text", "arguments": {"path": f"{folder}/missing.txt"}, "usage": usage(1400, 20)},
        {"tool": "mcp:cua.screenshot", "arguments": {}, "usage": usage(1500, 10)},
        {"text": "Done: the file holds the greeting.", "usage": usage(1600, 9)},
    ]


def usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens}


def tool_steps(trajectory: Trajectory) -> list[Any]:
    return [s for s in trajectory.steps if s.tool_calls]


def check_pairing(trajectory: Trajectory) -> None:
    """Each tool call step has one call and one result, paired by the CLI's own call id."""
    for step in tool_steps(trajectory):
        assert step.tool_calls is not None and step.observation is not None
        [call] = step.tool_calls
        [result] = step.observation.results
        assert result.source_call_id == call.tool_call_id


def screenshots_of(trajectory: Trajectory) -> list[str]:
    return [
        rel
        for step in trajectory.steps
        for result in (step.observation.results if step.observation else [])
        for rel in (result.extra or {}).get("screenshots", [])
    ]
