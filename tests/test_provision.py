"""What ``provision.ensure_images`` builds before provisioning: exactly the images a profile's host routes
need (the qemu artifacts only for qemu routes), with their progress on the caller's log. And ``UpAhead``, a
unit's ``up`` started ahead of its turn (real engine, real local units)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ale_iac import image_build, procs
from ale_iac.contract import UnitSpec
from ale_iac.engine import Engine
from ale_iac.errors import AleIacError
from ale_iac.profile import load_profile_file, resolve_profile
from ale_iac.provision import UNIT_NAME, UpAhead, destroy_stack, ensure_images, new_stack_name
from ale_iac.sandbox.readiness import wait_ready
from ale_iac.substrates.local import sandboxes as local_sandboxes
from ale_iac.substrates.qemu import disk
from tests.support.engine import pulumi_clis


def _profile(tmp_path: Path, routes: str) -> Path:
    path = tmp_path / "Pulumi.p.yaml"
    path.write_text(f"config:\n  ale-iac:profile:\n    name: p\n    snapshots:\n{routes}")
    return path


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What ensure_images asked the image cache for (recorded instead of built: the builds are tested in
    tests/test_images.py)."""
    asked: list[str] = []

    def build(name: str, **kwargs: object) -> None:
        asked.append(f"rootfs:{name}")
        log = kwargs.get("log")
        if callable(log):
            log(f"building {name}")

    monkeypatch.setattr(image_build, "build_image", build)
    monkeypatch.setattr(disk, "ensure_export", lambda name, _log: asked.append(f"qcow2:{name}"))
    return asked


def test_a_local_profile_makes_no_qemu_artifact(tmp_path: Path, made: list[str]) -> None:
    lines: list[str] = []
    profile = load_profile_file(_profile(tmp_path, "      default:\n        provider: local\n")).profile
    ensure_images(profile, log=lines.append)
    assert made == ["rootfs:desktop"]
    assert lines == ["building desktop"]


def test_a_qemu_profile_makes_its_qcow2_and_its_runner_image_on_first_need(tmp_path: Path, made: list[str]) -> None:
    routes = (
        "      a:\n        provider: qemu\n"
        "      b:\n        provider: qemu\n        runner: container\n"
        "      c:\n        provider: docker\n"
    )
    ensure_images(load_profile_file(_profile(tmp_path, routes)).profile)
    assert made == ["rootfs:desktop", "qcow2:desktop", "rootfs:qemu-runner"]


def test_a_static_profile_builds_nothing(tmp_path: Path, made: list[str]) -> None:
    routes = "      default:\n        provider: static\n        endpoints: [http://127.0.0.1:1/]\n"
    ensure_images(load_profile_file(_profile(tmp_path, routes)).profile)
    assert made == []


# -- UpAhead: a unit's ``up`` started before its turn, held in its program ------------------------------------


def _held(engine: Engine, stack: str, decisions: list[bool] | None = None) -> UpAhead:
    """An ``UpAhead`` of a local unit, once its program waits for the unit's turn (the CLI holds the stack's lock
    and has started the program): nothing is made yet. ``decisions``: what the program's wait returns, once."""
    engine.init(stack)
    waiting = threading.Event()
    plain = UpAhead._wait

    def wait(self: UpAhead) -> bool:
        waiting.set()
        decision = plain(self)
        if decisions is not None:
            decisions.append(decision)
        return decision

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(UpAhead, "_wait", wait)
        up_ahead = UpAhead(engine, resolve_profile("local").profile, stack, UnitSpec(name=UNIT_NAME))
        assert waiting.wait(60), "the program never ran"
    assert engine.is_locked(stack)
    assert local_sandboxes.list_sandboxes() == []
    return up_ahead


def _soon(condition: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


@pytest.mark.engine
@pytest.mark.sandbox
def test_a_held_up_makes_the_unit_on_its_turn_and_nothing_before() -> None:
    engine = Engine()
    stack = new_stack_name("run", "held")
    up_ahead = _held(engine, stack)
    [cli] = pulumi_clis(stack)  # one CLI, the up's, waiting
    handle = up_ahead.go()
    try:
        assert not procs.is_running(cli, None) and not engine.is_locked(stack)
        assert handle.stack == stack and handle.unit == UNIT_NAME
        assert [unit.endpoint for unit in engine.units(stack).values()] == [handle.endpoint]
        asyncio.run(wait_ready(handle, 60))
        [sandbox] = local_sandboxes.list_sandboxes()
        assert sandbox.sandbox_id == handle.resource_id
    finally:
        destroy_stack(engine, stack)
    assert engine.list_stacks() == [] and local_sandboxes.list_sandboxes() == []


@pytest.mark.engine
@pytest.mark.sandbox
def test_a_dropped_up_declares_nothing() -> None:
    engine = Engine()
    stack = new_stack_name("run", "dropped")
    decisions: list[bool] = []
    up_ahead = _held(engine, stack, decisions)
    up_ahead.drop()
    assert decisions == [False]
    assert pulumi_clis(stack) == [] and not engine.is_locked(stack)
    assert engine.outputs(stack) == {} and local_sandboxes.list_sandboxes() == []
    assert destroy_stack(engine, stack)
    assert engine.list_stacks() == []


@pytest.mark.engine
@pytest.mark.sandbox
def test_a_held_up_whose_cli_dies_fails_on_its_turn_and_leaves_no_stack() -> None:
    """The CLI killed while it waits (as the OOM killer or a user would): the update ends, its program stops
    waiting (no thread is left blocked), and the unit's turn gets the engine's error; the stack is removed."""
    engine = Engine()
    stack = new_stack_name("run", "killed")
    decisions: list[bool] = []
    up_ahead = _held(engine, stack, decisions)
    [cli] = pulumi_clis(stack)
    os.kill(cli, signal.SIGKILL)
    up_ahead._thread.join(60)
    assert not up_ahead._thread.is_alive()
    _soon(lambda: bool(decisions))  # the program's thread wakes up after the update's end
    assert decisions == [False]  # the program stopped waiting, and declares nothing
    with pytest.raises(AleIacError, match=stack):
        up_ahead.go()
    assert engine.list_stacks() == [] and local_sandboxes.list_sandboxes() == []
