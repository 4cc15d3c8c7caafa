"""`ale-iac gc`: what it collects and what it must leave alone (real engine, file backend)."""

from __future__ import annotations

from typing import Any

import pulumi
import pytest

from ale_iac.contract import UNITS_OUTPUT
from ale_iac.engine import Engine
from ale_iac.profile import LINUX_DESKTOP_PATHS
from ale_iac.runner.gc import collect
from ale_iac.runner.registry import RunRegistry

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
    for name in ("run-orphan", "run-live", "run-kept", "sbx-mine", "pool-a"):
        engine.up(name, _units_program(None))
    live = RunRegistry("live-run", tmp_path)
    live.claim("run-live")
    kept = RunRegistry("kept-run", tmp_path)
    kept.claim("run-kept")
    kept.retain("run-kept")
    kept.close()

    dry = collect(engine, dry_run=True)
    assert dry.destroyed == ["run-orphan"] and len(engine.list_stacks()) == 5

    report = collect(engine)
    assert report.destroyed == ["run-orphan"]
    assert "live run live-run" in report.kept["run-live"]
    assert "retained by run kept-run" in report.kept["run-kept"]
    assert "not ephemeral" in report.kept["pool-a"] and "not ephemeral" in report.kept["sbx-mine"]
    assert sorted(s.name for s in engine.list_stacks()) == ["pool-a", "run-kept", "run-live", "sbx-mine"]

    assert collect(engine, sandboxes=True).destroyed == ["sbx-mine"]
    live.close()
    for name in ("run-live", "run-kept", "pool-a"):
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
