"""Fixtures for the report's tests: a real headless Chromium, and a real run made once per session.

* ``browser`` (session): Debian's headless Chromium (``tests/support/browser.py``), every request of the
  page logged (``requests_made``), http(s) and websockets blocked besides.
* ``real_run`` (session; its tests carry ``sandbox`` and ``engine``): ``ale-iac evaluate`` run as a
  user runs it, on two demo tasks with the scripted reference agent and an agent that crashes: a
  record with screenshots, a trajectory, and a failed unit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.chrome.webdriver import WebDriver

from tests.support.browser import start_chromium
from tests.support.tasks import make_preset

REPO = Path(__file__).resolve().parents[2]
REAL_TASKS = ["gui-notepad", "cli-log-stats"]


@pytest.fixture(scope="session")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    try:
        driver = start_chromium(tmp_path_factory.mktemp("chromium-profile"))
    except RuntimeError as exc:
        pytest.fail(str(exc))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="session")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder made by ``ale-iac evaluate`` (scripted + crash agents, on gui-notepad and cli-log-stats)."""
    root = tmp_path_factory.mktemp("real-run")
    make_preset(root, "crash", "CrashAgent")
    experiment = root / "exp.yaml"
    spec = {
        "name": "report-e2e",
        "agents": [str(REPO / "agents" / "scripted" / "preset.yaml"), "crash.yaml"],
        "tasks": [str(REPO / "examples" / "tasks" / t) for t in REAL_TASKS],
        "profile": "local",
        "concurrency": 2,
        "output_root": str(root / "runs"),
    }
    experiment.write_text(json.dumps(spec))
    # A session fixture runs before the per-test home of tests/conftest.py: give the run its own.
    env = {**os.environ, "ALE_IAC_HOME": str(root / "home"), "PYTHONPATH": str(REPO)}
    env.pop("PULUMI_BACKEND_URL", None)
    env.pop("PULUMI_CONFIG_PASSPHRASE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "ale_iac", "evaluate", str(experiment)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    # Exit 1: the crashing agent's units fail, as they should.
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [run_dir] = (root / "runs").iterdir()
    return run_dir
