"""Executors: where a deployer runs. The deployer only ever talks to the executor it is handed.

* ``local``: in the runner's own process on this host (complete here).
* ``sandbox`` and ``docker``: inside the sandbox / in a local container. Their seam is
  :class:`BaseExecutor`; :func:`make_executor` refuses them with a clear message until they land.
"""

from __future__ import annotations

import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

from ale_iac.agent import EXECUTOR_KINDS, AgentConfig
from ale_iac.errors import AleIacError, ConfigError
from ale_iac.sandbox.handle import SandboxHandle

BridgeKind = Literal["vm", "cua"]


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
    ) -> None:
        self.config = config
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


def make_executor(
    kind: str,
    *,
    config: AgentConfig,
    sandbox: SandboxHandle,
    work_dir: Path,
    env: Mapping[str, str],
    redact: Callable[[str], str],
) -> BaseExecutor:
    if kind not in EXECUTOR_KINDS:
        raise ConfigError(
            f"agent {config.name}", "executor", f"unknown executor {kind!r} (one of {', '.join(EXECUTOR_KINDS)})"
        )
    if kind == "local":
        from ale_iac.executors.local import LocalExecutor

        return LocalExecutor(config=config, sandbox=sandbox, work_dir=work_dir, env=env, redact=redact)
    raise AleIacError(
        f"executor {kind!r} is not available in this version of ale-iac (only 'local' is); "
        f"set executor: local for agent {config.name}"
    )


def ale_iac_command() -> list[str]:
    """How to invoke ale-iac with this very interpreter (works inside any venv)."""
    return [sys.executable, "-m", "ale_iac"]


def base_process_env() -> dict[str, str]:
    """A child environment without variables that would change a tool's behaviour under us."""
    env = dict(os.environ)
    env.pop("CONTAINER_NAME", None)  # switches the Cua computer-server into cloud-auth mode
    return env
