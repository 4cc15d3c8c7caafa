"""The sandbox executor's mirror of the remote work dir, against a stand-in for the computer-server's
file commands (the mirror's own logic: what it copies, appends, skips; the real server is in test_sandbox.py)."""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from ale_iac.executors.sandbox import _Mirror
from ale_iac.sandbox.client import ComputerServerClient
from ale_iac.sandbox.protocol import ComputerServerError

REMOTE = "/work"


@dataclass
class _Result:
    exit_code: int
    stdout: str


@dataclass
class _Server:
    """Files of the remote work dir; ``vanish`` are listed but deleted before they are read."""

    files: dict[str, bytes]
    vanish: set[str] = field(default_factory=set)

    async def run_command(self, command: str) -> _Result:
        del command
        listing = "".join(f"{len(data)}\t{rel}\0" for rel, data in self.files.items())
        return _Result(0, base64.b64encode(listing.encode()).decode())

    async def read_bytes(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        rel = path.removeprefix(f"{REMOTE}/")
        if rel in self.vanish:
            self.files.pop(rel, None)
            raise ComputerServerError("http://127.0.0.1:1", "read_bytes", f"No such file or directory: {path!r}")
        if rel not in self.files:
            raise ComputerServerError("http://127.0.0.1:1", "read_bytes", "permission denied")
        data = self.files[rel][offset:]
        return data if length is None else data[:length]

    async def file_exists(self, path: str) -> bool:
        return path.removeprefix(f"{REMOTE}/") in self.files


def _sync(mirror: _Mirror, server: _Server) -> None:
    asyncio.run(mirror.sync(cast(ComputerServerClient, server), REMOTE))


def test_a_file_that_vanishes_between_listing_and_read_is_skipped(tmp_path: Path) -> None:
    server = _Server({"log.txt": b"one\n", "db.sqlite-shm": b"x" * 10}, vanish={"db.sqlite-shm"})
    mirror = _Mirror(tmp_path)
    _sync(mirror, server)
    assert (tmp_path / "log.txt").read_bytes() == b"one\n"
    assert not (tmp_path / "db.sqlite-shm").exists()
    # It comes back later: copied whole then.
    server.vanish.clear()
    server.files["db.sqlite-shm"] = b"y" * 4
    server.files["log.txt"] += b"two\n"
    _sync(mirror, server)
    assert (tmp_path / "db.sqlite-shm").read_bytes() == b"yyyy"
    assert (tmp_path / "log.txt").read_bytes() == b"one\ntwo\n"


def test_a_read_that_fails_for_a_file_that_is_still_there_is_an_error(tmp_path: Path) -> None:
    server: Any = _Server({"log.txt": b"one\n"})

    async def refuse(path: str, offset: int = 0, length: int | None = None) -> bytes:
        raise ComputerServerError("http://127.0.0.1:1", "read_bytes", "permission denied")

    server.read_bytes = refuse
    with pytest.raises(ComputerServerError, match="permission denied"):
        _sync(_Mirror(tmp_path), server)
