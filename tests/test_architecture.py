"""The public SDKs are the only part of ale-iac that agents and tasks import (docs/architecture.md).
The layer rules themselves are import-linter contracts, run by the test command."""

from __future__ import annotations

from pathlib import Path

import pytest

from ale_iac.agent_sdk import BaseExecutor, available_executors
from ale_iac.agent_sdk.executor_registry import executor_class
from ale_iac.errors import ConfigError
from tests.support.source_scan import scan

REPO = Path(__file__).resolve().parents[1]


def ale_iac_imports(paths: list[Path]) -> dict[Path, set[str]]:
    """Every ``ale_iac`` module each file imports, at any depth of the file (lazy imports included)."""
    return {
        path: {name for name in source.imports if name.split(".")[0] == "ale_iac"}
        for path, source in scan(paths).items()
    }


def test_deployers_import_only_the_agent_sdk() -> None:
    deployers = sorted((REPO / "agents").rglob("*.py"))
    assert deployers
    for path, imported in ale_iac_imports(deployers).items():
        assert imported <= {"ale_iac.agent_sdk", "ale_iac.errors"}, path


def test_tasks_import_only_the_task_sdk() -> None:
    hooks = sorted((REPO / "examples").rglob("main.py"))
    assert hooks
    for path, imported in ale_iac_imports(hooks).items():
        assert imported <= {"ale_iac.task"}, path


def test_the_executor_registry_lists_only_what_exists() -> None:
    for kind in available_executors():
        cls = executor_class(kind)
        assert issubclass(cls, BaseExecutor) and cls.kind == kind
    assert set(available_executors()) == {"local", "sandbox", "docker"}
    with pytest.raises(ConfigError, match=r"unknown executor 'ssh' \(available: local, sandbox, docker\)"):
        executor_class("ssh", "some-agent")
