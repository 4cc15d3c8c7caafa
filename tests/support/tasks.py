"""Trivial task folders and agent presets for the runner's end-to-end tests (``tests/runner/``).

The task asks for 6*7 and grades ``output/answer.txt`` against ``reference/answer.txt``; the presets
name the misbehaving deployers of ``tests/support/agents.py``.
"""

from __future__ import annotations

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


def make_preset(root: Path, name: str, cls: str, extra: str = "") -> None:
    """``root/name.yaml``: a preset for the deployer class ``cls`` of ``tests/support/agents.py``."""
    (root / f"{name}.yaml").write_text(f"name: {name}\ndeployer: tests.support.agents:{cls}\n{extra}")
