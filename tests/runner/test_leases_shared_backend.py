"""Leases across homes (and hosts) that share one Pulumi backend: the lease records in its storage."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ale_iac.runner import leases
from ale_iac.runner.leases import Owner, Record, RecordStore

UNITS = ["u0", "u1", "u2"]


def _owner(host: str = "elsewhere", pid: int = 1) -> Owner:
    return Owner(token=f"t-{host}-{pid}", host=host, home="h", pid=pid, pid_started=None)


def test_one_record_per_unit_and_only_its_owner_renews_or_releases(tmp_path: Path) -> None:
    store = RecordStore(tmp_path, ttl_s=30)
    mine, theirs = _owner("a"), _owner("b")
    assert store.try_acquire("pool", "u0", mine)
    assert not store.try_acquire("pool", "u0", theirs)
    with pytest.raises(leases.LeaseLostError, match="unit 'u0' of pool 'pool' was lost"):
        store.renew("pool", "u0", theirs)
    store.release("pool", "u0", theirs)  # not theirs to release: the record stays
    current = store.read("pool", "u0")
    assert current is not None and current.owner == mine
    store.renew("pool", "u0", mine)
    renewed = store.read("pool", "u0")
    assert renewed is not None and renewed.expires >= current.expires
    store.release("pool", "u0", mine)
    assert store.read("pool", "u0") is None
    assert store.try_acquire("pool", "u0", theirs)
    # Nothing but the records is left in the folder (temp files and moved-aside records are removed).
    assert sorted(p.name for p in (tmp_path / "pool").iterdir()) == ["u0.json"]


def test_an_expired_record_of_another_host_is_taken_over_after_the_grace(tmp_path: Path) -> None:
    store = RecordStore(tmp_path, ttl_s=30)
    folder = tmp_path / "pool"
    folder.mkdir()
    now = time.time()
    within_grace = Record(_owner("b"), expires=now - leases.TAKEOVER_GRACE_S / 2)
    (folder / "u0.json").write_text(within_grace.to_json())
    assert not store.try_acquire("pool", "u0", _owner("a"))  # clocks may differ: not yet
    expired = Record(_owner("b"), expires=now - leases.TAKEOVER_GRACE_S - 1)
    (folder / "u0.json").write_text(expired.to_json())
    assert store.try_acquire("pool", "u0", _owner("a"))
    taken = store.read("pool", "u0")
    assert taken is not None and taken.owner.host == "a"


def test_a_record_of_a_dead_process_on_this_host_is_taken_over_at_once(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], check=True, capture_output=True, text=True
    )
    gone = Owner.this_process()
    gone = Owner(gone.token, gone.host, gone.home, int(dead.stdout), None)
    store = RecordStore(tmp_path, ttl_s=600)
    assert store.try_acquire("pool", "u0", gone)
    assert store.try_acquire("pool", "u0", Owner.this_process())


def test_a_renewal_that_came_too_late_is_reported_as_lost(tmp_path: Path) -> None:
    store = RecordStore(tmp_path, ttl_s=30)
    lease = leases.try_lease("late", ["u0"], store)
    assert lease is not None and lease.owner is not None
    # Another host took the unit over while this holder was stalled.
    (tmp_path / "late" / "u0.json").write_text(Record(_owner("b"), expires=time.time() + 30).to_json())
    lease.renew()
    assert lease.lost is not None and "was lost" in lease.lost
    lease.release()
    record = store.read("late", "u0")
    assert record is not None and record.owner.host == "b"  # the new holder's record is left alone


def test_a_release_in_this_process_wakes_a_waiter_at_once(tmp_path: Path) -> None:
    async def scenario() -> float:
        held = leases.try_lease("wake", ["u0"])
        assert held is not None
        waiter = asyncio.create_task(leases.lease("wake", ["u0"], timeout_s=10))
        await asyncio.sleep(1.2)  # the waiter's poll interval has backed off to its maximum
        released = time.monotonic()
        held.release()
        got = await waiter
        woke = time.monotonic() - released
        got.release()
        return woke

    assert asyncio.run(scenario()) < leases.POLL_MAX_S


HOLDER = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from ale_iac.runner import leases

    def log(event: str, unit: str) -> None:
        print(json.dumps({{"event": event, "unit": unit, "t": time.time()}}), flush=True)

    async def main() -> None:
        store = leases.record_store(sys.argv[1])
        held = []
        for _ in range(int(sys.argv[2])):
            lease = await leases.lease("shared-pool", {units!r}, timeout_s=60, store=store)
            log("got", lease.unit)  # after the lease is held
            held.append(lease)
            await asyncio.sleep(0.1)
            if len(held) == 2:
                first = held.pop(0)
                log("released", first.unit)  # before it is released
                first.release()
        for lease in held:
            log("released", lease.unit)
            lease.release()

    asyncio.run(main())
    """
).format(units=UNITS)


