"""The documentation as a whole: every document it cites is in the repository, the task SDK is documented name
for name, and the plain-HTTP example of docs/bridges.md works against a real sandbox."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

import ale_iac.task
from ale_iac.runner.tasks import load_task
from tests.support.sandbox import Endpoint

REPO = Path(__file__).resolve().parents[1]
CITING = ("*.md", "docs/*.md", "ale_iac/**/*.py", "agents/**/*", "examples/**/*", "images/**/*", "scripts/*", "bench/*")
MD_REFERENCE = re.compile(r"[\w./:-]*\.md\b")


def _cited(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, IsADirectoryError):
        return []
    return [ref for ref in MD_REFERENCE.findall(text) if "://" not in ref]


def _resolves(ref: str, cited_in: Path) -> bool:
    """A cited document is a file of the repository, relative to the citing file or to the repository's root."""
    if ref.startswith("/"):
        return False  # a path of one machine, not of the repository
    for base in (cited_in.parent, REPO):
        target = (base / ref).resolve()
        if target.is_relative_to(REPO) and target.is_file():
            return True
    return False


def test_every_document_the_docs_and_the_code_cite_is_in_the_repository() -> None:
    files = sorted({p for pattern in CITING for p in REPO.glob(pattern) if p.is_file() and ".venv" not in p.parts})
    assert len(files) > 50
    missing = [f"{p.relative_to(REPO)}: {ref}" for p in files for ref in _cited(p) if not _resolves(ref, p)]
    assert missing == []


def _blocks(page: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", (REPO / "docs" / page).read_text(), flags=re.M | re.S)


def test_the_task_page_documents_every_name_of_the_task_sdk_and_its_example_loads(tmp_path: Path) -> None:
    page = (REPO / "docs" / "tasks.md").read_text()
    assert [name for name in ale_iac.task.__all__ if f"`{name}" not in page] == []
    [example] = [block for block in _blocks("tasks.md", "python") if "Evaluation(" in block]
    folder = tmp_path / "graded"
    folder.mkdir()
    (folder / "task.yaml").write_text("id: graded\ninstruction: Write summary.txt.\n")
    (folder / "main.py").write_text(example)
    task = load_task(folder)  # imports it and checks its hooks
    assert task.hook("evaluate") is not None


@pytest.mark.sandbox
def test_the_plain_http_example_talks_to_a_sandbox(computer_server_endpoint: Endpoint) -> None:
    [block] = [b for b in _blocks("bridges.md", "bash") if "curl" in b]
    first, rest = block.split("\n", 1)
    assert first.startswith('eval "$(ale-iac sandbox env STACK)"')  # what the environment below stands in for
    env = {**os.environ, "ALE_IAC_ENDPOINT": computer_server_endpoint.url}
    env["ALE_IAC_ENDPOINT_TOKEN"] = computer_server_endpoint.token or ""
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", rest], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    status, command = done.stdout.strip().splitlines()
    assert json.loads(status)["status"] == "ok"
    assert command.startswith("data: ") and '"stdout": "Linux\\n"' in command
    if computer_server_endpoint.token:  # and without the token it is refused
        bare = {**env, "ALE_IAC_ENDPOINT_TOKEN": "not-the-token"}
        refused = subprocess.run(
            ["bash", "-o", "pipefail", "-c", rest], env=bare, capture_output=True, text=True, timeout=60, check=False
        )
        assert refused.returncode != 0 and "401" in refused.stderr + refused.stdout
