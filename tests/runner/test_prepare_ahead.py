"""Units that wait for a slot prepare (make their stack) ahead of it; a unit that gets one at once does not."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from ale_iac.runner.lifecycle import _prepare_then_take, _Slot


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