def _intervals(events: list[dict[str, object]]) -> list[tuple[str, float, float]]:
    started: dict[str, float] = {}
    spans = []
    for event in events:
        unit, t = str(event["unit"]), float(str(event["t"]))
        if event["event"] == "got":
            assert unit not in started
            started[unit] = t
        else:
            spans.append((unit, started.pop(unit), t))
    assert not started
    return spans


def test_two_homes_sharing_one_backend_never_share_a_unit(tmp_path: Path) -> None:
    """Two runner processes, two ale-iac homes (so two host-local lock folders), one file backend.

    Each logs when it holds a unit and when it lets it go; the logged spans lie inside the real holding
    times, so two spans of one unit from different homes that overlap would be a shared unit."""
    backend = f"file://{tmp_path / 'backend'}"
    procs = []
    for name in ("a", "b"):
        env = {**os.environ, "ALE_IAC_HOME": str(tmp_path / f"home-{name}"), "PULUMI_BACKEND_URL": backend}
        procs.append(
            subprocess.Popen([sys.executable, "-c", HOLDER, backend, "15"], env=env, stdout=subprocess.PIPE, text=True)
        )
    spans = []
    for proc in procs:
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0
        spans.append(_intervals([json.loads(line) for line in out.splitlines()]))
    assert [len(s) for s in spans] == [15, 15]
    for unit, start, end in spans[0]:
        for other_unit, other_start, other_end in spans[1]:
            if unit == other_unit:
                assert end < other_start or other_end < start, f"{unit} held by both homes"
    # Both homes got work done on the units (they competed rather than one waiting out the other).
    assert {u for u, _, _ in spans[0]} & {u for u, _, _ in spans[1]}
    records = RecordStore(tmp_path / "backend" / leases.RECORDS_DIR)
    assert [p.name for p in records.folder("shared-pool").iterdir() if not p.name.endswith(".dirty")] == []


def test_a_unit_leased_by_another_home_is_not_leased_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another home's process holds both units: this home's host-local locks are free, the records are not."""
    backend = f"file://{tmp_path / 'backend'}"
    store = leases.record_store(backend)
    assert store is not None
    code = textwrap.dedent(
        """
        import asyncio, sys
        from ale_iac.runner import leases
        async def main() -> None:
            store = leases.record_store(sys.argv[1])
            leased = [await leases.lease("overlap", ["u0", "u1"], 10, store) for _ in range(2)]
            print(" ".join(sorted(lease.unit for lease in leased)), flush=True)
            sys.stdin.read()
            for lease in leased:
                lease.release()
        asyncio.run(main())
        """
    )
    env = {**os.environ, "ALE_IAC_HOME": str(tmp_path / "home-a"), "PULUMI_BACKEND_URL": backend}
    holder = subprocess.Popen(
        [sys.executable, "-c", code, backend], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().split() == ["u0", "u1"]
        for unit in ("u0", "u1"):
            record = store.read("overlap", unit)
            assert record is not None and record.owner.home != "" and record.owner.pid == holder.pid
        # This process has another home: its host-local locks are free, the records are not.
        monkeypatch.setenv("ALE_IAC_HOME", str(tmp_path / "home-b"))
        assert leases.try_lease("overlap", ["u0", "u1"], store) is None
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    assert store.read("overlap", "u0") is None and store.read("overlap", "u1") is None
