"""The suite's own scheduling (``tests/conftest.py``): under ``--dist loadgroup`` a grouped test runs as part of
its group. pytest 9.2 silently broke pytest-xdist's grouping (it writes the group into the item's old ``_nodeid``,
which pytest no longer reads: pytest-xdist#1386): every group then split across the workers, and a module's
guest was booted once per worker. This test fails such a run, naming the cause."""

from __future__ import annotations

import pytest

from tests.conftest import HEAVY_GROUPS, group_of, grouping, shuffled


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
