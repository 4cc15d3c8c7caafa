"""Shared bits of the cloud tests (gcloud, aws, aliyun), which all run under Pulumi mocks.

No cloud is reachable from the test machines and no provider plugin can be had, so every cloud
test runs the real declarations under :class:`ale_iac.infra.mocks.RecordingMocks` and asserts on
the inputs the engine would have received. Rules for honest mocks: they are installed
by an autouse fixture in each test module (never at import time), tests are sync
``@pulumi.runtime.test`` functions that return the Output their checks hang on, preview=False,
and the mocks raise on a duplicate (type, name).

Checks run inside ``apply`` on a unit's handle: the handle waits for all of the unit's resources
(firewalls, security groups, rules, the VM), so everything has been recorded by then.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from ale_iac.contract import UnitSpec
from ale_iac.infra.cloud_common import use_clock
from ale_iac.infra.declaration import declare
from ale_iac.infra.mocks import RecordingMocks, install
from ale_iac.profile import Profile, parse_profile

NOW = datetime(2026, 11, 30, 9, 41, 27, tzinfo=UTC)
"""Fixed deploy time of the tests; expiries are NOW (floored to the minute) + ttl."""

RUNNER = "198.51.100.0/24"
RUNNER_V6 = "2001:db8:1::/48"


def profile(routes: Mapping[str, Mapping[str, Any]], name: str = "test") -> Profile:
    return parse_profile({"name": name, "snapshots": dict(routes)}, "tests").profile


def gcloud_route(**overrides: Any) -> dict[str, Any]:
    route: dict[str, Any] = {
        "provider": "gcloud",
        "project": "proj-1",
        "zone": "europe-west4-b",
        "image": "projects/proj-1/global/images/family/ale-desktop",
        "allowed_source_ranges": [RUNNER],
    }
    route.update(overrides)
    return route


def aws_route(**overrides: Any) -> dict[str, Any]:
    route: dict[str, Any] = {
        "provider": "aws",
        "region": "eu-central-1",
        "image": "ami-0abc",
        "allowed_source_ranges": [RUNNER],
    }
    route.update(overrides)
    return route


def aliyun_route(**overrides: Any) -> dict[str, Any]:
    route: dict[str, Any] = {
        "provider": "aliyun",
        "region": "cn-shanghai",
        "vpc_id": "vpc-1",
        "vswitch_id": "vsw-1",
        "image": "m-desktop",
        "allowed_source_ranges": [RUNNER],
    }
    route.update(overrides)
    return route


@contextmanager
def cloud_mocks(stack: str) -> Iterator[RecordingMocks]:
    """For the autouse fixtures: fresh recording mocks (preview=False) and the fixed clock."""
    mocks = install(RecordingMocks(), project="ale-iac", stack=stack)
    with use_clock(lambda: NOW):
        yield mocks


def declare_units(prof: Profile, units: Sequence[UnitSpec], stack: str = "test") -> dict[str, Any]:
    return declare(prof, units, stack, export=False)
