"""Units that wait for a slot prepare (make their stack) ahead of it; a unit that gets one at once does not; work
off the units' critical path (a stack made ahead, one destroyed after its unit's turn) runs at a lower priority."""

from __future__ import annotations

import asyncio
import os
import subprocess
from types import SimpleNamespace
from typing import Any

import pytest

from ale_iac.runner.lifecycle import _prepare_then_take, _Slot
from ale_iac.runner.provisioners import BACKGROUND_NICE, blocking, in_background


class _Provisioner:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    async def prepare(self, plan: Any) -> None:
        self.log.append(f"prepare {self.name}")
        await asyncio.sleep(0)


async def _unit(name: str, ctx: Any, log: list[str], work: asyncio.Event) -> None:
    slot = _Slot(ctx.slots)
    await _prepare_then_take(_Provisioner(name, log), None, ctx, slot)  # type: ignore[arg-type]
    log.append(f"run {name}")
    await work.wait()
    slot.give_back()


def test_only_waiting_units_prepare_and_no_more_than_the_bound() -> None:
    async def scenario() -> list[str]:
        log: list[str] = []
        ctx = SimpleNamespace(slots=asyncio.Semaphore(1), ahead=asyncio.Semaphore(1))
        done = [asyncio.Event() for _ in range(3)]
        tasks = [asyncio.create_task(_unit(f"u{i}", ctx, log, done[i])) for i in range(3)]
        for _ in range(5):
            await asyncio.sleep(0)
        # u0 runs (no prepare: its slot was free), u1 prepared and waits, u2 waits for its turn to prepare.
        assert log == ["run u0", "prepare u1"]
        done[0].set()
        for _ in range(5):
            await asyncio.sleep(0)
        assert log == ["run u0", "prepare u1", "run u1", "prepare u2"]
        done[1].set()
        done[2].set()
        await asyncio.gather(*tasks)
        return log

    assert asyncio.run(scenario()) == ["run u0", "prepare u1", "run u1", "prepare u2", "run u2"]


def test_without_a_bound_on_slots_nothing_prepares() -> None:
    async def scenario() -> list[str]:
        log: list[str] = []
        ctx = SimpleNamespace(slots=None, ahead=None)
        event = asyncio.Event()
        event.set()
        await asyncio.gather(*(_unit(f"u{i}", ctx, log, event) for i in range(2)))
        return log

    assert asyncio.run(scenario()) == ["run u0", "run u1"]


def _niceness_of_a_child() -> int:
    """The niceness a process started from the calling thread gets (as the engine's CLI would)."""
    done = subprocess.run(["sh", "-c", "cut -d' ' -f19 /proc/self/stat"], capture_output=True, text=True, check=True)
    return int(done.stdout)


def test_work_off_the_critical_path_runs_at_a_lower_priority_and_leaves_the_rest_alone() -> None:
    """A stack made ahead or destroyed after its unit's turn (``in_background``) and what it starts yield the CPU
    to the units being provisioned; the runner's own threads keep their priority."""

    async def scenario() -> tuple[int, int, int]:
        background = await in_background(_niceness_of_a_child)
        foreground = await blocking(_niceness_of_a_child)
        return background, foreground, os.getpriority(os.PRIO_PROCESS, 0)

    base = os.getpriority(os.PRIO_PROCESS, 0)
    background, foreground, after = asyncio.run(scenario())
    assert background == min(19, base + BACKGROUND_NICE)
    assert (foreground, after) == (base, base)


def test_a_failed_background_call_raises_in_its_caller() -> None:
    def fails() -> None:
        raise RuntimeError("the engine said no")

    with pytest.raises(RuntimeError, match="the engine said no"):
        asyncio.run(in_background(fails))
