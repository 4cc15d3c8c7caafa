"""The public SDKs are the only part of ale-iac that agents and tasks import (docs/architecture.md).
The layer rules themselves are import-linter contracts, run by the test command."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ale_iac.agent_sdk import BaseExecutor, available_executors
from ale_iac.agent_sdk.executor_registry import executor_class
from ale_iac.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def ale_iac_imports(path: Path) -> set[str]:
    """Every ``ale_iac`` module a file imports, at any depth of the file (lazy imports included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "ale_iac")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "ale_iac":
            found.add(node.module)
    return found


def test_deployers_import_only_the_agent_sdk() -> None:
    deployers = sorted((REPO / "agents").rglob("*.py"))
    assert deployers
    for path in deployers:
        assert ale_iac_imports(path) <= {"ale_iac.agent_sdk", "ale_iac.errors"}, path


def test_tasks_import_only_the_task_sdk() -> None:
    hooks = sorted((REPO / "examples").rglob("main.py"))
    assert hooks
    for path in hooks:
        assert ale_iac_imports(path) <= {"ale_iac.task"}, path


def test_the_executor_registry_lists_only_what_exists() -> None:
    for kind in available_executors():
        cls = executor_class(kind)
        assert issubclass(cls, BaseExecutor) and cls.kind == kind
    assert set(available_executors()) == {"local", "sandbox", "docker"}
    with pytest.raises(ConfigError, match=r"unknown executor 'ssh' \(available: local, sandbox, docker\)"):
        executor_class("ssh", "some-agent")
