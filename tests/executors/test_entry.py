"""The agent's entry (``ale_iac/executors/entry.py``): its deployer is launched once the warm bridges have imported."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ale_iac.agent_sdk.config import AgentRunResult
from ale_iac.bridges.warm import ENTRY_BRIDGES, WarmBridges
from ale_iac.executors.entry import _BridgesFirst
from tests.support.bridges import gated_python


class Recorder:
    def __init__(self, warm: WarmBridges, gate: Path) -> None:
        self.warm = warm
        self.gate = gate
        self.seen: list[tuple[str, bool]] = []

    async def install(self) -> None:
        self.seen.append(("install", self.warm.wait_ready(0)))
        self.gate.touch()  # the imports may go on now

    async def launch(self, prompt: str) -> AgentRunResult:
        self.seen.append(("launch", self.warm.wait_ready(0)))
        return AgentRunResult(status="completed")


def test_the_cli_is_launched_after_the_bridges_imported_and_install_ran_beside_them(tmp_path: Path) -> None:
    warm = WarmBridges(ENTRY_BRIDGES, python=gated_python(tmp_path / "gate"))
    warm.start(wait=False)
    try:
        recorder = Recorder(warm, tmp_path / "gate")
        runnable = _BridgesFirst(recorder, warm)

        async def both() -> AgentRunResult:
            await runnable.install()
            return await runnable.launch("the prompt")

        assert asyncio.run(both()).status == "completed"
        assert recorder.seen == [("install", False), ("launch", True)]
    finally:
        warm.close()


def test_a_warm_process_that_died_does_not_hold_the_launch() -> None:
    warm = WarmBridges(ENTRY_BRIDGES, python=["/bin/sh", "-c", "exit 3"])
    warm.start(wait=False)

    class Plain:
        async def install(self) -> None:
            return None

        async def launch(self, prompt: str) -> AgentRunResult:
            return AgentRunResult(status="completed", error=prompt)

    runnable = _BridgesFirst(Plain(), warm)

    async def both() -> AgentRunResult:
        await runnable.install()
        return await runnable.launch("launched")

    assert asyncio.run(both()).error == "launched"
    assert not warm.socket_path.parent.exists()
