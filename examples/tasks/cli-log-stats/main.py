"""cli-log-stats: count events in three logs with shell tools and write a small summary file.

The grader compares each ``key=value`` line of the agent's summary.txt with the hidden reference:
one third of the score per correct key.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ale_iac.task import TaskSandbox

OUTPUT_NAME = "summary.txt"
LOG_COUNT = 3


def parse_summary(text: str) -> dict[str, str]:
    """``key=value`` lines (surrounding blanks ignored); later lines win; other lines are skipped."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            values[key.strip()] = value.strip()
    return values


async def setup(sandbox: TaskSandbox) -> None:
    """Check the staged logs are there and start from an empty output folder."""
    logs = shlex.quote(f"{sandbox.input_dir}/logs")
    out = shlex.quote(sandbox.output_dir)
    result = await sandbox.run(f"rm -rf {out} && mkdir -p {out} && ls {logs}/*.log | wc -l")
    if result.exit_code != 0 or result.stdout.strip() != str(LOG_COUNT):
        raise RuntimeError(
            f"cli-log-stats setup: expected {LOG_COUNT} logs in {sandbox.input_dir}/logs, "
            f"got {result.stdout.strip() or '?'} (exit {result.exit_code}: {result.stderr.strip()})"
        )


async def evaluate(sandbox: TaskSandbox) -> float:
    expected = parse_summary(await sandbox.read_text(f"{sandbox.reference_dir}/expected.txt"))
    path = f"{sandbox.output_dir}/{OUTPUT_NAME}"
    if not expected:
        raise RuntimeError("cli-log-stats: the reference expected.txt has no key=value lines")
    if not await sandbox.exists(path):
        return 0.0
    got = parse_summary(await sandbox.read_text(path))
    return sum(1 for key, value in expected.items() if got.get(key) == value) / len(expected)
