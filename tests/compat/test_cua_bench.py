"""The cua_bench stand-in: importable only while a task loads, and a DesktopSession over a real sandbox
with every method ALE's tasks call, in the shapes they expect."""

from __future__ import annotations

import asyncio
import importlib
import sys

import pytest

from ale_iac.compat import cua_bench_importable
from ale_iac.compat.cua_bench import ROLE_ATTR, CommandFailedError, DesktopSession, Task, evaluate_task, setup_task
from ale_iac.substrates.local.sandboxes import LocalSandboxState
from tests.support.sandbox import handle_of


def test_cua_bench_is_importable_only_inside_the_shim() -> None:
    assert "cua_bench" not in sys.modules
    with cua_bench_importable() as stand_in:
        cb = importlib.import_module("cua_bench")
        assert stand_in and cb.Task is Task
    assert "cua_bench" not in sys.modules
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("cua_bench")


def test_the_decorators_mark_and_return_the_function() -> None:
    async def start(*_: object) -> None: ...

    assert setup_task(split="train")(start) is start and getattr(start, ROLE_ATTR) == "setup_task"

    @evaluate_task
    async def evaluate(*_: object) -> list[float]:
        return [1.0]

    assert getattr(evaluate, ROLE_ATTR) == "evaluate_task"
    task = Task(description="d", metadata={"a": 1}, computer={"setup_config": {"os_type": "windows"}}, extra=2)
    assert task.os_type == "windows" and task.extra == {"extra": 2} and Task().os_type is None


@pytest.mark.sandbox
def test_every_session_method_against_a_real_sandbox(local_sandbox: LocalSandboxState) -> None:
    handle = handle_of(local_sandbox)

    async def session_calls() -> None:
        async with handle.client() as client:
            session = DesktopSession(client)
            root = "/tmp/cua-bench-compat"
            await session.interface.create_dir(f"{root}/sub")
            assert await session.directory_exists(f"{root}/sub") and not await session.file_exists(f"{root}/x")
            await session.write_file(f"{root}/a.txt", "text\n")
            await session.write_text(f"{root}/b.txt", "more")
            await session.write_bytes(f"{root}/c.bin", b"\x00\xff")
            assert await session.read_file(f"{root}/a.txt") == "text\n"
            assert await session.read_text(f"{root}/b.txt") == "more"
            assert await session.read_bytes(f"{root}/c.bin") == b"\x00\xff"
            assert await session.file_exists(f"{root}/a.txt")
            assert sorted(await session.list_dir(root)) == ["a.txt", "b.txt", "c.bin", "sub"]
            result = await session.run_command(f"cat {root}/a.txt; echo err >&2; exit 3")
            assert result == {"return_code": 3, "stdout": "text\n", "stderr": "err\n"}
            with pytest.raises(CommandFailedError, match="exited 3"):
                await session.run_command("exit 3", check=True)
            assert (await session.interface.run_command("echo hi"))["stdout"] == "hi\n"
            assert (await session.screenshot()).startswith(b"\x89PNG")
            assert (await session.interface.screenshot()).startswith(b"\x89PNG")
            face = session.interface
            await face.write_text(f"{root}/sub/d.txt", "d")
            await face.write_bytes(f"{root}/sub/e.bin", b"e")
            assert (
                await face.read_text(f"{root}/sub/d.txt") == "d" and await face.read_bytes(f"{root}/sub/e.bin") == b"e"
            )
            assert await face.file_exists(f"{root}/sub/d.txt") and await face.directory_exists(f"{root}/sub")
            for name in await face.list_dir(f"{root}/sub"):
                await face.delete_file(f"{root}/sub/{name}")
            await face.delete_dir(f"{root}/sub")
            assert not await session.directory_exists(f"{root}/sub")

    asyncio.run(session_calls())
