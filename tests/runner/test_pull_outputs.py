"""Pulling a task's outputs from the sandbox: the listing comes from the sandbox and may lie."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ale_iac.errors import AleIacError
from ale_iac.runner.tasks import download_dir

ROOT = "/data/tasks/t/output"


class ListingClient:
    """Lists ``names`` (paths relative to the output folder, as the sandbox claims them) through the file
    commands, and answers every read with the file's own path. A shell command fails the test."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.reads: list[str] = []

    async def run_command(self, command: str, timeout: float | None = None) -> None:
        raise AssertionError(f"pulling ran a shell command: {command}")

    def _rel(self, path: str) -> str:
        return path[len(ROOT) :].lstrip("/")

    async def dir_exists(self, path: str) -> bool:
        rel = self._rel(path)
        return path == ROOT or any(n.startswith(rel + "/") for n in self.names)

    async def list_dir(self, path: str) -> list[str]:
        rel = self._rel(path)
        prefix = rel + "/" if rel else ""
        return sorted({n[len(prefix) :].split("/")[0] for n in self.names if n.startswith(prefix)})

    async def read_bytes(self, path: str) -> bytes:
        self.reads.append(path)
        return path.encode()


def pull(names: list[str], local: Path) -> tuple[int, ListingClient]:
    client = ListingClient(names)
    count = asyncio.run(download_dir(client, ROOT, local))  # type: ignore[arg-type]
    return count, client


def test_files_land_under_the_output_folder(tmp_path: Path) -> None:
    count, _ = pull(["a.txt", "sub/b.txt"], tmp_path / "out")
    assert count == 2
    assert (tmp_path / "out" / "sub" / "b.txt").read_bytes() == b"/data/tasks/t/output/sub/b.txt"


class LyingClient(ListingClient):
    async def list_dir(self, path: str) -> list[str]:
        return self.names if path == ROOT else []


@pytest.mark.parametrize("name", ["../escape.txt", "..", "/etc/passwd", "a/../../x", ".", "a\\..\\x", ""])
def test_a_name_pointing_outside_is_refused_before_anything_is_read(tmp_path: Path, name: str) -> None:
    (tmp_path / "out").mkdir()
    client = LyingClient([name])
    with pytest.raises(AleIacError, match="points outside the output folder"):
        asyncio.run(download_dir(client, ROOT, tmp_path / "out"))  # type: ignore[arg-type]
    assert client.reads == []
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "x").exists()


def test_a_symlink_planted_on_the_host_side_is_not_followed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (out / "a.txt").symlink_to(victim)
    pull(["a.txt"], out)
    assert victim.read_text() == "keep me"
    assert not (out / "a.txt").is_symlink()
