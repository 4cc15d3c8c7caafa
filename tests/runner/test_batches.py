"""Requests batched into one call at a time (a pool's recreations: tests/runner/test_resets.py)."""

from __future__ import annotations

import threading

import pytest

from ale_iac.runner.batches import Batches


def test_each_caller_gets_its_own_result_of_the_call_that_carried_it() -> None:
    calls: list[dict[str, int]] = []
    first_running, release_first = threading.Event(), threading.Event()

    def call(batch: dict[str, int]) -> dict[str, int]:
        calls.append(dict(batch))
        if len(calls) == 1:
            first_running.set()
            assert release_first.wait(10)
        return {key: value * 10 for key, value in batch.items() if key != "b"}

    batches: Batches[str, int, int] = Batches(call)
    results: dict[str, int | None] = {}

    def ask(key: str, value: int) -> None:
        results[key] = batches.submit(key, value)

    first = threading.Thread(target=ask, args=("a", 1))
    first.start()
    assert first_running.wait(10)
    later = [threading.Thread(target=ask, args=(key, value)) for key, value in (("b", 2), ("c", 3))]
    for thread in later:
        thread.start()
    while len(batches.pending) < 2:
        threading.Event().wait(0.01)
    release_first.set()
    for thread in [first, *later]:
        thread.join(10)
    assert calls == [{"a": 1}, {"b": 2, "c": 3}]
    assert results == {"a": 10, "b": None, "c": 30}  # a key the call left out gets None
    assert batches.pending == {} and batches.finished == {} and not batches.running


def test_a_second_request_under_a_key_in_flight_is_refused() -> None:
    running, release = threading.Event(), threading.Event()

    def call(batch: dict[str, int]) -> dict[str, int]:
        running.set()
        assert release.wait(10)
        return {}

    batches: Batches[str, int, int] = Batches(call)
    thread = threading.Thread(target=batches.submit, args=("a", 1))
    thread.start()
    assert running.wait(10)
    with pytest.raises(ValueError, match="a request for 'a' is in flight already"):
        batches.submit("a", 2)
    release.set()
    thread.join(10)
    assert batches.submit("a", 3) is None  # once it ended, the key is free again
