"""What `ale-iac evaluate` shows while it runs: one live rich display on a terminal, plain lines otherwise."""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from rich.console import Console

from ale_iac.runner.experiment import UnitPlan, load_experiment
from ale_iac.runner.lifecycle import UnitOutcome
from ale_iac.runner.progress import Progress
from ale_iac.runner.status import UnitStatus
from tests.support.tasks import make_preset, make_task

REPO = Path(__file__).resolve().parents[2]
ESC = "\x1b"
# Set by a CI system or a user, these make rich treat any output as a terminal (or never one).
RICH_ENV = ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS", "LINES")


def _experiment(root: Path, repeats: int) -> Path:
    make_task(root, "answer")
    make_preset(root, "writer", "WriterAgent")
    path = root / "exp.yaml"
    spec = {"name": "p", "agents": ["writer.yaml"], "tasks": ["answer"], "repeats": repeats, "profile": "local"}
    path.write_text(json.dumps(spec))
    return path


def _plans(root: Path, repeats: int) -> list[UnitPlan]:
    return load_experiment(_experiment(root, repeats)).units


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _outcome(plan: UnitPlan, status: UnitStatus, score: float | None, duration: float) -> UnitOutcome:
    return UnitOutcome(
        unit_id=plan.unit_id,
        agent=plan.agent.name,
        task=plan.task.id,
        repeat=plan.repeat,
        status=status,
        score=score,
        error=None,
        stack=None,
        cleanup="destroyed",
        duration_s=duration,
        agent_s=1.0,
    )


def test_totals_count_units_and_estimate_the_time_left(tmp_path: Path) -> None:
    plans = _plans(tmp_path, 4)
    clock = Clock()
    progress = Progress(plans, Console(file=io.StringIO()), concurrency=2, now=clock)
    first = progress.totals()
    assert (first.done, first.running, first.queued, first.left_s, first.mean_score) == (0, 0, 4, None, None)

    progress.phase(plans[0].unit_id, "provision")
    progress.phase(plans[1].unit_id, "provision")
    clock.t += 10
    progress.phase(plans[0].unit_id, "done")
    progress.finish(_outcome(plans[0], UnitStatus.SUCCEEDED, 1.0, 10.0))
    progress.phase(plans[2].unit_id, "provision")
    totals = progress.totals()
    assert (totals.done, totals.running, totals.failed, totals.queued) == (1, 2, 0, 1)
    # Mean 10 s: unit 1 ran 10 s (0 left), unit 2 just started (10), one queued (10); two at a time.
    assert totals.left_s == pytest.approx(10.0) and totals.mean_score == 1.0 and totals.elapsed_s == 10

    clock.t += 2
    progress.finish(_outcome(plans[1], UnitStatus.AGENT_FAILED, 0.0, 12.0))
    totals = progress.totals()
    assert (totals.done, totals.running, totals.failed, totals.queued) == (2, 1, 1, 1)
    # Mean 11 s: unit 2 has run 2 s (9 left), one queued (11); two can run at once.
    assert totals.left_s == pytest.approx(10.0) and totals.mean_score == 0.5


def test_a_terminal_gets_one_live_display_and_no_lines(tmp_path: Path) -> None:
    plans = _plans(tmp_path, 3)
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=140, height=30)
    progress = Progress(plans, console, concurrency=2, title="ale-iac evaluate run-x")
    with progress.display():
        assert progress.live is not None
        progress.phase(plans[0].unit_id, "provision")
        progress.phase(plans[0].unit_id, "agent")
        progress.phase(plans[0].unit_id, "done")
        progress.finish(_outcome(plans[0], UnitStatus.SUCCEEDED, 1.0, 3.0))
        progress.phase(plans[1].unit_id, "setup")
    text = out.getvalue()
    assert ESC + "[" in text  # the live display redraws in place
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    assert "ale-iac evaluate run-x" in plain
    assert "1/3 done" in plain and "1 running" in plain and "1 queued" in plain and "mean score 1.00" in plain
    assert plans[1].unit_id in plain and "setup" in plain
    assert f"[{plans[0].unit_id}] provision" not in plain  # no line-per-event output under the display


def test_a_file_gets_plain_lines_only(tmp_path: Path) -> None:
    plans = _plans(tmp_path, 2)
    out = io.StringIO()
    progress = Progress(plans, Console(file=out, width=200), concurrency=1)
    with progress.display():
        assert progress.live is None
        progress.phase(plans[0].unit_id, "provision")
        progress.phase(plans[0].unit_id, "done")
        progress.finish(_outcome(plans[0], UnitStatus.AGENT_TIMEOUT, 0.0, 4.0))
    text = out.getvalue()
    assert ESC not in text
    assert text.splitlines() == [
        f"[{plans[0].unit_id}] provision",
        f"[{plans[0].unit_id}] done",
        f"[{plans[0].unit_id}] agent_timeout score=0.00 cleanup=destroyed",
        "progress: 1/2 done (1 failed), 0 running, 1 queued; mean score 0.00; elapsed 0:00:00; left ~0:00:04",
    ]


