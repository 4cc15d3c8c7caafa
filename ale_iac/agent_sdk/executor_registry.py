"""The executors that exist, by kind: the one list ``make_executor`` and presets are checked against.

Implementations are named, not imported, so that the SDK imports none of them until one is made.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from pathlib import Path

from ale_iac.agent_sdk.config import AgentConfig, TaskPaths
from ale_iac.agent_sdk.executor import BaseExecutor, CliInstall, ModelGrant
from ale_iac.errors import ConfigError
from ale_iac.sandbox.handle import SandboxHandle

EXECUTORS: Mapping[str, str] = {
    "local": "ale_iac.executors.local:LocalExecutor",
    "sandbox": "ale_iac.executors.sandbox:SandboxExecutor",
    "docker": "ale_iac.executors.docker:DockerExecutor",
}
"""kind -> ``module:Class`` of its implementation."""


def available_executors() -> tuple[str, ...]:
    return tuple(EXECUTORS)


def executor_class(kind: str, agent: str = "?") -> type[BaseExecutor]:
    if kind not in EXECUTORS:
        raise ConfigError(
            f"agent {agent}", "executor", f"unknown executor {kind!r} (available: {', '.join(EXECUTORS)})"
        )
    module_name, class_name = EXECUTORS[kind].split(":")
    cls: type[BaseExecutor] = getattr(importlib.import_module(module_name), class_name)
    return cls


def make_executor(
    kind: str,
    *,
    config: AgentConfig,
    sandbox: SandboxHandle,
    work_dir: Path,
    env: Mapping[str, str],
    redact: Callable[[str], str],
    task: TaskPaths | None = None,
    model: ModelGrant | None = None,
    clis: Mapping[str, CliInstall] | None = None,
) -> BaseExecutor:
    cls = executor_class(kind, config.name)
    return cls(
        config=config, sandbox=sandbox, work_dir=work_dir, env=env, redact=redact, task=task, model=model, clis=clis
    )
