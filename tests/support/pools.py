"""Leasing pool units from a test as a run does, and the traces one task leaves for the next to (not) see.

``leave_traces`` leaves, on a unit, a file in the home folder, a running process, an open window (an xterm
titled with the secret) and the clipboard; ``traces`` says which of them a unit shows. A clean lease shows
none.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ale_iac.engine import Engine
from ale_iac.infra.program import inline_program, pool_units
from ale_iac.profile import PoolSpec, Profile
from ale_iac.runner.leases import dirty_marker
from ale_iac.runner.provisioners import Pool, PoolProvisioner
from ale_iac.runner.status import UnitStatus
from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.sandbox.readiness import wait_ready

SECRET = "left-by-task-a-7f3e"
ALL_TRACES = ["file in home", "process", "window", "clipboard"]
WINDOW_WAIT_S = 60.0


class Record:
    """What a provisioner writes to a unit's record: its events."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def event(self, name: str, **fields: Any) -> None:
        self.events.append((name, fields))

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.events]


async def lease(pool: Pool, lease_timeout_s: float = 5) -> tuple[PoolProvisioner, SandboxHandle, Record]:
    """A lease of a unit of ``pool`` (a task naming no snapshot), ready to use."""
    provisioner = PoolProvisioner(pool, lease_timeout_s=lease_timeout_s)
    record = Record()
    task = SimpleNamespace(task=SimpleNamespace(card=SimpleNamespace(snapshot=None)))
    handle = await provisioner.acquire(task, record)  # type: ignore[arg-type]  # the plan's snapshot only
    await wait_ready(handle, provisioner.ready_timeout_s)
    return provisioner, handle, record


REPO = Path(__file__).resolve().parents[2]


def pool_project(engine: Engine, folder: Path, stack: str, stack_file: str) -> Path:
    """A copy of this project in ``folder`` (``Pulumi.yaml``, ``__main__.py``, the venv) with one stack file,
    ``stacks/Pulumi.<stack>.yaml``, as a user's checkout is when they ``pulumi up`` a pool from it."""
    if engine.toolchain.language_host is None:
        pytest.fail("pulumi-language-python is missing: scripts/setup.sh installs it")
    (folder / "stacks").mkdir(parents=True)
    for name in ("Pulumi.yaml", "__main__.py"):
        (folder / name).write_text((REPO / name).read_text())
    (folder / "stacks" / f"Pulumi.{stack}.yaml").write_text(stack_file)
    (folder / ".venv").symlink_to(REPO / ".venv")
    return folder


def plain_pulumi(engine: Engine, project: Path, *args: str) -> str:
    """``pulumi ARGS`` on ``project`` with the engine's toolchain and backend, as a user would run it; its
    stdout (a failure fails the test with the CLI's output). Its temp dir is a folder of its own, removed after
    it: the Kubernetes provider plugin leaves a copy of the kubeconfig there on every call."""
    with tempfile.TemporaryDirectory(prefix="plain-pulumi-") as scratch:
        out = subprocess.run(
            [str(engine.toolchain.pulumi), *args, "--non-interactive", "--cwd", str(project)],
            env={**os.environ, **engine.env_vars(), "TMPDIR": scratch},
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def on_a_pool(stack: str, profile: Profile, scenario: Callable[[Engine], Awaitable[None]]) -> None:
    """Bring up a pool stack of one unit of ``profile`` (as ``pulumi up`` would), run ``scenario`` on it,
    destroy the stack whatever happened."""
    engine = Engine()
    engine.up(stack, inline_program(profile, pool_units(PoolSpec(units=1), stack), stack))
    try:
        asyncio.run(scenario(engine))
    finally:
        engine.destroy(stack)


async def lease_used_then_reset(pool: Pool) -> tuple[PoolProvisioner, SandboxHandle]:
    """A lease that leaves every trace and is released (the unit reset, its dirty marker gone), then the
    next lease: a unit that shows none of them, with a new endpoint and token. Returns the second lease
    and its handle."""
    first, used, _ = await lease(pool)
    await leave_traces(used)
    assert await traces(used) == ALL_TRACES
    assert dirty_marker(pool.stack, used.unit, pool.records).exists()
    assert await first.release(UnitStatus.SUCCEEDED, 1.0) == "unit reset, lease released"
    assert not dirty_marker(pool.stack, used.unit, pool.records).exists()
    second, fresh, record = await lease(pool)
    assert record.names == ["leased"]
    assert (fresh.endpoint, fresh.token()) != (used.endpoint, used.token())
    assert await traces(fresh) == []
    return second, fresh


async def lease_after_a_dead_holder(
    pool: Pool, holder: PoolProvisioner, handle: SandboxHandle, lease_timeout_s: float = 5
) -> tuple[PoolProvisioner, SandboxHandle, Record]:
    """``holder`` leaves traces on its unit and dies before its reset (the kernel drops its lock, the dirty
    marker stays): the next lease resets the unit before handing it out, and shows none of them. The caller
    releases the lease it gets."""
    await leave_traces(handle)
    assert holder.lease is not None
    holder.lease.release()
    provisioner, fresh, record = await lease(pool, lease_timeout_s)
    assert record.names == ["reset", "leased"]
    assert await traces(fresh) == []
    return provisioner, fresh, record


async def leave_traces(handle: SandboxHandle) -> None:
    async with handle.client() as client:
        await client.write_text(f"{handle.paths.home}/{SECRET}.txt", SECRET)
        started = await client.run_command(f"setsid sh -c 'sleep 86400; :' {SECRET} </dev/null >/dev/null 2>&1 &")
        assert started.exit_code == 0, started.stderr
        opened = await client.run_command(f"setsid xterm -T {SECRET} </dev/null >/dev/null 2>&1 &")
        assert opened.exit_code == 0, opened.stderr
        await client.set_clipboard(SECRET)
        deadline = time.monotonic() + WINDOW_WAIT_S
        while not await _has_window(client):
            assert time.monotonic() < deadline, "the xterm window did not appear"
            await asyncio.sleep(0.2)


async def _has_window(client: Any) -> bool:
    # The window manager's view of the display: an xterm titled with the secret.
    return bool((await client.run_command(f"xdotool search --name '^{SECRET}$'")).exit_code == 0)


async def traces(handle: SandboxHandle) -> list[str]:
    """What of ``leave_traces`` this unit shows (all four on the unit that left them)."""
    found = []
    async with handle.client() as client:
        if await client.file_exists(f"{handle.paths.home}/{SECRET}.txt"):
            found.append("file in home")
        # "[a]": the pattern does not match the shell that runs pgrep.
        pattern = SECRET.replace("task-a", "task-[a]")
        if (await client.run_command(f"pgrep -f -- '{pattern}'")).exit_code == 0:
            found.append("process")
        if await _has_window(client):
            found.append("window")
        if await client.get_clipboard() == SECRET:
            found.append("clipboard")
    return found
