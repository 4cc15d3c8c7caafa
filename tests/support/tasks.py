"""Trivial task folders and agent presets for the runner's end-to-end tests (``tests/runner/``).

The task asks for 6*7 and grades ``output/answer.txt`` against ``reference/answer.txt``; the presets
name the misbehaving deployers of ``tests/support/agents.py``.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

TASK_MAIN = """
async def setup(sandbox):
    if (await sandbox.read_text(sandbox.input_dir + "/question.txt")).strip() != "6*7":
        raise RuntimeError("input was not staged")
    if FAIL_SETUP:
        raise RuntimeError("setup fails on purpose")


async def evaluate(sandbox):
    want = (await sandbox.read_text(sandbox.reference_dir + "/answer.txt")).split()[0]
    result = await sandbox.run(f"cat {sandbox.output_dir}/answer.txt")
    return 1.0 if result.exit_code == 0 and result.stdout.split()[:1] == [want] else 0.0
"""


def make_task(root: Path, task_id: str, fail_setup: bool = False) -> None:
    """``root/task_id/``: the 6*7 task (its setup fails on purpose with ``fail_setup``)."""
    folder = root / task_id
    (folder / "input").mkdir(parents=True)
    (folder / "reference").mkdir()
    (folder / "task.yaml").write_text(f"id: {task_id}\ninstruction: Answer the question in question.txt.\n")
    (folder / "main.py").write_text(f"FAIL_SETUP = {fail_setup}\n" + TASK_MAIN)
    (folder / "input" / "question.txt").write_text("6*7\n")
    (folder / "reference" / "answer.txt").write_text("42\n")


CLEAN_SLATE_MAIN = """
async def setup(sandbox):
    left = await sandbox.run("cat /root/left-by-a-unit /tmp/left-by-a-unit 2>/dev/null; true")
    if left.stdout.strip():
        raise RuntimeError("an earlier unit's files are here: " + left.stdout.strip())
    await sandbox.run("echo left > /root/left-by-a-unit && echo left > /tmp/left-by-a-unit")


async def evaluate(sandbox):
    result = await sandbox.run(f"cat {sandbox.output_dir}/answer.txt")
    return 1.0 if result.stdout.split()[:1] == ["42"] else 0.0
"""


def make_clean_slate_task(root: Path, task_id: str) -> None:
    """``root/task_id/``: the 6*7 task, whose setup fails on any file an earlier unit's setup left in the home or
    /tmp of its sandbox, and leaves its own (for runs whose units share sandboxes, reset between them)."""
    make_task(root, task_id)
    (root / task_id / "main.py").write_text(CLEAN_SLATE_MAIN)


def make_preset(root: Path, name: str, cls: str, extra: str = "") -> None:
    """``root/name.yaml``: a preset for the deployer class ``cls`` of ``tests/support/agents.py``."""
    (root / f"{name}.yaml").write_text(f"name: {name}\ndeployer: tests.support.agents:{cls}\n{extra}")


TCG_TASK_TIMEOUT_S = 1200
"""A demo task's limit for an agent in a guest under TCG. The demo tasks' own (120 s) is for a host that runs its
guest natively; under software emulation the staging (the runtime and a CLI, about 250 MB, unpacked by the guest)
and the CLI's start alone take minutes, and the limit covers them (docs/agents.md)."""


def with_timeout(task: Path, root: Path, timeout_s: int = TCG_TASK_TIMEOUT_S) -> Path:
    """A copy of the task folder ``task`` under ``root`` whose card gives the agent ``timeout_s``."""
    copy = root / task.name
    shutil.copytree(task, copy)
    card = copy / "task.yaml"
    text = card.read_text()
    raised = re.sub(r"^timeout_s: \d+$", f"timeout_s: {timeout_s}", text, count=1, flags=re.M)
    assert raised != text, f"{card} sets no timeout_s"
    card.write_text(raised)
    return copy
