"""The ``local`` executor: the deployer runs in the runner's process, on this host."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from ale_iac import procs
from ale_iac.agent_sdk.config import AgentRunResult, BridgeKind
from ale_iac.agent_sdk.executor import BridgeLaunch, ProcessResult, Runnable, ale_iac_command
from ale_iac.contract import ENDPOINT_TOKEN_ENV as TOKEN_ENV
from ale_iac.contract import ENDPOINT_TOKEN_FILE_ENV as TOKEN_FILE_ENV
from ale_iac.executors.workdir import HostWorkDir
from ale_iac.files import PrivateDir


class LocalExecutor(HostWorkDir):
    kind: ClassVar[str] = "local"

    async def run(
        self,
        argv: Sequence[str],
        *,
        log_name: str,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> ProcessResult:
        log_path = self._path(log_name)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        with log_path.open("wb") as log:
            runner_pid = os.getpid()
            creating = asyncio.ensure_future(
                asyncio.create_subprocess_exec(
                    *procs.die_with_parent_argv(argv, runner_pid),  # no leaked agents
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=asyncio.subprocess.STDOUT,
                    cwd=self.work_dir,
                    env={**self.host_env(), **self.env, **(env or {})},
                    process_group=0,  # so a timeout or cancel can kill its whole process group
                )
            )
            try:
                proc = await asyncio.shield(creating)
            except asyncio.CancelledError:
                # Cancelled while the process was being started: it may exist already; kill it.
                with contextlib.suppress(Exception):
                    started = await creating
                    _kill_group(started.pid)
                    await started.wait()
                raise
            timed_out = False
            try:
                await asyncio.wait_for(proc.wait(), timeout=timeout_s)
            except TimeoutError:
                timed_out = True
                _kill_group(proc.pid)
                await proc.wait()
            except BaseException:
                _kill_group(proc.pid)
                await asyncio.shield(proc.wait())
                raise
        self._redact_file(log_path)
        return ProcessResult(
            exit_code=proc.returncode if proc.returncode is not None else -1,
            timed_out=timed_out,
            duration_s=time.monotonic() - start,
            log_path=str(log_path),
        )

    def _redact_file(self, path: Path) -> None:
        text = path.read_text(errors="replace")
        clean = self.redact(text)
        if clean != text:
            path.write_text(clean)

    def bridge_launch(self, kind: BridgeKind) -> BridgeLaunch:
        cmd = ale_iac_command()
        env = self.host_env()  # no secret: a bridge needs none but the endpoint's token
        env.pop(TOKEN_ENV, None)
        token = self.sandbox.token()
        if token:
            # A file, not the value: deployers write this env into MCP configs, which are records.
            env[TOKEN_FILE_ENV] = str(self.private.write("endpoint-token", token))
        return BridgeLaunch(command=cmd[0], args=[*cmd[1:], "mcp", kind, "--endpoint", self.sandbox.endpoint], env=env)

    @functools.cached_property
    def private(self) -> PrivateDir:
        return PrivateDir()

    async def run_deployer(self, deployer: Runnable, prompt: str, timeout_s: float) -> AgentRunResult:
        try:
            return await super().run_deployer(deployer, prompt, timeout_s)
        finally:
            self.private.remove()


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
