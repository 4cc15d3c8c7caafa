"""Running the real ``ale-iac`` command line from a test (this interpreter, the repository as cwd)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def ale_iac(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m ale_iac ARGS``; its output captured as text, its exit status left to the test."""
    return subprocess.run(
        [sys.executable, "-m", "ale_iac", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )
