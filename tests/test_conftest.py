"""The suite's own scheduling (``tests/conftest.py``): under ``--dist loadgroup`` a grouped test runs as part of
its group. pytest 9.2 silently broke pytest-xdist's grouping (it writes the group into the item's old ``_nodeid``,
which pytest no longer reads: pytest-xdist#1386): every group then split across the workers, and a module's
guest was booted once per worker. This test fails such a run, naming the cause. And the sweep of what an earlier
session left running (``tests/support/leftovers.py``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psutil
import pytest

from ale_iac.images import ImageInfo
from ale_iac.substrates.local import runtime as local_runtime
from ale_iac.substrates.local.sandboxes import LocalSandboxSpec
from tests.conftest import HEAVY_GROUPS, group_of, grouping, shuffled
from tests.support import leftovers
from tests.support.sandbox import new_sandbox_id


@pytest.mark.xdist_group("suite-scheduling")
def test_a_grouped_test_runs_in_its_group(request: pytest.FixtureRequest) -> None:
    if not grouping(request.config):
        pytest.skip("not a --dist loadgroup run: nothing is grouped")
    assert request.node.nodeid.endswith("@suite-scheduling"), (
        f"--dist loadgroup does not group under pytest {pytest.__version__} (this test's id has no group: "
        f"{request.node.nodeid}): pytest-xdist#1386; pyproject.toml pins pytest below 9.2"
    )


def test_the_heavy_groups_are_collected_first(request: pytest.FixtureRequest) -> None:
    if not grouping(request.config):
        pytest.skip("not a --dist loadgroup run: collection keeps its order")
    if shuffled(request.config):
        pytest.skip("a shuffled run (pytest-random-order): its order is the point")
    ranks = [
        HEAVY_GROUPS.index(group) if (group := group_of(item)) in HEAVY_GROUPS else len(HEAVY_GROUPS)
        for item in request.session.items
    ]
    assert ranks == sorted(ranks)


def test_each_test_is_in_one_group_at_most_and_its_id_says_which(request: pytest.FixtureRequest) -> None:
    """xdist joins every group mark a test has into a group of their own (a module's ``real-cli-agents`` and a
    case's ``qemu`` made ``qemu_real-cli-agents``, which ran beside the qemu group: two TCG guests at once)."""
    several = {
        item.nodeid: names
        for item in request.session.items
        if len(names := {str(m.args[0] if m.args else m.kwargs.get("name")) for m in item.iter_markers("xdist_group")})
        > 1
    }
    assert several == {}, "tests in more than one xdist group (put the group on each case instead)"
    if grouping(request.config):
        for item in request.session.items:
            group = group_of(item)
            assert item.nodeid.endswith(f"@{group}") if group else "@" not in item.nodeid, item.nodeid


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def _session(root: Path, number: int, lock_pid: int | None) -> Path:
    folder = root / f"pytest-{number}"
    folder.mkdir(parents=True)
    if lock_pid is not None:
        (folder / ".lock").write_text(str(lock_pid))
    return folder


@pytest.fixture(scope="module")
def module_home() -> str:
    """The ale-iac home a module-scoped fixture sees (it is set up before the test's own home)."""
    return os.environ["ALE_IAC_HOME"]


def test_a_module_fixture_s_home_is_the_session_s_not_the_user_s(
    module_home: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    home = Path(module_home)
    assert home.is_relative_to(tmp_path_factory.getbasetemp()), f"{home} is outside pytest's folders"
    assert home.name.startswith("ale-home-session")
    assert os.environ["ALE_IAC_HOME"] != module_home  # the test's own home still comes on top
    # Where the next session's sweep looks for a killed session's units:
    assert any(home.match(f"pytest-*/{depth}") for depth in leftovers.HOME_DEPTHS)


def test_only_the_homes_of_sessions_that_ended_are_collected(tmp_path: Path) -> None:
    live = _session(tmp_path, 1, os.getpid())
    dead = _session(tmp_path, 2, _dead_pid())
    ended = _session(tmp_path, 3, None)  # a normal exit removes the lock
    for session in (live, dead, ended):
        (session / "popen-gw0" / "ale-home0" / "sandboxes" / "sbx-a").mkdir(parents=True)
        (session / "popen-gw1" / "ale-home3" / "qemu").mkdir(parents=True)  # no unit in it
    (dead / "sandbox-home0" / "qemu" / "sbx-b").mkdir(parents=True)
    collected: list[Path] = []

    def collect(home: Path) -> str:
        collected.append(home)
        return "ok"

    swept = leftovers.sweep_earlier_sessions(tmp_path, collect=collect)
    assert (
        sorted(collected)
        == sorted(swept)
        == [
            dead / "popen-gw0" / "ale-home0",
            dead / "sandbox-home0",
            ended / "popen-gw0" / "ale-home0",
        ]
    )


@pytest.mark.sandbox
def test_a_killed_session_s_sandbox_is_stopped_by_the_next_session(desktop_image: ImageInfo, tmp_path: Path) -> None:
    """A real sandbox in the home of a session whose pytest died: the next session's sweep stops it with
    ``ale-iac gc`` and its folder goes."""
    home = _session(tmp_path, 5, _dead_pid()) / "popen-gw1" / "ale-home7"
    spec = LocalSandboxSpec(sandbox_id=new_sandbox_id("left"), rootfs=str(desktop_image.rootfs))
    state = local_runtime.start(spec, home=home)
    try:
        assert psutil.pid_exists(state.supervisor_pid)
        swept = leftovers.sweep_earlier_sessions(tmp_path)
        assert list(swept) == [home]
        assert f"stopped orphaned sandbox {state.sandbox_id}" in swept[home], swept
        assert not (home / "sandboxes" / state.sandbox_id).exists()
        assert not psutil.pid_exists(state.supervisor_pid) or psutil.Process(state.supervisor_pid).status() == (
            psutil.STATUS_ZOMBIE
        )
    finally:
        local_runtime.stop(state.sandbox_id, home=home)
