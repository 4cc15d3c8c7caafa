"""Template slots: ephemeral local units restored from a checkpoint another unit made (real CRIU).

The slots' own bookkeeping (leases, what gc removes) is tested without a sandbox; the units themselves with the
desktop image. What a hostile agent must not reach from inside a unit restored from a template is in
``tests/substrates/test_isolation.py`` (the ``local-template`` unit).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ale_iac import procs, profile
from ale_iac.contract import POOL_LABEL, UnitSpec
from ale_iac.images import ImageInfo
from ale_iac.substrates import registry
from ale_iac.substrates.local import checkpoint, templates
from ale_iac.substrates.local import runtime as local_runtime
from ale_iac.substrates.local import sandboxes as local_sandboxes
from ale_iac.substrates.local.sandboxes import LocalSandboxSpec, LocalSandboxState, SandboxError
from tests.support.lease_traces import LEASE_MARKS, lease_traces, leave_a_lease_behind
from tests.support.sandbox import assert_nothing_left, new_sandbox_id, run, wait_for_status

# --- the slots' bookkeeping (no sandbox) -----------------------------------------------------------------------


def _complete(slot: Path, rootfs: Path) -> None:
    (slot / checkpoint.CHECKPOINT_DIR).mkdir(parents=True)
    (slot / checkpoint.CHECKPOINT_DIR / checkpoint.META_FILE).write_text(json.dumps({"rootfs": str(rootfs)}))


def test_a_slot_is_leased_by_one_holder_at_a_time(tmp_path: Path) -> None:
    first = templates.lease(tmp_path, "k", slots=2)
    second = templates.lease(tmp_path, "k", slots=2)
    assert first is not None and second is not None
    assert (first.folder.name, second.folder.name) == ("0", "1")
    for slot in (first, second):  # a slot's range is its own, chosen by its path
        assert slot.uid_base == templates.slot_uid_base(slot.folder) >= local_sandboxes.UID_RANGE_START
    assert templates.lease(tmp_path, "k", slots=2) is None  # every slot taken
    os.close(first.lock_fd)  # what the kernel does when the holding supervisor dies, however it dies
    again = templates.lease(tmp_path, "k", slots=2)
    assert again is not None and again.folder == first.folder and again.uid_base == first.uid_base
    assert (tmp_path / "k").stat().st_mode & 0o077 == 0 and first.folder.stat().st_mode & 0o077 == 0
    for slot in (second, again):
        os.close(slot.lock_fd)


def test_gc_removes_the_slots_of_no_further_use_and_keeps_the_rest(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    root = tmp_path / "templates"
    held = [templates.lease(root, key, slots=1) for key in ("usable", "incomplete", "gone", "old", "leased")]
    assert all(held)
    slots = {slot.folder.parent.name: slot for slot in held if slot is not None}
    _complete(slots["usable"].folder, rootfs)
    _complete(slots["gone"].folder, tmp_path / "rebuilt-since")
    _complete(slots["old"].folder, rootfs)
    for name in ("usable", "incomplete", "gone", "old"):
        os.close(slots[name].lock_fd)
    week_ago = time.time() - templates.UNUSED_FOR_S - 60
    os.utime(slots["old"].folder / templates.LOCK_FILE, (week_ago, week_ago))
    found = templates.leftovers(root)
    assert [slot.parent.name for slot in found] == ["gone", "incomplete", "old"]  # not the usable one, nor the held
    for slot in found:
        templates.remove(slot)
    assert sorted(path.name for path in root.iterdir()) == ["leased", "usable"]  # empty templates removed too
    templates.remove(slots["leased"].folder)  # a slot a unit leased meanwhile is left alone
    assert slots["leased"].folder.is_dir()
    os.close(slots["leased"].lock_fd)


def test_gc_finds_the_local_substrates_leftover_slots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALE_IAC_HOME", str(tmp_path / "home"))
    slot = templates.lease(templates.templates_dir((tmp_path / "home").resolve()), "killed-maker", slots=1)
    assert slot is not None
    os.close(slot.lock_fd)  # its maker died before the checkpoint was complete
    (left,) = registry.get("local").leftovers()
    assert (left.kind, left.name) == ("folder", str(slot.folder))
    left.remove()
    assert not slot.folder.exists() and not slot.folder.parent.exists()


@pytest.mark.image
def test_a_checkpoint_route_gives_pool_units_their_own_and_the_others_a_template(desktop_image: ImageInfo) -> None:
    substrate = registry.get("local")
    document = {"name": "p", "snapshots": {"s": {"provider": "local", "checkpoint": True}}}
    route = profile.parse_profile(document, "test").profile.route("s")[1]
    assert isinstance(route, profile.LocalRoute)
    unit = UnitSpec(name="u0")
    pooled = substrate.inputs_for(unit, route, "pool-u0", {"stack": "pool", POOL_LABEL: "pool"})
    ephemeral = substrate.inputs_for(unit, route, "run-u0", {"stack": "run"})
    assert (pooled.model_dump()["checkpoint"], pooled.model_dump()["template"]) == (True, False)
    assert (ephemeral.model_dump()["checkpoint"], ephemeral.model_dump()["template"]) == (False, True)


# --- units restored from a template (real CRIU) ----------------------------------------------------------------


def _spec(desktop_image: ImageInfo, prefix: str) -> LocalSandboxSpec:
    return LocalSandboxSpec(
        sandbox_id=new_sandbox_id(prefix),
        rootfs=str(desktop_image.rootfs),
        memory_gb=1.0,
        checkpoint=True,
        template=True,
    )


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """An ale-iac home whose units are all stopped after the test, which must leave nothing of them."""
    folder = tmp_path / "home"
    yield folder
    for state in local_sandboxes.list_sandboxes(home=folder):
        pids = local_sandboxes.sandbox_pids(state)
        local_runtime.stop(state.sandbox_id, home=folder)
        assert_nothing_left(state, pids)


def _supervisor_log(state: LocalSandboxState) -> str:
    return (Path(state.state_dir) / local_sandboxes.LOGS_DIR / local_sandboxes.SUPERVISOR_LOG).read_text()


def _start(desktop_image: ImageInfo, home: Path) -> LocalSandboxState:
    """A unit from a template, once it serves: ``start`` returns while its supervisor restores it (the state it
    returns has the endpoint and no processes yet), so its state is read again once it answers."""
    started = local_runtime.start(_spec(desktop_image, "tpl"), home=home)
    assert started.init_pid is None and started.endpoint
    wait_for_status(started)
    state = local_sandboxes.load_state(started.sandbox_id, home=home)
    # Not its phase: the supervisor records "running" just after it serves, so an answer can come first.
    assert state is not None and state.init_pid is not None and state.endpoint == started.endpoint
    return state


def _template_of(home: Path) -> Path:
    (template,) = list(templates.templates_dir(home).iterdir())
    return template


@pytest.mark.criu
def test_units_one_after_another_restore_the_template_with_nothing_of_the_one_before(
    desktop_image: ImageInfo, home: Path
) -> None:
    first = _start(desktop_image, home)
    assert first.restored  # it booted, made the slot's checkpoint, and runs a restore of it
    slot = _template_of(home) / "0"
    assert (slot / checkpoint.CHECKPOINT_DIR / checkpoint.META_FILE).is_file()
    assert first.uid_base == templates.slot_uid_base(slot)
    assert run(first, "hostname")["stdout"] == f"{first.sandbox_id}\n"
    leave_a_lease_behind(first)
    assert lease_traces(first) == [*LEASE_MARKS, "process", "clipboard"]
    first_pids, first_token = local_sandboxes.sandbox_pids(first), local_sandboxes.auth_token(first)
    local_runtime.stop(first.sandbox_id, home=home)
    assert_nothing_left(first, first_pids)

    second = _start(desktop_image, home)
    assert second.restored and second.uid_base == first.uid_base  # the same slot, its range
    assert f"slot {slot}" in _supervisor_log(second) and "checkpoint:" not in _supervisor_log(second)
    assert local_sandboxes.auth_token(second) != first_token
    # Its own name, not the name of the unit that was dumped; nothing the first unit's agent left.
    assert run(second, "hostname")["stdout"] == f"{second.sandbox_id}\n"
    assert lease_traces(second) == []
    assert run(second, "cat /proc/1/cmdline | tr '\\0' ' '")["stdout"].startswith("/usr/bin/python3 ")
    assert second.init_pid is not None and Path(f"/proc/{second.init_pid}/cgroup").read_text().count(
        second.sandbox_id
    ) == len(second.cgroups)


@pytest.mark.criu
def test_units_alive_at_once_hold_slots_of_their_own_and_boot_when_none_is_free(
    desktop_image: ImageInfo, home: Path
) -> None:
    first = _start(desktop_image, home)
    second = _start(desktop_image, home)
    template = _template_of(home)
    assert first.restored and second.restored
    assert (first.uid_base, second.uid_base) == tuple(templates.slot_uid_base(template / str(n)) for n in (0, 1))
    for state in (first, second):
        assert run(state, "hostname")["stdout"] == f"{state.sandbox_id}\n"
    # Every slot taken (the test holds the rest): the next unit boots, with its own id's range and its endpoint.
    held = [templates.lease(templates.templates_dir(home), template.name) for _ in range(templates.MAX_SLOTS - 2)]
    assert all(held) and templates.lease(templates.templates_dir(home), template.name) is None
    try:
        third = local_runtime.start(_spec(desktop_image, "tpl"), home=home)  # booted: returns once it is running
        assert third.phase == "running" and not third.restored
        assert third.uid_base == local_sandboxes.uid_base_of(third.sandbox_id)
        assert f"all {templates.MAX_SLOTS} slots are in use; this unit boots" in _supervisor_log(third)
        wait_for_status(third)
        assert run(third, "hostname")["stdout"] == f"{third.sandbox_id}\n"
    finally:
        for slot in held:
            assert slot is not None
            os.close(slot.lock_fd)
    assert not (template / "2" / checkpoint.CHECKPOINT_DIR).exists()  # it made none


@pytest.mark.criu
def test_a_template_that_does_not_restore_costs_one_boot(desktop_image: ImageInfo, home: Path) -> None:
    made = _start(desktop_image, home)
    local_runtime.stop(made.sandbox_id, home=home)
    saved = _template_of(home) / "0" / checkpoint.CHECKPOINT_DIR
    (saved / checkpoint.IMAGES / "inventory.img").unlink()
    fresh = _start(desktop_image, home)
    assert fresh.restored and (saved / checkpoint.IMAGES / "inventory.img").is_file()  # the boot made a new one
    log = _supervisor_log(fresh)
    assert "[start] the template did not restore, so the unit boots afresh" in log
    assert "criu restore failed (1): Error" in log and "Unexpected EOF" in log
    assert run(fresh, "hostname; ls /root")["stdout"] == f"{fresh.sandbox_id}\n"
    local_runtime.stop(fresh.sandbox_id, home=home)
    assert _start(desktop_image, home).restored  # the new checkpoint restores
    assert "did not restore" not in _supervisor_log(local_sandboxes.list_sandboxes(home=home)[0])


def _left_in_range(state: LocalSandboxState) -> list[str]:
    """Live host processes that run as a uid of ``state``'s range and are not another unit's (every process of
    a unit is in that unit's cgroups, named after it): a task of ``state``'s whatever its command line says, also
    one no cgroup holds. Not zombies: a unit killed with its supervisor leaves its init to the host's init to
    reap (here, a second or two later), which runs nothing."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = dict(line.split(":", 1) for line in Path(f"/proc/{entry}/status").read_text().splitlines())
            cgroups = Path(f"/proc/{entry}/cgroup").read_text()
        except (OSError, ValueError):
            continue
        uid = int(fields["Uid"].split()[0])
        if not state.uid_base <= uid < state.uid_base + local_sandboxes.UID_COUNT:
            continue
        anothers = "/ale-iac-" in cgroups and f"/ale-iac-{state.sandbox_id}-" not in cgroups
        if not anothers and not fields["State"].strip().startswith("Z"):
            found.append(f"{entry} {fields['Name'].strip()} {fields['State'].strip()}")
    return found


@pytest.mark.criu
@pytest.mark.parametrize("how", ["stopped", "killed"])
def test_a_unit_stopped_while_it_restores_leaves_nothing(desktop_image: ImageInfo, home: Path, how: str) -> None:
    """``start`` returns before the restore: a destroy right after it (a run interrupted at once), or a supervisor
    killed then, meets CRIU midway. A stopped supervisor ends by itself, in order (a SIGTERM raised anywhere once
    left the logging lock held in the middle of the setup: the stop was lost and the supervisor hung until
    ``stop`` killed it). Nothing of the unit may stay: no process in the slot's uid range either."""
    made = _start(desktop_image, home)  # the slot's dump
    local_runtime.stop(made.sandbox_id, home=home)
    for _ in range(5):
        started = local_runtime.start(_spec(desktop_image, "tpl"), home=home)
        assert started.init_pid is None  # still restoring
        sig = signal.SIGKILL if how == "killed" else signal.SIGTERM
        os.kill(started.supervisor_pid, sig)
        if how == "stopped":  # what stop() sends first; it would kill a supervisor that did not end
            assert procs.wait_gone(started.supervisor_pid, started.supervisor_start_time, 60.0)
            assert "stop requested" in _supervisor_log(started)
        local_runtime.stop(started.sandbox_id, home=home)
        assert_nothing_left(started, [])
        assert not _left_in_range(started)
    assert _start(desktop_image, home).restored  # the slot is free and its dump intact


@pytest.mark.sandbox
def test_a_template_without_a_checkpoint_is_refused(desktop_image: ImageInfo, home: Path) -> None:
    spec = LocalSandboxSpec(sandbox_id="tpl-alone", rootfs=str(desktop_image.rootfs), template=True)
    with pytest.raises(SandboxError, match="a template is a checkpoint; it needs checkpoint: true"):
        local_runtime.start(spec, home=home)
    assert not (home / "sandboxes").exists() or list((home / "sandboxes").iterdir()) == []
