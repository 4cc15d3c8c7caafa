"""A probe deployer for the executor tests: it runs wherever its executor puts it and reports what it
sees there (which machine, the bridges, the model gateway). It follows the real deployer contract and
uses only the agent SDK, so it runs from the runtime bundle inside a sandbox or a container too.

``settings.mode``: ``probe`` (default), ``hang`` (install starts a child that never ends), ``crash`` (install raises).
"""

from __future__ import annotations

import json
import os
import socket
import urllib.error
import urllib.request
from typing import ClassVar

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from ale_iac.agent_sdk import AgentInfo, AgentRunResult, BaseAgentDeployer, Trajectory, TrajectoryBuilder


class ProbeDeployer(BaseAgentDeployer):
    default_executor: ClassVar[str] = "sandbox"
    supported_executors: ClassVar[frozenset[str]] = frozenset({"local", "sandbox", "docker"})

    async def install(self) -> None:
        mode = self.config.settings.get("mode", "probe")
        if mode == "crash":
            raise RuntimeError("probe asked to crash in install")
        self.executor.write_text(
            "install.log", f"kind={self.executor.kind} native_shell={self.executor.native_shell}\n"
        )
        if mode == "hang":
            # In install, the deployer's first step: in launch the child would start only after the entry's
            # wait for its warm bridges, which a short limit can cut (then there is nothing to kill).
            await self.executor.run(["sh", "-c", "echo started; exec sleep 3600"], log_name="hang.log")

    async def launch(self, prompt: str) -> AgentRunResult:
        report: dict[str, object] = {"kind": self.executor.kind, "native_shell": self.executor.native_shell}
        shell = await self.executor.run(
            ["sh", "-c", 'printf "%s" "$PROMPT" > prompt-seen.txt; hostname; id -u; env | sort > env.txt'],
            log_name="shell.log",
            env={"PROMPT": prompt},
        )
        report["shell_exit"] = shell.exit_code
        report["hostname"] = socket.gethostname()
        report["cua_tools"], report["screenshot"] = await self._cua()
        report["model"] = self._model()
        self.executor.write_text("report.json", json.dumps(report, indent=2))
        return AgentRunResult(status="completed", logs=["report.json", "shell.log"])

    async def _cua(self) -> tuple[list[str], str]:
        launch = self.executor.bridge("cua")
        params = StdioServerParameters(command=launch.command, args=list(launch.args), env=dict(launch.env))
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            tools = sorted(t.name for t in (await session.list_tools()).tools)
            shot = await session.call_tool("screenshot", {})
            kinds = ",".join(block.type for block in shot.content)
        return tools, kinds

    def _model(self) -> dict[str, object]:
        try:
            access = self.executor.model_access()
        except Exception as exc:
            return {"error": str(exc)}
        body = json.dumps(
            {"model": access.model, "max_tokens": 16, "stream": False, "messages": [{"role": "user", "content": "hi"}]}
        ).encode()

        def call(key: str) -> dict[str, object]:
            request = urllib.request.Request(
                access.base_url + "/v1/messages",
                data=body,
                headers={"content-type": "application/json", "x-api-key": key, "anthropic-version": "2023-06-01"},
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    return {"status": response.status, "body": json.loads(response.read())}
            except urllib.error.HTTPError as exc:
                return {"status": exc.code}

        return {"base_url": access.base_url, "right": call(access.api_key), "wrong": call("not-the-token-0123456789")}

    def parse_artifacts(self, result: AgentRunResult) -> Trajectory:
        builder = TrajectoryBuilder(session_id="probe", agent=AgentInfo(name=self.config.name))
        report = self.executor.read_text("report.json") if self.executor.exists("report.json") else "{}"
        builder.add("agent", report)
        return builder.build(notes=f"{result.status}: {result.error or ''} pid={os.getpid()}")
