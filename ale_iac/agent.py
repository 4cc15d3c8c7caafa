"""The agent contract: a deployer says *what* to do to run an agent; an executor decides *where*.

A deployer is plain Python that does all its I/O through the executor it is handed
(``self.executor``) and never asks where it runs. The runner calls, once per unit::

    await deployer.install()
    result = await deployer.launch(prompt)
    trajectory = deployer.parse_artifacts(result)
"""

from __future__ import annotations

import importlib.util
import sys
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from ale_iac.errors import ConfigError

if TYPE_CHECKING:
    from ale_iac.executors import BaseExecutor
    from ale_iac.runner.trajectory import Trajectory

AgentStatus = Literal["completed", "failed", "timeout"]
EXECUTOR_KINDS = ("local", "sandbox", "docker")


class AgentConfig(BaseModel):
    """An agent preset (``agents/<name>/preset.yaml``), possibly overridden by the experiment."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Agent name used in unit ids and records.")
    deployer: str = Field(description="'file.py:Class' relative to the preset folder, or 'module:Class'.")
    executor: str | None = Field(default=None, description="local | sandbox | docker; default: the deployer's.")
    model: str | None = Field(default=None, description="Model identifier, if the agent uses one.")
    secrets: list[str] = Field(
        default_factory=list,
        description="Names of environment variables handed to the agent as secrets (values are redacted "
        "from every record).",
    )
    settings: dict[str, Any] = Field(default_factory=dict, description="Deployer-specific knobs.")
    source_dir: str = Field(default="", description="Folder of the preset (set by the loader).")


class AgentRunResult(BaseModel):
    """What ``launch`` returns. Pure data: it may cross an executor boundary as JSON."""

    model_config = ConfigDict(extra="forbid")

    status: AgentStatus
    exit_code: int | None = None
    error: str | None = None
    duration_s: float = 0.0
    logs: list[str] = Field(default_factory=list, description="Raw log files the agent wrote (work-dir relative).")


class BaseAgentDeployer(ABC):
    """Subclass per agent. Class attributes say where it may run."""

    default_executor: ClassVar[str] = "local"
    supported_executors: ClassVar[frozenset[str]] = frozenset({"local"})

    def __init__(self, executor: BaseExecutor) -> None:
        self.executor = executor
        self.config = executor.config

    @abstractmethod
    async def install(self) -> None:
        """Stage the agent and its configuration (CLI, MCP servers, keys) through the executor."""

    @abstractmethod
    async def launch(self, prompt: str) -> AgentRunResult:
        """Run the agent to completion. Return failures as a result; raise only if it could not start."""

    @abstractmethod
    def parse_artifacts(self, result: AgentRunResult) -> Trajectory:
        """Read the agent's native logs (through the executor) into a uniform trajectory."""


def load_deployer_class(config: AgentConfig) -> type[BaseAgentDeployer]:
    """Import the deployer a preset names: ``path/to/file.py:Class`` (preset-relative) or ``module:Class``."""
    source = f"agent {config.name}"
    if ":" not in config.deployer:
        raise ConfigError(
            source, "deployer", f"{config.deployer!r} must look like 'deployer.py:Class' or 'pkg.mod:Class'"
        )
    target, class_name = config.deployer.rsplit(":", 1)
    if target.endswith(".py"):
        path = (Path(config.source_dir) / target).resolve()
        if not path.exists():
            raise ConfigError(source, "deployer", f"file {path} does not exist")
        module_name = f"ale_agents.{config.name.replace('-', '_')}.{path.stem}"
        if module_name in sys.modules:
            module = sys.modules[module_name]
        else:
            spec = importlib.util.spec_from_file_location(module_name, path)
            if spec is None or spec.loader is None:
                raise ConfigError(source, "deployer", f"cannot import {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise ConfigError(source, "deployer", f"cannot import {target}: {exc}") from None
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, BaseAgentDeployer)):
        raise ConfigError(source, "deployer", f"{config.deployer} is not a BaseAgentDeployer subclass")
    return cls
