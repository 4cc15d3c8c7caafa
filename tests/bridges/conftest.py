"""The bridge sessions the bridge tests share: one ``ale-iac mcp vm`` and one ``ale-iac mcp cua`` per module.

Both talk to ``computer_server_endpoint`` (``tests/support/fixtures.py``); the client side is
``tests/support/bridges.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.bridges import Bridge, open_bridge
from tests.support.sandbox import Endpoint


@pytest.fixture(scope="module")
def vm_bridge(computer_server_endpoint: Endpoint, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bridge]:
    with open_bridge("vm", computer_server_endpoint, tmp_path_factory.mktemp("vm") / "stderr.log") as bridge:
        yield bridge


@pytest.fixture(scope="module")
def cua_bridge(computer_server_endpoint: Endpoint, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bridge]:
    with open_bridge("cua", computer_server_endpoint, tmp_path_factory.mktemp("cua") / "stderr.log") as bridge:
        yield bridge
