"""The guest share as the bulk transport of a qemu unit: staging in and pulling out through a real guest,
byte-exact, root-owned, links and special files never followed or copied, nothing left in the share."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from ale_iac.contract import LINUX_DESKTOP_PATHS, UnitOutputs
from ale_iac.sandbox.transport import download_dir, transport_for, upload_dir
from ale_iac.substrates.qemu import runtime
from tests.substrates.qemu.conftest import StartFn, endpoint
from tests.support.sandbox import run


def _handle(resource_id: str, **fields: Any) -> UnitOutputs:
    base = {"unit": "u", "provider": "qemu", "endpoint": "http://127.0.0.1:1", "snapshot": "s", "image": "i",
            "resource_id": resource_id, "paths": LINUX_DESKTOP_PATHS, "transport": "qemu"}  # fmt: skip
    return UnitOutputs.model_validate({**base, **fields})


async def _never(*_args: Any) -> int:
    raise AssertionError("the http fallback was used")


def test_a_unit_without_a_share_on_this_host_falls_back_to_http() -> None:
    assert transport_for(_handle("no-such-unit"), "/data/x") == "http"
    assert transport_for(_handle("../etc"), "/data/x") == "http"


@pytest.mark.qemu
@pytest.mark.xdist_group("qemu")  # one guest boot at a time on 2 cores
@pytest.mark.timeout(1200)
def test_stage_and_collect_through_the_guest_share(start_unit: StartFn, tmp_path: Path) -> None:
    state = start_unit()
    handle = _handle(state.sandbox_id, endpoint=state.endpoint)
    assert transport_for(handle, "/tmp/anything") == "qemu"
    source = tmp_path / "in"
    (source / "sub" / "deeper").mkdir(parents=True)
    payload = os.urandom(3 * 2**20 + 17)
    (source / "big.bin").write_bytes(payload)
    (source / "sub" / "deeper" / "note.txt").write_text("héllo\n")
    (source / "run.sh").write_text("#!/bin/sh\necho ok\n")
    (source / "run.sh").chmod(0o755)
    (source / "link").symlink_to("/etc/passwd")  # not a regular file: never staged

    async def go() -> tuple[int, int]:
        async with endpoint(state).client() as client:
            staged = await upload_dir(handle, client, source, "/data/tasks/t1/input", _never)
            made = (
                "cd /data/tasks/t1 && mkdir out && cp -R input/. out/ && ln -s / out/root-link && "
                "mkfifo out/fifo && ln -s /etc/shadow out/shadow-link"
            )
            assert (await client.run_command(made)).exit_code == 0
            pulled = await download_dir(handle, client, "/data/tasks/t1/out", tmp_path / "back", _never)
            missing = await download_dir(handle, client, "/data/tasks/none", tmp_path / "none", _never)
            assert missing == 0
            return staged, pulled

    staged, pulled = asyncio.run(go())
    assert staged == pulled == 3
    listing = run(endpoint(state), "cd /data/tasks/t1/input && stat -c '%U %a %n' big.bin run.sh sub/deeper/note.txt")
    assert listing["stdout"].split("\n")[:3] == ["root 644 big.bin", "root 755 run.sh", "root 644 sub/deeper/note.txt"]
    assert run(endpoint(state), "test -e /data/tasks/t1/input/link; echo $?")["stdout"] == "1\n"
    back = tmp_path / "back"
    assert (back / "big.bin").read_bytes() == payload
    assert (back / "sub" / "deeper" / "note.txt").read_text() == "héllo\n"
    assert sorted(p.relative_to(back).as_posix() for p in back.rglob("*") if not p.is_dir()) == [
        "big.bin", "run.sh", "sub/deeper/note.txt"
    ]  # fmt: skip
    assert not any(p.is_symlink() for p in back.rglob("*"))
    assert list(runtime.share_dir(state.sandbox_id).iterdir()) == []
    assert run(endpoint(state), "ls -A /mnt/ale-share | wc -l")["stdout"] == "0\n"
