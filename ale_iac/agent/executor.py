"""The executor base: the handle a deployer does all its I/O through. Implementations (where the
deployer runs: on this host, in the sandbox, in a container) live in ``ale_iac.executors``."""

from __future__ import annotations

import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ale_iac.agent.config import AgentConfig, BridgeKind, TaskPaths
from ale_iac.sandbox.handle import SandboxHandle


@dataclass(frozen=True)
class ProcessResult:
    exit_code: int
    timed_out: bool
    duration_s: float
    log_path: str


@dataclass(frozen=True)
class BridgeLaunch:
    """How to start an MCP bridge process from where the deployer runs (stdio transport)."""

    command: str
    args: list[str]
    env: dict[str, str]


class BaseExecutor(ABC):
    """Carries the work dir, the sandbox, the agent config and its environment; runs the deployer's I/O.

    File paths a deployer puts in its trajectory (screenshots, logs) are relative to the work dir;
    the runner stores the work dir as ``agent/`` next to ``trajectory.json`` and says so in the
    trajectory's ``extra.artifacts_dir``.
    """

    kind: ClassVar[str]

    def __init__(
        self,
        *,
        config: AgentConfig,
        sandbox: SandboxHandle,
        work_dir: Path,
        env: Mapping[str, str],
        redact: Callable[[str], str] = lambda text: text,
        task: TaskPaths | None = None,
    ) -> None:
        self.config = config
        self.task = task
        """The unit's task id and its folders in the sandbox (None outside a unit)."""
        self.sandbox = sandbox
        self.work_dir = work_dir
        self.env = dict(env)
        self.redact = redact

    @abstractmethod
    async def run(
        self,
        argv: Sequence[str],
        *,
        log_name: str,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> ProcessResult:
        """Run a process where the agent runs; its output goes to ``log_name`` in the work dir."""

    @abstractmethod
    def bridge(self, kind: BridgeKind) -> BridgeLaunch:
        """The command that starts an MCP bridge to this unit's sandbox."""

    @abstractmethod
    def write_text(self, relpath: str, text: str) -> str:
        """Write a file into the work dir (secrets redacted); returns its native path."""

    @abstractmethod
    def write_bytes(self, relpath: str, data: bytes) -> str:
        """Write a binary file (a screenshot) into the work dir; returns its native path."""

    @abstractmethod
    def read_text(self, relpath: str) -> str:
        """Read a file from the work dir."""

    @abstractmethod
    def exists(self, relpath: str) -> bool: ...


def ale_iac_command() -> list[str]:
    """How to invoke ale-iac with this very interpreter (works inside any venv)."""
    return [sys.executable, "-m", "ale_iac"]


def base_process_env() -> dict[str, str]:
    """A child environment without variables that would change a tool's behaviour under us."""
    env = dict(os.environ)
    env.pop("CONTAINER_NAME", None)  # switches the Cua computer-server into cloud-auth mode
    return env
