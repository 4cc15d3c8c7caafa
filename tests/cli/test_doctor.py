"""`ale-iac doctor`'s tables: each substrate fact once, and the agent CLIs (no engine needed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ale_iac.agent_sdk.clis import CLIS, MIN_NATIVE_BYTES, clis_dir, pinned_version
from ale_iac.cli.doctor import agent_cli_rows, substrate_rows
from tests.support.cli import ale_iac


def test_each_substrate_fact_is_one_row() -> None:
    names = [name for name, _, _ in substrate_rows([])]
    assert len(names) == len(set(names))
    assert [n for n in names if "docker" in n and "engine" in n] == ["docker: engine"]


def _native_install(name: str) -> Path:
    """The files of CLI ``name`` at its pinned version where ale-iac installs them: an executable the size of
    the real one (sparse), starting like an ELF file."""
    version = pinned_version(name)
    entry, files = CLIS[name].layout("x64")
    root = clis_dir() / f"{name}-{version}"
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        with (root / rel).open("wb") as handle:
            handle.write(b"\x7fELF")
            handle.truncate(MIN_NATIVE_BYTES + 1)
        (root / rel).chmod(0o755)
    return root / entry


def test_agent_clis_say_where_they_are_or_how_they_get_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ALE_IAC_CACHE", str(tmp_path))
    rows = {name: (ok, detail) for name, ok, detail in agent_cli_rows()}
    assert set(rows) == {"claude-code", "codex"}
    for name, (ok, detail) in rows.items():
        pinned = f"{CLIS[name].package}@{pinned_version(name)}"
        assert not ok and detail.startswith(f"{pinned}: ")
        assert "the first time an agent needs it" in detail or "npm is not on PATH" in detail
    if os.uname().machine in ("x86_64", "amd64"):
        entry = _native_install("codex")
        ok, detail = {name: (ok, detail) for name, ok, detail in agent_cli_rows()}["codex"]
        assert ok and detail == f"{CLIS['codex'].package}@{pinned_version('codex')}: {entry}"


def test_doctor_prints_the_docker_engine_once_and_the_agent_clis(tmp_path: Path) -> None:
    env = {**os.environ, "ALE_IAC_PULUMI": str(tmp_path / "none"), "ALE_IAC_CACHE": str(tmp_path)}
    result = ale_iac("doctor", env={**env, "COLUMNS": "200"}, timeout=120)
    checks = [line.split("│")[1].strip() for line in result.stdout.splitlines() if line.startswith("│")]
    assert [check for check in checks if "docker" in check and "engine" in check] == ["docker: engine"]
    clis = result.stdout[result.stdout.index("Agent CLIs") :]
    assert "claude-code" in clis and "codex" in clis and pinned_version("codex") in clis
