"""``computer_server_endpoint``: the base URL of a real computer-server, for the client and bridge tests.

It is the session's ``local`` sandbox (``local_sandbox`` from ``tests/sandbox_fixtures.py``). Set
``ALE_IAC_TEST_ENDPOINT`` to run the same tests against a computer-server you already have (another
substrate's sandbox, a static endpoint); it must be a disposable desktop: the tests open windows, type,
and write under /tmp.
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def computer_server_endpoint(request: pytest.FixtureRequest) -> str:
    explicit = os.environ.get("ALE_IAC_TEST_ENDPOINT")
    if explicit:
        return explicit.rstrip("/")
    return str(request.getfixturevalue("local_sandbox").endpoint)
