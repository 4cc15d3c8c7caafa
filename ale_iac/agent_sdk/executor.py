"""The executor base: the handle a deployer does all its I/O through. Implementations (where the
deployer runs: on this host, in the sandbox, in a container) live in ``ale_iac.executors``."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

from ale_iac.agent_sdk.config import AgentConfig, AgentRunResult, BridgeKind, ModelApi, TaskPaths
from ale_iac.contract import COMMAND_ENV_ENV
from ale_iac.errors import AleIacError
from ale_iac.sandbox.handle import SandboxHandle


class Runnable(Protocol):
    """What ``run_deployer`` needs of a deployer (a :class:`~ale_iac.agent_sdk.deployer.BaseAgentDeployer`)."""

    async def install(self) -> None: ...

    async def launch(self, prompt: str) -> AgentRunResult: ...


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


@dataclass(frozen=True)
class ModelAccess:
    """How the agent reaches its model from where it runs: a base URL of the run's model gateway and
    the unit's gateway token, which the agent sends as its API key. The real key never leaves the
    gateway. Base URLs follow the vendors' SDKs: Anthropic without ``/v1``, OpenAI with it."""

    api: ModelApi
    model: str
    base_url: str
    api_key: str


@dataclass(frozen=True)
class ModelGrant:
    """The unit's grant on the run's model gateway, as the runner hands it to an executor. The
    executor turns it into a :class:`ModelAccess` for where the deployer runs: the host's loopback
    (``tcp_root``) or a Unix socket it relays into a sandbox or a container (``attach_unix``)."""

    api: ModelApi
    model: str
    token: str
    tcp_root: str
    attach_unix: Callable[[Path], None]
    on_revoke: Callable[[Callable[[], None]], None] | None = None
    """Registers a callback for the grant's end (what carries its calls closes with it); None: never told."""

    def access(self, root: str) -> ModelAccess:
        base_url = root.rstrip("/") + ("/v1" if self.api == "openai" else "")
        return ModelAccess(api=self.api, model=self.model, base_url=base_url, api_key=self.token)


@dataclass(frozen=True)
class CliInstall:
    """An agent CLI installed on this host (``ale_iac.agent_sdk.clis``): its root folder, the native
    executable to run and every file a copy elsewhere needs (all relative to ``root``)."""

    name: str
    version: str
    root: Path
    entry: str
    files: tuple[str, ...]


class BaseExecutor(ABC):
    """Carries the work dir, the sandbox, the agent config and its environment; runs the deployer's I/O.

    File paths a deployer puts in its trajectory (screenshots, logs) are relative to the work dir;
    the runner stores the work dir as ``agent/`` next to ``trajectory.json`` and says so in the
    trajectory's ``extra.artifacts_dir``.
    """

    kind: ClassVar[str]
    native_shell: ClassVar[bool] = False
    """True where the deployer runs inside the sandbox: the agent has the machine's own shell and
    files, and takes only the ``cua`` bridge. Elsewhere it reaches the machine through both bridges."""

    def __init__(
        self,
        *,
        config: AgentConfig,
        sandbox: SandboxHandle,
        work_dir: Path,
        env: Mapping[str, str],
        redact: Callable[[str], str] = lambda text: text,
        task: TaskPaths | None = None,
        model: ModelGrant | None = None,
        clis: Mapping[str, CliInstall] | None = None,
    ) -> None:
        self.config = config
        self.model_grant = model
        """The unit's model gateway grant (None when the agent uses no model)."""
        self.clis = dict(clis or {})
        """The agent CLIs the deployer declared (``BaseAgentDeployer.clis``), installed on this host."""
        self.task = task
        """The unit's task id and its folders in the sandbox (None outside a unit)."""
        self.sandbox = sandbox
        self.work_dir = work_dir
        self.env = dict(env)
        self.redact = redact

    @classmethod
    def check_preset(cls, config: AgentConfig, source: str | Path) -> None:
        """Check, before any sandbox exists, that this executor can load ``config``'s deployer where it runs
        it (``source``: the preset file, for the error). Here, on this host, the runner's own load of the
        deployer says so; an executor that ships the deployer elsewhere checks what it ships."""
        del config, source

    async def run_deployer(self, deployer: Runnable, prompt: str, timeout_s: float) -> AgentRunResult:
        """Run ``install`` then ``launch`` within ``timeout_s`` (install included) and return the result.

        This default runs them in this process; executors that run the deployer elsewhere override
        it. Either way the agent's processes are gone when it returns or raises (also on cancel)."""

        async def install_and_launch() -> AgentRunResult:
            await deployer.install()
            return await deployer.launch(prompt)

        try:
            return await asyncio.wait_for(install_and_launch(), timeout_s)
        except TimeoutError:
            return AgentRunResult(status="timeout", error=f"agent exceeded its {timeout_s:.0f} s limit")

    def model_access(self) -> ModelAccess:
        """Where the agent reaches its model from where it runs (the host's loopback, by default)."""
        grant = self._grant()
        return grant.access(grant.tcp_root)

    def _grant(self) -> ModelGrant:
        if self.model_grant is None:
            raise AleIacError(f"agent {self.config.name} has no model: set `model` in its preset")
        return self.model_grant

    def cli(self, name: str) -> str:
        """The path of agent CLI ``name``'s executable where the deployer runs."""
        install = self._cli(name)
        return str(install.root / install.entry)

    def _cli(self, name: str) -> CliInstall:
        if name not in self.clis:
            raise AleIacError(f"agent CLI {name!r} was not staged: list it in the deployer's `clis`")
        return self.clis[name]

    def host_env(self) -> dict[str, str]:
        """This process's environment for a child, without any secret the agent's preset names (the
        model key stays with the gateway; the agent's own ``secrets`` come back only through ``env``)."""
        hidden = set(self.config.secrets)
        if self.config.model and self.config.model.api_key_secret:
            hidden.add(self.config.model.api_key_secret)
        return {k: v for k, v in base_process_env().items() if k not in hidden}

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

    def bridge(self, kind: BridgeKind) -> BridgeLaunch:
        """The command that starts an MCP bridge to this unit's sandbox. The commands the bridge starts in the
        unit see what the runner's own do (``SandboxHandle.command_env``: an egress policy's proxy variables),
        handed to it in ``ALE_IAC_COMMAND_ENV``."""
        launch = self.bridge_launch(kind)
        command_env = self.sandbox.command_env()
        if not command_env:
            return launch
        return dataclasses.replace(launch, env={**launch.env, COMMAND_ENV_ENV: json.dumps(command_env)})

    @abstractmethod
    def bridge_launch(self, kind: BridgeKind) -> BridgeLaunch:
        """How this executor starts an MCP bridge to this unit's sandbox (:meth:`bridge` adds the unit's
        command environment)."""

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