def test_the_table_fits_the_terminal_with_running_units_first(tmp_path: Path) -> None:
    plans = _plans(tmp_path, 40)
    console = Console(file=io.StringIO(), force_terminal=True, width=120, height=20)
    progress = Progress(plans, console, concurrency=4)
    for plan in plans[:5]:
        progress.phase(plan.unit_id, "provision")
        progress.phase(plan.unit_id, "done")
        progress.finish(_outcome(plan, UnitStatus.SUCCEEDED, 1.0, 2.0))
    progress.phase(plans[30].unit_id, "agent")
    with console.capture() as captured:
        console.print(progress.render())
    lines = captured.get().splitlines()
    assert len(lines) <= 20
    rows = [line for line in lines if "__r" in line]
    assert plans[30].unit_id in rows[0]  # the running unit leads
    assert any("more" in line for line in lines)


_CHILD = """
import sys, time
from pathlib import Path
from rich.console import Console
from ale_iac.runner.experiment import load_experiment
from ale_iac.runner.progress import Progress

plans = load_experiment(Path(sys.argv[1])).units
progress = Progress(plans, Console(), concurrency=2, title="pty-check")
with progress.display():
    for plan in plans:
        progress.phase(plan.unit_id, "provision")
        time.sleep(0.6)
        progress.phase(plan.unit_id, "agent")
    time.sleep(0.6)
print("child done")
"""


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in RICH_ENV}
    env.update(TERM="xterm-256color", PYTHONPATH=str(REPO))
    return env


def _run_in_pty(argv: list[str], timeout: float) -> tuple[int, str]:
    """Run ``argv`` with a pseudo-terminal (40x120) as stdin, stdout and stderr; its exit code and output."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=_child_env(), cwd=REPO)
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed its side
                break
            if not data:
                break
            chunks.append(data)
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return code, b"".join(chunks).decode(errors="replace")


def _run_to_file(argv: list[str], out: Path, timeout: float) -> tuple[int, str]:
    with out.open("w") as handle:
        proc = subprocess.run(
            argv, check=False, stdout=handle, stderr=subprocess.STDOUT, env=_child_env(), cwd=REPO, timeout=timeout
        )
    return proc.returncode, out.read_text()


def test_a_real_pseudo_terminal_gets_the_live_display_and_a_file_gets_lines(tmp_path: Path) -> None:
    exp = _experiment(tmp_path, 2)
    code, tty_text = _run_in_pty([sys.executable, "-c", _CHILD, str(exp)], timeout=60)
    assert code == 0, tty_text
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", tty_text)
    assert ESC + "[" in tty_text and "pty-check" in plain and "0/2 done" in plain and "2 running" in plain
    units = [p.unit_id for p in load_experiment(exp).units]
    assert f"[{units[0]}] provision" not in plain  # no plain "[unit] phase" lines under the display

    code, file_text = _run_to_file([sys.executable, "-c", _CHILD, str(exp)], tmp_path / "out.txt", timeout=60)
    assert code == 0, file_text
    assert ESC not in file_text
    assert file_text.splitlines() == [
        f"[{units[0]}] provision",
        f"[{units[0]}] agent",
        f"[{units[1]}] provision",
        f"[{units[1]}] agent",
        "child done",
    ]


@pytest.mark.sandbox
@pytest.mark.engine
def test_evaluate_shows_the_live_display_on_a_terminal_and_lines_in_a_file(tmp_path: Path) -> None:
    exp = _experiment(tmp_path, 1)
    [unit] = [p.unit_id for p in load_experiment(exp).units]
    argv = [sys.executable, "-m", "ale_iac", "evaluate", str(exp)]

    code, tty_text = _run_in_pty(argv, timeout=300)
    assert code == 0, tty_text
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", tty_text)
    assert ESC + "[" in tty_text and "ale-iac evaluate p-" in plain and "1/1 done" in plain
    assert f"[{unit}] provision" not in plain
    assert "results:" in plain and "succeeded" in plain  # the final table follows the display

    code, file_text = _run_to_file(argv, tmp_path / "evaluate.log", timeout=300)
    assert code == 0, file_text
    assert ESC not in file_text
    lines = file_text.splitlines()
    phases = [line for line in lines if line.startswith(f"[{unit}] ")]
    expected = ("load", "provision", "ready", "setup", "agent", "evaluate", "done")
    assert phases[:7] == [f"[{unit}] {p}" for p in expected]
    assert f"[{unit}] succeeded score=1.00 cleanup=destroyed" in lines
    assert any(
        re.fullmatch(r"progress: 1/1 done \(0 failed\), 0 running, 0 queued; mean score 1\.00; .*", x) for x in lines
    )
