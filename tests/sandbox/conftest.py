"""``computer_server_endpoint``: a real computer-server (URL and token), for the client and bridge tests.

It is the session's ``local`` sandbox (``local_sandbox`` from ``tests/sandbox_fixtures.py``). Set
``ALE_IAC_TEST_ENDPOINT`` (and ``ALE_IAC_ENDPOINT_TOKEN`` if it needs one) to run the same tests
against a computer-server you already have (another substrate's sandbox, a static endpoint); it must
be a disposable desktop: the tests open windows, type, and write under /tmp.
"""

from __future__ import annotations

import os

import pytest

from ale_iac.contract import ENDPOINT_TOKEN_ENV
from tests.sandbox_fixtures import Endpoint


@pytest.fixture(scope="session")
def computer_server_endpoint(request: pytest.FixtureRequest) -> Endpoint:
    explicit = os.environ.get("ALE_IAC_TEST_ENDPOINT")
    if explicit:
        return Endpoint(explicit.rstrip("/"), os.environ.get(ENDPOINT_TOKEN_ENV) or None)
    return Endpoint.of(request.getfixturevalue("local_sandbox"))
