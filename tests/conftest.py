"""Shared test setup.

* Every test gets its own ale-iac home (state backend, logs, sandboxes), so tests never see the
  user's stacks or each other's.
* The repo root is put on PYTHONPATH for child processes: dynamic providers defined in test modules
  are pickled by reference, and the provider process Pulumi starts must be able to import them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytest_plugins = ["tests.sandbox_fixtures"]


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("ale-home")
    monkeypatch.setenv("ALE_IAC_HOME", str(home))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.delenv("PULUMI_BACKEND_URL", raising=False)
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE", raising=False)
    yield home
