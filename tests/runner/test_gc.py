"""`ale-iac gc`: what it collects and what it must leave alone (real engine, file backend)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pulumi
import pytest

from ale_iac.contract import LINUX_DESKTOP_PATHS, UNITS_OUTPUT
from ale_iac.engine import Engine
from ale_iac.errors import AleIacError
from ale_iac.paths import home_id
from ale_iac.runner.gc import collect, destroy_retained
from ale_iac.runner.run_claims import RunRegistry

pytestmark = [pytest.mark.engine]


def _units_program(expires_at: str | None) -> Any:
    """A stack exporting one cloud-like unit handle (what gcloud/aws/aliyun units export)."""

    def program() -> None:
        handle = {
            "unit": "u0",
            "provider": "gcloud",
            "endpoint": "http://203.0.113.7:8000",
            "os": "linux",
            "snapshot": "cpu-free-ubuntu",
            "image": "ale-ubuntu",
            "resource_id": "i-123",
            "region": "us-central1-a",
            "paths": LINUX_DESKTOP_PATHS.model_dump(),
            "labels": {},
            "expires_at": expires_at,
            "managed": True,
        }
        pulumi.export(UNITS_OUTPUT, {"u0": handle})

    return program


def test_gc_destroys_orphans_and_spares_live_retained_pools_and_sandboxes(tmp_path: Any) -> None:
    engine = Engine()
    mine = home_id()
    theirs = "000000" if mine != "000000" else "111111"  # another ale-iac home sharing the backend
    orphan, live_stack, kept_stack, sandbox = (
        f"{kind}-{mine}-{n}" for kind, n in (("run", "orphan"), ("run", "live"), ("run", "kept"), ("sbx", "mine"))
    )
    other_run, other_sandbox = f"run-{theirs}-orphan", f"sbx-{theirs}-theirs"
    for name in (orphan, live_stack, kept_stack, sandbox, "pool-a", other_run, other_sandbox):
        engine.up(name, _units_program(None))
    live = RunRegistry("live-run", tmp_path)
    live.claim(live_stack)
    kept = RunRegistry("kept-run", tmp_path)
    kept.claim(kept_stack)
    kept.retain(kept_stack)
    kept.close()

    dry = collect(engine, dry_run=True)
    assert dry.destroyed == [orphan] and len(engine.list_stacks()) == 7

    report = collect(engine)
    assert report.destroyed == [orphan]
    assert "live run live-run" in report.kept[live_stack]
    assert "retained by run kept-run" in report.kept[kept_stack]
    assert "not ephemeral" in report.kept["pool-a"] and "not ephemeral" in report.kept[sandbox]
    assert "made by another ale-iac home" in report.kept[other_run]
    assert sorted(s.name for s in engine.list_stacks()) == sorted(
        ["pool-a", kept_stack, live_stack, sandbox, other_run, other_sandbox]
    )

    assert collect(engine, sandboxes=True).destroyed == [sandbox]
    live.close()
    for name in (live_stack, kept_stack, "pool-a", other_run, other_sandbox):
        engine.destroy(name)


def test_gc_lists_expired_cloud_units_and_destroys_them_on_request() -> None:
    engine = Engine()
    engine.up("pool-old", _units_program("2020-01-01T00:00:00Z"))
    engine.up("pool-new", _units_program("2999-01-01T00:00:00Z"))
    listed = collect(engine, dry_run=True)
    assert listed.expired == ["pool-old"] and listed.destroyed == []
    done = collect(engine, expired=True)
    assert done.expired == ["pool-old"] and done.destroyed == ["pool-old"]
    assert [s.name for s in engine.list_stacks()] == ["pool-new"]
    engine.destroy("pool-new")


def test_destroying_what_a_run_retained(tmp_path: Any) -> None:
    """``ale-iac sandbox destroy --run RUN_ID``: what a finished run kept on purpose, and only that."""
    engine = Engine()
    retained, other = f"run-{home_id()}-kept", f"run-{home_id()}-other"
    for name in (retained, other):
        engine.up(name, _units_program(None))
    live = RunRegistry("live-run", tmp_path)
    live.claim(other)
    live.retain(other)
    with pytest.raises(AleIacError, match="run live-run is still running"):
        destroy_retained(engine, "live-run")
    # The retaining run, finished: its registry file outlives its process because it retained a stack.
    code = (
        "from pathlib import Path\n"
        "from ale_iac.runner.run_claims import RunRegistry\n"
        f"r = RunRegistry('finished-run', Path({str(tmp_path)!r}))\n"
        f"r.claim({retained!r}); r.retain({retained!r}); r.close()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert destroy_retained(engine, "finished-run") == [retained]
    assert sorted(s.name for s in engine.list_stacks()) == [other]
    with pytest.raises(AleIacError, match="no run 'finished-run'"):
        destroy_retained(engine, "finished-run")
    live.close()
    engine.destroy(other)
