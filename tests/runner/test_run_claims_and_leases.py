"""Run claims (what gc may touch) and pool leases (two runs never share a unit)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ale_iac.errors import AleIacError
from ale_iac.runner import leases
from ale_iac.runner.run_claims import RunRegistry, read_claims


def test_claims_of_a_live_run_are_alive_and_vanish_on_close(tmp_path: Path) -> None:
    registry = RunRegistry("r1", tmp_path)
    registry.claim("run-a")
    registry.claim("run-b")
    registry.release("run-a")
    [claim] = read_claims()
    assert claim.alive and claim.stacks == ["run-b"]
    registry.close()
    assert read_claims() == []


def test_retained_stacks_outlive_the_run_record(tmp_path: Path) -> None:
    registry = RunRegistry("r2", tmp_path)
    registry.claim("run-x")
    registry.retain("run-x")
    registry.close()
    [claim] = read_claims()
    assert claim.retained == ["run-x"] and claim.stacks == []


def test_claim_of_a_dead_process_is_not_alive(tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        from pathlib import Path
        from ale_iac.runner.run_claims import RunRegistry
        RunRegistry("dead", Path({str(tmp_path)!r})).claim("run-orphan")
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    [claim] = read_claims()
    assert claim.stacks == ["run-orphan"] and not claim.alive


def test_leases_are_exclusive_and_released() -> None:
    first = leases.try_lease("pool", ["u0", "u1"])
    second = leases.try_lease("pool", ["u0", "u1"])
    assert first is not None and second is not None
    assert {first.unit, second.unit} == {"u0", "u1"}
    assert leases.try_lease("pool", ["u0", "u1"]) is None
    first.release()
    third = leases.try_lease("pool", ["u0", "u1"])
    assert third is not None and third.unit == first.unit
    second.release()
    third.release()


def test_lease_held_by_another_process_is_respected_until_it_dies() -> None:
    code = (
        "from ale_iac.runner import leases; import time; lease = leases.try_lease('p2', ['u0']); "
        "print(lease.unit, flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "u0"
        assert leases.try_lease("p2", ["u0"]) is None
        with pytest.raises(AleIacError, match="no free unit in pool 'p2'"):
            asyncio.run(leases.lease("p2", ["u0"], timeout_s=0.3))
    finally:
        holder.kill()
        holder.wait()
    lease = asyncio.run(leases.lease("p2", ["u0"], timeout_s=5))
    lease.release()
