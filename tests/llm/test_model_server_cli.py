"""``ale-iac model-server``: the scripted model API from the real command line."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anthropic
import pytest

from tests.llm.helpers import CLAUDE_TOOLS, anthropic_client, claude_messages
from tests.support.cli import REPO, ale_iac

PLAN = """
scripts:
  - match: list the files
    turns:
      - tool: mcp:vm.run_command
        arguments: {command: ls}
        usage: {input_tokens: 11, output_tokens: 3}
      - text: Two files.
"""


@contextmanager
def model_server(plan: Path, *args: str) -> Iterator[tuple[subprocess.Popen[str], str, str]]:
    """The command running, its base URL and its banner (its first three lines, printed once it listens)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "ale_iac", "model-server", "--plan", str(plan), *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        found = re.search(r"on (http://127\.0\.0\.1:\d+) ", first)
        assert found, first + process.communicate(timeout=60)[1]
        banner = first + process.stdout.readline() + process.stdout.readline()
        yield process, found[1], banner
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_it_serves_the_plan_until_interrupted(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN)
    with model_server(path) as (process, url, banner):
        client = anthropic_client(url, "any-key")
        reply = client.messages.create(
            model="m", max_tokens=5, messages=claude_messages("list the files"), tools=CLAUDE_TOOLS
        )
        assert reply.content[0].type == "tool_use"
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert f"ANTHROPIC_BASE_URL={url}" in banner and f"base_url = {url}/v1" in banner
    assert "served 1 request(s), 11 input and 3 output tokens; 0 plan error(s)" in out
    assert "script 0 turn 0: tool mcp__vm__run_command {'command': 'ls'} [11/3 tokens]" in err


def test_plan_errors_make_it_exit_1(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN)
    with model_server(path) as (process, url, _banner):
        with pytest.raises(anthropic.BadRequestError, match="plan error: no script matches the prompt 'other'"):
            anthropic_client(url, "k").messages.create(model="m", max_tokens=5, messages=claude_messages("other"))
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 1, err
    assert "PLAN ERROR: no script matches the prompt" in err and "1 plan error(s)" in out


def test_bad_input_is_one_line_naming_the_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text("scripts:\n  - match: x\n    turns: [{tool: run_command}]\n")
    result = ale_iac("model-server", "--plan", str(path), timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: {path}: scripts.0.turns.0.tool: ")
    missing = ale_iac("model-server", "--plan", str(path), "--api-key-env", "NO_SUCH_VARIABLE_HERE", timeout=60)
    assert missing.returncode == 2 and "scripts.0.turns.0.tool" in missing.stderr
    path.write_text(PLAN)
    missing = ale_iac("model-server", "--plan", str(path), "--api-key-env", "NO_SUCH_VARIABLE_HERE", timeout=60)
    assert missing.returncode == 2 and "NO_SUCH_VARIABLE_HERE" in missing.stderr
