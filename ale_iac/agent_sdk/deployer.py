"""The deployer: what to do to run an agent (install, launch, parse its artifacts), written once for
every executor.

A deployer is plain Python that does all its I/O through the executor it is handed
(``self.executor``) and never asks where it runs. The runner calls, once per unit::

    await deployer.install()
    result = await deployer.launch(prompt)
    trajectory = deployer.parse_artifacts(result)
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from abc import ABC, abstractmethod
from pathlib import Path
from types import ModuleType
from typing import ClassVar

from ale_iac.agent_sdk.config import AgentConfig, AgentRunResult, ModelApi, ToolCatalog
from ale_iac.agent_sdk.executor import BaseExecutor
from ale_iac.agent_sdk.trajectory import Trajectory
from ale_iac.errors import ConfigError


class BaseAgentDeployer(ABC):
    """Subclass per agent. Class attributes say where it may run."""

    default_executor: ClassVar[str] = "local"
    supported_executors: ClassVar[frozenset[str]] = frozenset({"local"})
    clis: ClassVar[tuple[str, ...]] = ()
    """Agent CLIs (names in ``ale_iac.agent_sdk.clis.CLIS``) the runner installs on the host before the
    unit and the executor stages where the deployer runs; ``executor.cli(name)`` gives the path."""
    model_api: ClassVar[ModelApi | None] = None
    """The model API the agent speaks; when set, a preset must name a ``model``."""

    @classmethod
    def validate_config(cls, config: AgentConfig, tools: ToolCatalog) -> None:
        """Check a preset before any sandbox exists (there is no executor yet): raise a ``ConfigError``
        naming the field. ``tools`` lists the bridges' tools and their argument schemas. The runner
        calls it for every agent before it provisions anything; the default checks nothing."""
        return None

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
            try:
                spec.loader.exec_module(module)
            except Exception as exc:
                del sys.modules[module_name]
                raise ConfigError(source, "deployer", f"importing {path} failed: {type(exc).__name__}: {exc}") from None
    else:
        try:
            module = importlib.import_module(target)
        except Exception as exc:
            raise ConfigError(source, "deployer", f"cannot import {target}: {type(exc).__name__}: {exc}") from None
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, BaseAgentDeployer)):
        raise ConfigError(source, "deployer", f"{config.deployer} is not a BaseAgentDeployer subclass")
    return cls


def sibling_module(anchor: str, name: str) -> ModuleType:
    """The module ``name.py`` next to the deployer file ``anchor`` (pass ``__file__``), imported once.

    ``agents/`` is not a package and the runner loads a deployer by its path (also inside a sandbox or a
    container), so a deployer split into several files imports its siblings with this rather than with
    ``import``. The module is registered under a name of its folder's path (two copies of an agent
    folder never share a module)."""
    path = Path(anchor).resolve().with_name(f"{name}.py")
    folder = hashlib.sha256(str(path.parent).encode()).hexdigest()[:10]
    module_name = f"ale_agents.siblings_{folder}.{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[module_name]
            raise
    return sys.modules[module_name]
