"""Which reset a pool unit gets (restore, recreate, none), the cloud default under mocks, the recreate command,
where its program comes from, and one ``pulumi up`` for the recreations asked for while one runs."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulumi
import pytest

from ale_iac.contract import LINUX_DESKTOP_PATHS, UnitOutputs, UnitSpec
from ale_iac.errors import AleIacError
from ale_iac.infra.mocks import RecordingMocks
from ale_iac.runner import resets
from tests.support.cloud import aliyun_route, aws_route, cloud_mocks, declare_units, gcloud_route, profile


def _unit(provider: str = "local", **fields: Any) -> UnitOutputs:
    values: dict[str, Any] = {
        "unit": "u0",
        "provider": provider,
        "endpoint": "http://127.0.0.1:1",
        "snapshot": "s",
        "image": "desktop",
        "resource_id": "pool-u0-abcdef",
        "paths": LINUX_DESKTOP_PATHS,
    }
    values.update(fields)
    return UnitOutputs(**values)


def test_restore_is_the_kind_s_substrate_reset() -> None:
    for kind in ("local", "docker", "qemu"):
        assert resets.reset_of("pool", _unit(kind, reset="restore", managed=True)) is resets.restore
        # A stack made before units said how: the substrate's restore.
        assert resets.reset_of("pool", _unit(kind, managed=True)) is resets.restore
    assert resets.reset_of("pool", _unit("local", reset="none")) is None
    assert resets.reset_of("pool", _unit("static", managed=False)) is None
    assert resets.reset_of("pool", _unit("gcloud")) is None  # an old cloud stack: no URN to replace


def test_recreate_replaces_the_unit_s_urns_on_its_stack() -> None:
    reset = resets.reset_of("pool-x", _unit("local", reset="recreate", reset_urns=["urn:a"]))
    assert isinstance(reset, functools.partial) and reset.func is resets.recreate and reset.args == ("pool-x",)
    assert resets.replace_args("pool-x", ["urn:a", "urn:b"]) == [
        "up", "--yes", "--skip-preview", "--non-interactive", "--stack", "pool-x",
        "--replace", "urn:a", "--target", "urn:a", "--replace", "urn:b", "--target", "urn:b",
    ]  # fmt: skip
    with pytest.raises(AleIacError, match=r"names no resource to recreate .* run pulumi up -s pool-x once"):
        resets.recreate("pool-x", _unit("gcloud", reset="recreate"))


@pytest.fixture
def mocks() -> Iterator[RecordingMocks]:
    with cloud_mocks("pool-c") as recording:
        yield recording


@pytest.mark.parametrize(
    ("route", "vm"),
    [
        (gcloud_route(), "gcp:compute/instance:Instance"),
        (aws_route(), "aws:ec2/instance:Instance"),
        (aliyun_route(), "alicloud:ecs/instance:Instance"),
    ],
)
@pulumi.runtime.test  # type: ignore[untyped-decorator]
def test_a_cloud_pool_unit_is_recreated_by_default_under_mocks(
    mocks: RecordingMocks, route: dict[str, Any], vm: str
) -> pulumi.Output[Any]:
    handles = declare_units(profile({"snap": route}), [UnitSpec("u0", "snap", labels={"pool": "pool-c"})], "pool-c")

    def check(value: dict[str, Any]) -> None:
        unit = UnitOutputs.model_validate(value)
        [instance] = mocks.of_type(vm)
        # The VM only (its boot disk goes with it); the firewall rules hold nothing of a task and stay.
        assert unit.reset == "recreate" and len(unit.reset_urns) == 1
        [urn] = unit.reset_urns
        assert urn.startswith("urn:pulumi:pool-c::ale-iac::") and urn.endswith(f"${vm}::{instance.name}"), urn
        reset = resets.reset_of("pool-c", unit)
        assert isinstance(reset, functools.partial) and reset.func is resets.recreate
        assert resets.replace_args("pool-c", unit.reset_urns)[-4:] == ["--replace", urn, "--target", urn]

    return pulumi.Output.from_input(handles["u0"]).apply(check)


@pulumi.runtime.test  # type: ignore[untyped-decorator]
def test_a_cloud_route_may_lease_its_units_as_they_are_under_mocks(mocks: RecordingMocks) -> pulumi.Output[Any]:
    handles = declare_units(profile({"snap": gcloud_route(reset="none")}), [UnitSpec("u0", "snap")], "pool-c")

    def check(value: dict[str, Any]) -> None:
        unit = UnitOutputs.model_validate(value)
        assert unit.reset == "none" and resets.reset_of("pool-c", unit) is None

    return pulumi.Output.from_input(handles["u0"]).apply(check)


def _project(root: Path, stack: str) -> Path:
    (root / "stacks").mkdir(parents=True)
    (root / "Pulumi.yaml").write_text("name: ale-iac\n")
    (root / "stacks" / f"Pulumi.{stack}.yaml").write_text("config: {}\n")
    return root


def test_the_pool_s_program_is_the_project_that_has_its_stack_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = _project(tmp_path / "checkout", "my-pool")
    monkeypatch.chdir(project)
    assert resets.pool_project("my-pool") == project.resolve()
    # The source tree's own stacks/ is the fallback.
    assert resets.pool_project("local") == resets.project_root()
    with pytest.raises(AleIacError, match=r"no project has it: .* stacks/Pulumi\.other-pool\.yaml"):
        resets.pool_project("other-pool")


def test_recreations_asked_for_while_one_runs_go_into_the_next_up(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    first_running = threading.Event()
    release_first = threading.Event()

    def replace(stack: str, urns: list[str]) -> None:
        calls.append(urns)
        if len(calls) == 1:
            first_running.set()
            release_first.wait(10)
        if "urn:bad" in urns:
            raise AleIacError("the update failed")

    monkeypatch.setattr(resets, "replace", replace)
    recreator = resets._recreator("pool-b")
    errors: dict[str, BaseException] = {}

    def ask(unit: str, urn: str) -> None:
        try:
            recreator.submit(unit, [urn])
        except BaseException as exc:
            errors[unit] = exc

    first = threading.Thread(target=ask, args=("u0", "urn:0"))
    first.start()
    assert first_running.wait(10)
    later = [threading.Thread(target=ask, args=(f"u{i}", f"urn:{i}")) for i in (1, 2)]
    later.append(threading.Thread(target=ask, args=("u3", "urn:bad")))
    for thread in later:
        thread.start()
    deadline = time.monotonic() + 10
    while len(recreator.pending) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    release_first.set()
    for thread in [first, *later]:
        thread.join(10)
    assert calls == [["urn:0"], ["urn:1", "urn:2", "urn:bad"]]
    # One update for the three: its failure is each one's.
    assert sorted(errors) == ["u1", "u2", "u3"] and all("the update failed" in str(e) for e in errors.values())
    assert recreator.pending == {} and recreator.finished == {} and not recreator.running
