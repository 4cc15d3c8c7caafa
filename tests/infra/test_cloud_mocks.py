"""The recording mocks themselves: they must make a wrong program fail, not pass quietly."""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from typing import Any

import pulumi
import pytest

from ale_iac.contract import UnitSpec
from ale_iac.infra.mocks import DuplicateResourceError, RecordingMocks, run_program
from tests.support.cloud import aws_route, cloud_mocks, declare_units, gcloud_route, profile


@pytest.fixture(autouse=True)
def mocks() -> Iterator[RecordingMocks]:
    with cloud_mocks("mocks-test") as recording:
        yield recording


def test_mocks_raise_on_a_duplicate_resource_like_the_engine_under_mocks() -> None:
    prof = profile({"snap": gcloud_route()})

    @pulumi.runtime.test
    def declare_twice() -> pulumi.Output[Any]:
        first = declare_units(prof, [UnitSpec("u0", "snap")])
        second = declare_units(prof, [UnitSpec("u0", "snap")])  # same names again: a duplicate URN
        return pulumi.Output.all(first["u0"], second["u0"])

    # The failed registrations leave futures nobody awaits; asyncio reports them whenever they are
    # garbage-collected (maybe after this test). Drop exactly those reports, keep everything else.
    logging.getLogger("asyncio").addFilter(_DropDuplicateReports())
    with pytest.raises(DuplicateResourceError, match="duplicate resource ale-iac:gcloud:Unit 'u0'"):
        declare_twice()
    gc.collect()


class _DropDuplicateReports(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else record.__dict__.get("exception")
        return not isinstance(exc, DuplicateResourceError) and "DuplicateResourceError" not in record.getMessage()


def test_a_failing_check_inside_apply_fails_the_test_under_mocks() -> None:
    prof = profile({"snap": aws_route()})

    @pulumi.runtime.test
    def wrong_expectation() -> pulumi.Output[Any]:
        def check(handle: dict[str, Any]) -> None:
            assert handle["region"] == "mars-north-1"

        return declare_units(prof, [UnitSpec("u0", "snap")])["u0"].apply(check)

    with pytest.raises(AssertionError, match="mars-north-1"):
        wrong_expectation()


@pulumi.runtime.test
def test_mocks_run_in_update_mode_and_record_parents_under_mocks(mocks: RecordingMocks) -> pulumi.Output[Any]:
    assert pulumi.runtime.is_dry_run() is False  # preview=True would skip apply() on unknowns

    def check(_: Any) -> None:
        children = sorted(r.name for r in mocks.children_of("u0"))
        assert children == ["u0-server-0", "u0-sg", "u0-vm"]
        assert mocks.one("pulumi:providers:aws").parent is None

    return declare_units(profile({"snap": aws_route()}), [UnitSpec("u0", "snap")])["u0"].apply(check)


def test_run_program_returns_the_resolved_value_and_surfaces_errors() -> None:
    prof = profile({"snap": gcloud_route()})
    fresh = RecordingMocks()
    handles = run_program(lambda: pulumi.Output.from_input(declare_units(prof, [UnitSpec("u0", "snap")])), fresh)
    assert handles["u0"]["endpoint"].startswith("http://203.0.113.")
    assert len(fresh.resources) == 5  # the unit, its VM, the server rule, the egress walls (v4, v6)

    def broken() -> Any:
        return declare_units(prof, [UnitSpec("u0", "missing-snapshot")])

    with pytest.raises(Exception, match="no route for snapshot 'missing-snapshot'"):
        run_program(broken, RecordingMocks())
