"""Shared test setup.

* Every test gets its own ale-iac home (state backend, logs, sandboxes), so tests never see the
  user's stacks or each other's; what module- and session-scoped fixtures make goes to a home of the session.
* The repo root is put on PYTHONPATH for child processes: dynamic providers defined in test support
  modules (``tests/support/engine.py``) are pickled by reference, and the provider process Pulumi
  starts must be able to import them.
* Precondition markers (``needs_root``, ``image``, ``engine``, ``sandbox``, ``docker``; see pyproject.toml and
  ``tests/support/preconditions.py``): a test whose precondition this host lacks is skipped with the
  reason, or fails when ``CI=true``. Tests with none of them get the ``fast`` marker: ``pytest -m fast``
  is the fast lane.
* Fixtures that start real sandboxes: ``tests/support/fixtures.py``. The rootless tests' normal user
  (``rootless_user``, ``tests/support/rootless.py``): one per worker session, shared by every module.
* Units an earlier session left running (killed before its teardown) are collected at the start of the next
  (``tests/support/leftovers.py``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import leftovers, preconditions

REPO = Path(__file__).resolve().parent.parent

pytest_plugins = ["tests.support.fixtures", "tests.support.rootless", "tests.support.kube"]


HEAVY_GROUPS = ("qemu", "kubernetes", "real-cli-agents", "ale-claw", "evaluate-runs", "gc-crashes")
"""``xdist_group`` names, the longest first (``--durations=0`` of a whole run): their tests are collected first, so
that ``--dist loadgroup`` hands each to a worker at the start and the short tests fill in around them, instead of
the longest group starting wherever its first file falls and ending the run alone. Other groups follow these,
then the tests of no group, each in collection order."""


def group_of(item: pytest.Item) -> str | None:
    """The test's xdist group as ``--dist loadgroup`` makes it: every ``xdist_group`` mark it has (its module's,
    its class's, its own, its parameter's), their names sorted and joined with ``_`` (``xdist/remote.py``)."""
    names = {
        str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
        for mark in item.iter_markers("xdist_group")
    }
    return "_".join(sorted(names)) if names else None


def grouping(config: pytest.Config) -> bool:
    """Whether this run hands out tests by group: ``--dist loadgroup`` (on an xdist worker, where ``dist`` reads
    ``no``, the ``loadgroup`` flag it sets instead)."""
    return bool(config.getoption("loadgroup", False)) or config.getoption("dist", "no") == "loadgroup"


def shuffled(config: pytest.Config) -> bool:
    """Whether pytest-random-order reorders this run (``--random-order``, a bucket or a seed given, as the plugin
    itself decides): then the order it makes is the point, and the heavy groups are not put first."""
    if not config.pluginmanager.hasplugin("random_order"):
        return False
    given = (str(config.getoption(name, "default:")) for name in ("random_order_bucket", "random_order_seed"))
    return bool(config.getoption("random_order_enabled", False)) or any(not v.startswith("default:") for v in given)


def _schedule_rank(item: pytest.Item) -> int:
    group = group_of(item)
    if group is None:
        return len(HEAVY_GROUPS) + 1
    return HEAVY_GROUPS.index(group) if group in HEAVY_GROUPS else len(HEAVY_GROUPS)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Before pytest makes this session's temporary folder (and deletes the oldest): the units an earlier
    session left running, collected with ``ale-iac gc`` while their records are still there
    (``tests/support/leftovers.py``). Once per run: on the xdist controller, or the one process."""
    config = session.config
    if hasattr(config, "workerinput"):
        return
    basetemp = config.getoption("basetemp", None)
    swept = leftovers.sweep_session(Path(basetemp)) if basetemp else leftovers.sweep_earlier_sessions()
    for home, report in swept.items():
        print(f"[tests] an earlier session left units in {home}; ale-iac gc: {report}", file=sys.stderr)
    config.stash[_DOCKER_WAS_UP] = preconditions.docker_engine_answers()


_DOCKER_WAS_UP = pytest.StashKey[bool]()
"""Whether ale-iac's Docker engine answered when the session started."""


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the Docker engine if this session started it (the ``docker`` precondition starts it where none runs,
    on whichever worker first needs it); one that ran before the session is left running. Once per run: on the
    xdist controller, after its workers have finished, or the one process."""
    config = session.config
    if hasattr(config, "workerinput") or config.stash.get(_DOCKER_WAS_UP, True):
        return
    if preconditions.docker_engine_answers():
        print(f"\n[tests] {preconditions.stop_docker_engine()} (this session started it)", file=sys.stderr)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # tryfirst: before the mark plugin deselects by ``-m``, so that ``-m fast`` sees the marker.
    for item in items:
        if not preconditions.markers_of(item):
            item.add_marker(pytest.mark.fast)


class _Scheduler:
    """The heavy groups first, sorted last of every ``pytest_collection_modifyitems``: pytest's own (its fixtures
    plugin) groups the tests of a module-scoped parameter together, which put four ungrouped tests among the
    ``kubernetes`` case of the isolation suite. The sort is stable, so that grouping holds within each rank."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if grouping(config) and not shuffled(config):
            items.sort(key=_schedule_rank)  # stable: the same order on every worker, as xdist requires


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_Scheduler(), "ale-iac-scheduler")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # tryfirst: before any fixture is set up (a session sandbox, say) for a test that cannot run.
    reasons = preconditions.missing(item)
    if not reasons:
        return
    if preconditions.in_ci():
        pytest.fail(
            "precondition missing in CI (a test that never runs tests nothing): " + "; ".join(reasons), pytrace=False
        )
    pytest.skip("; ".join(reasons))


@pytest.fixture(scope="session", autouse=True)
def _session_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The ale-iac home of what module- and session-scoped fixtures make, which are set up before a test's own
    home: without it their units and stacks went to the user's ``~/.ale-iac``, where a killed session left them
    for the user's ``gc`` to find. Here they are swept with the session's other homes
    (``tests/support/leftovers.py``)."""
    home = tmp_path_factory.mktemp("ale-home-session")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ALE_IAC_HOME", str(home))
        yield home


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("ale-home")
    monkeypatch.setenv("ALE_IAC_HOME", str(home))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.delenv("PULUMI_BACKEND_URL", raising=False)
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE", raising=False)
    yield home
