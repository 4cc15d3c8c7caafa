"""Readiness: how often a unit is asked (the schedule alone, and ``wait_ready`` against a port that refuses), and a
real sandbox that never gets ready: the error says why, from the sandbox's own logs."""

from __future__ import annotations

import asyncio
import socket

import pytest

from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.sandbox.readiness import (
    MAX_POLL_S,
    MIN_POLL_S,
    POLL_FRACTION,
    SandboxNotReadyError,
    poll_interval,
    wait_ready,
)
from tests.support.sandbox import SandboxFactory, handle_of


def _attempt_times(ready_at_s: float) -> float:
    """When the first attempt at or after ``ready_at_s`` starts, on the schedule alone (attempts cost nothing)."""
    waited = 0.0
    while waited < ready_at_s:
        waited += poll_interval(waited)
    return waited


@pytest.mark.parametrize("ready_at_s", [0.3, 0.97, 1.0, 1.3, 2.6, 7.0, 19.9, 45.0, 150.0, 599.0])
def test_a_unit_is_seen_at_most_a_twentieth_of_its_wait_late(ready_at_s: float) -> None:
    late = _attempt_times(ready_at_s) - ready_at_s
    # The pause before the attempt that sees it was decided at most one pause earlier.
    assert late <= max(MIN_POLL_S, min(MAX_POLL_S, ready_at_s * POLL_FRACTION)) + 1e-9


def test_the_pause_is_bounded_both_ways() -> None:
    assert poll_interval(0.0) == MIN_POLL_S
    assert poll_interval(4.0) == pytest.approx(0.2)
    assert poll_interval(3600.0) == MAX_POLL_S


def test_wait_ready_pauses_as_its_schedule_says_and_says_how_often_it_asked() -> None:
    with socket.socket() as probe:  # a loopback port nothing listens on: every attempt is refused at once
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    asked: list[float] = []

    def schedule(waited_s: float) -> float:
        asked.append(waited_s)
        return 0.1

    handle = SandboxHandle.for_endpoint(f"http://127.0.0.1:{port}", token="t")
    with pytest.raises(SandboxNotReadyError) as info:
        asyncio.run(wait_ready(handle, 0.55, schedule=schedule))
    assert asked == sorted(asked) and asked[0] < 0.1
    assert 2 <= len(asked) <= 6  # about 0.55 / 0.1 pauses: never a tight loop, never a wait without attempts
    assert f"({len(asked)} attempts)" in str(info.value)  # each attempt made was followed by a pause


@pytest.mark.sandbox
def test_a_sandbox_that_never_gets_ready_is_explained_by_its_logs(sandbox_factory: SandboxFactory) -> None:
    # sh given ale-init's options fails at once: the computer-server never starts.
    state = sandbox_factory(wait=False, init="/bin/sh")
    handle = handle_of(state)
    with pytest.raises(SandboxNotReadyError) as info:
        asyncio.run(wait_ready(handle, 5))
    message = str(info.value)
    assert f"at {state.endpoint} was not ready after 5 s" in message
    assert "--- supervisor.log ---" in message and "--- init.log ---" in message
    assert "Illegal option" in message
