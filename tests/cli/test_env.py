"""``ale-iac env`` gives plain ``pulumi`` what ale-iac's own calls use; the README's pool block runs as written."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ale_iac.engine import Engine
from ale_iac.substrates.local import runtime as local_runtime
from ale_iac.substrates.local import sandboxes as local_sandboxes

REPO = Path(__file__).resolve().parents[2]
BARE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _bash(script: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    # A shell that has neither the toolchain nor the venv on PATH (a fresh login on a fresh clone).
    env = {**os.environ, "PATH": BARE_PATH}
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def readme_pool_block() -> str:
    text = (REPO / "README.md").read_text()
    after = text[text.index("Plain `pulumi` on this project") :]
    match = re.search(r"```bash\n(.*?)```", after, re.S)
    assert match is not None, "README: no bash block after 'Plain `pulumi` on this project'"
    return match.group(1)


@pytest.mark.engine
def test_env_exports_what_the_engine_passes_and_plain_pulumi_then_finds_the_backend(tmp_path: Path) -> None:
    engine = Engine()
    printed = _bash(f"{REPO}/.venv/bin/ale-iac env", cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr
    exported = dict(re.findall(r"^export (\w+)=(\S+)$", printed.stdout, re.M))
    expected = engine.env_vars()
    for name in ("PULUMI_BACKEND_URL", "PULUMI_CONFIG_PASSPHRASE_FILE", "PULUMI_PYTHON_CMD"):
        assert exported[name] == expected[name], name
    assert exported["PATH"].split(":")[:2] == [str(engine.toolchain.bin_dir), str(REPO / ".venv" / "bin")]

    # Without it, plain pulumi has no backend (it wants a Pulumi Cloud login, or is not even on PATH) ...
    bare = _bash(f"export PATH={engine.toolchain.bin_dir}:$PATH; pulumi stack ls --cwd {REPO}", cwd=tmp_path)
    assert bare.returncode != 0
    # ... with it, it reads ale-iac's backend: a stack ale-iac made is listed.
    engine.up("env-probe", lambda: None)
    try:
        listed = _bash(f'eval "$({REPO}/.venv/bin/ale-iac env)"; pulumi stack ls --cwd {REPO}', cwd=tmp_path)
        assert listed.returncode == 0, listed.stderr
        assert "env-probe" in listed.stdout
    finally:
        engine.destroy("env-probe")


def _fresh_checkout(root: Path) -> Path:
    """The files a checkout has that the README block touches (the venv is linked, not rebuilt), committed to a
    git repository of its own, as a clone's are."""
    project = root / "checkout"
    project.mkdir()
    for name in ("Pulumi.yaml", "__main__.py", ".gitignore"):
        shutil.copy(REPO / name, project / name)
    for folder in ("stacks", "examples", "agents"):
        shutil.copytree(REPO / folder, project / folder, ignore=shutil.ignore_patterns("__pycache__"))
    (project / ".venv").symlink_to(REPO / ".venv")
    _git(project, "init", "-q")
    _git(project, "add", "-A")
    _git(project, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "clone")
    return project


def _git(project: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=project, capture_output=True, text=True, check=True).stdout


def _leave_nothing() -> None:
    """Cleanup when the block failed half-way (a no-op when it ran to its end)."""
    engine = Engine()
    for info in engine.list_stacks():
        engine.recover(info.name)
    for state in local_sandboxes.list_sandboxes():
        local_runtime.stop(state.sandbox_id)


@pytest.mark.sandbox
@pytest.mark.engine
@pytest.mark.timeout(600)
def test_readme_pool_block_runs_as_written_and_leaves_nothing(tmp_path: Path) -> None:
    project = _fresh_checkout(tmp_path)
    block = readme_pool_block()
    assert "pulumi stack rm" in block and "--preserve-config" in block and "pulumi destroy" in block
    try:
        done = _bash(block, cwd=project, timeout=540)
        stacks_left = [info.name for info in Engine().list_stacks()]
        sandboxes_left = [state.sandbox_id for state in local_sandboxes.list_sandboxes()]
    finally:
        _leave_nothing()
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert stacks_left == [] and sandboxes_left == []

    leased = [p.read_text() for p in (project / "runs").glob("*/*/events.jsonl")]
    assert len(leased) == 3 and all('"leased"' in events for events in leased), "the runs did not lease pool units"
    # --preserve-config keeps the profile file, and the block's last line drops the salt `stack init` wrote
    # into it: the checkout is as it was (run records go to the ignored runs/).
    assert _git(project, "status", "--porcelain", "--untracked-files=all") == ""
