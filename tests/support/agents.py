"""Deployers that misbehave on purpose, for the lifecycle tests. They follow the real contract."""

from __future__ import annotations

import asyncio
from typing import ClassVar

from ale_iac.agent_sdk import AgentInfo, AgentRunResult, BaseAgentDeployer, Trajectory, TrajectoryBuilder


def output_dir(prompt: str) -> str:
    """The output dir the runner names in the prompt's last paragraph."""
    return prompt.rsplit("Write your results to ", 1)[1].strip().rstrip(".")


class _Base(BaseAgentDeployer):
    default_executor: ClassVar[str] = "local"
    supported_executors: ClassVar[frozenset[str]] = frozenset({"local"})

    async def install(self) -> None:
        self.executor.write_text("install.log", "installed\n")

    def parse_artifacts(self, result: AgentRunResult) -> Trajectory:
        builder = TrajectoryBuilder(self.config.name, AgentInfo(name=self.config.name))
        builder.add("system", f"agent finished: {result.status}")
        return builder.build()


class CrashAgent(_Base):
    """Its process dies: launch reports a failed run."""

    async def launch(self, prompt: str) -> AgentRunResult:
        proc = await self.executor.run(["sh", "-c", "echo about to crash; kill -SEGV $$"], log_name="agent.log")
        return AgentRunResult(status="failed", exit_code=proc.exit_code, error=f"agent crashed (exit {proc.exit_code})")


class SleepyAgent(_Base):
    """Never finishes on its own: the unit timeout must stop it."""

    async def launch(self, prompt: str) -> AgentRunResult:
        await self.executor.run(["sleep", "3599"], log_name="agent.log")
        return AgentRunResult(status="completed")


class SecretAgent(_Base):
    """Uses its secret the careless way: prints it, writes it, and puts it in its trajectory."""

    async def launch(self, prompt: str) -> AgentRunResult:
        secret = self.executor.env["ALE_TEST_API_KEY"]
        await self.executor.run(["sh", "-c", 'echo "key is $ALE_TEST_API_KEY"'], log_name="agent.log")
        self.executor.write_text("notes.txt", f"remember {secret}\n")
        async with self.executor.sandbox.client() as client:
            # Also into the task's output dir in the sandbox, which the runner pulls back.
            await client.write_text(f"{output_dir(prompt)}/answer.txt", f"42 {secret}\n")
        return AgentRunResult(status="completed", error=f"warning: key {secret} was slow")

    def parse_artifacts(self, result: AgentRunResult) -> Trajectory:
        builder = TrajectoryBuilder(self.config.name, AgentInfo(name=self.config.name))
        builder.add("agent", f"I used {self.executor.env['ALE_TEST_API_KEY']}")
        return builder.build()


class WriterAgent(_Base):
    """A well-behaved agent: writes the file the trivial test task asks for, through the sandbox."""

    async def launch(self, prompt: str) -> AgentRunResult:
        async with self.executor.sandbox.client() as client:
            await client.write_text(f"{output_dir(prompt)}/answer.txt", "42\n")
            await asyncio.sleep(float(self.config.settings.get("linger_s", 0)))
        return AgentRunResult(status="completed")
