"""`ale-iac evaluate` refusing bad input, through the real command line: exit code 2, every problem on a line of
its own naming its file and field, and nothing made (no engine is needed to say so)."""

from __future__ import annotations

import re
from pathlib import Path

from ale_iac.cli.evaluate import evaluate
from tests.support.cli import REPO, ale_iac
from tests.support.tasks import make_preset, make_task


def test_a_bad_experiment_exits_2_with_every_problem_on_a_line(tmp_path: Path) -> None:
    exp = tmp_path / "exp.yaml"
    exp.write_text("name: x\nagents: [scripted]\ntasks: [t]\ntimout_s: 60\nconcurency: 2\n")
    result = ale_iac("evaluate", str(exp), timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert sorted(result.stderr.splitlines()) == [
        f"error: {exp}: concurency: unknown key (did you mean 'concurrency'?)",
        f"error: {exp}: timout_s: unknown key (did you mean 'unit_timeout_s'?)",
    ]
    assert not (tmp_path / "runs").exists()


def test_a_profile_that_does_not_exist_is_named_with_the_experiment_file(tmp_path: Path) -> None:
    make_task(tmp_path, "answer")
    make_preset(tmp_path, "writer", "WriterAgent")
    exp = tmp_path / "exp.yaml"
    exp.write_text("name: x\nagents: [writer.yaml]\ntasks: [answer]\nprofile: loacl\n")
    result = ale_iac("evaluate", str(exp), timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith(f"error: {exp}: profile: no such profile 'loacl' (did you mean 'local'?) (shipped: ")
    assert not (tmp_path / "runs").exists()


def _codes(text: str) -> set[int]:
    return {int(code) for code in re.findall(r"\b(\d+) (?:when|if)\b", " ".join(text.split()))}


def test_every_exit_code_is_documented_in_the_page_and_the_help() -> None:
    page = (REPO / "docs" / "experiments.md").read_text()
    paragraph = page[page.index("**Exit code**") :].split("\n\n", 1)[0]
    assert _codes(paragraph) == {0, 1, 2, 130}
    assert evaluate.__doc__ is not None and _codes(evaluate.__doc__) == {0, 1, 2, 130}
