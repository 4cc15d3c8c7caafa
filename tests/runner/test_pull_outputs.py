"""Pulling a task's outputs from the sandbox: the listing comes from the sandbox and may lie."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import pytest

from ale_iac.errors import AleIacError
from ale_iac.runner.tasks import download_dir
from ale_iac.sandbox.client import CommandResult


class ListingClient:
    """Answers the listing command with ``names`` and every read with the file's own name."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.reads: list[str] = []

    async def run_command(self, command: str, timeout: float | None = None) -> CommandResult:
        listing = base64.b64encode("\0".join(self.names).encode() + b"\0").decode()
        return CommandResult(exit_code=0, stdout=listing, stderr="")

    async def read_bytes(self, path: str) -> bytes:
        self.reads.append(path)
        return path.encode()


def pull(names: list[str], local: Path) -> tuple[int, ListingClient]:
    client = ListingClient(names)
    count = asyncio.run(download_dir(client, "/data/tasks/t/output", local))  # type: ignore[arg-type]
    return count, client


def test_files_land_under_the_output_folder(tmp_path: Path) -> None:
    count, _ = pull(["./a.txt", "./sub/b.txt"], tmp_path / "out")
    assert count == 2
    assert (tmp_path / "out" / "sub" / "b.txt").read_bytes() == b"/data/tasks/t/output/sub/b.txt"


@pytest.mark.parametrize("name", ["../escape.txt", "./../../etc/cron.d/x", "/etc/passwd", "./a/../../x", "."])
def test_a_name_pointing_outside_is_refused_before_anything_is_read(tmp_path: Path, name: str) -> None:
    (tmp_path / "out").mkdir()
    with pytest.raises(AleIacError, match="points outside the output folder"):
        pull([name], tmp_path / "out")
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "x").exists()


def test_a_symlink_planted_on_the_host_side_is_not_followed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (out / "a.txt").symlink_to(victim)
    pull(["./a.txt"], out)
    assert victim.read_text() == "keep me"
    assert not (out / "a.txt").is_symlink()
