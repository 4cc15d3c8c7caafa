"""Pytest plugin: real ``local`` sandboxes (bubblewrap + the computer-server) and the endpoint tests talk to.

Loaded by ``tests/conftest.py`` (``pytest_plugins = ["tests.support.fixtures"]``).

* ``desktop_image`` (session): the built ``desktop`` image (``scripts/setup.sh`` builds it).
* ``local_sandbox`` (session): one running sandbox whose ``/status`` answers; stopped at the end.
  It lives in its own ale-iac home, so the per-test ``ALE_IAC_HOME`` of ``tests/conftest.py`` does not
  hide it; use ``sandbox_home(state)`` (``tests/support/sandbox.py``) to address it.
* ``sandbox_factory`` (function): ``make(**spec_fields)`` starts more sandboxes (in the test's
  ale-iac home) and waits until they answer; all are stopped at teardown, pass or fail.
* ``docker_engine`` (session): a Docker engine that answers (the ``docker`` precondition starts it with
  scripts/dockerd.sh where none runs; tests/conftest.py stops it when the session ends if the session started
  it). ``docker_image`` (session): the desktop image in it.
* ``computer_server_endpoint`` (session): a real computer-server (URL and token) for the client and
  bridge tests: the session's ``local_sandbox``, or the one ``ALE_IAC_TEST_ENDPOINT`` names (and
  ``ALE_IAC_ENDPOINT_TOKEN`` if it needs one): another substrate's sandbox, a static endpoint. It must be
  a disposable desktop: the tests open windows, type, and write under /tmp.

Tests using them carry ``@pytest.mark.sandbox`` (``image`` for ``desktop_image`` alone); the hook in
``tests/conftest.py`` skips them, or fails them in CI, where the host cannot run them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from ale_iac.contract import ENDPOINT_TOKEN_ENV
from ale_iac.images import ImageInfo, require_image
from ale_iac.substrates.local import runtime as local_runtime
from ale_iac.substrates.local.sandboxes import LocalSandboxSpec, LocalSandboxState
from tests.support import preconditions
from tests.support.sandbox import Endpoint, SandboxFactory, new_sandbox_id, sandbox_home, wait_for_status

TEST_ENDPOINT_ENV = "ALE_IAC_TEST_ENDPOINT"


@pytest.fixture(scope="session")
def desktop_image() -> ImageInfo:
    """The desktop image of the current recipe (the ``image`` precondition: built beforehand)."""
    return require_image("desktop")


@pytest.fixture(scope="session")
def local_sandbox(desktop_image: ImageInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSandboxState]:
    home = tmp_path_factory.mktemp("sandbox-home")
    spec = LocalSandboxSpec(
        sandbox_id=new_sandbox_id("session"),
        rootfs=str(desktop_image.rootfs),
        labels={"purpose": "pytest-session"},
    )
    state = local_runtime.start(spec, home=home)
    try:
        wait_for_status(state)
        yield state
    finally:
        local_runtime.stop(state.sandbox_id, home=home)


@pytest.fixture
def sandbox_factory(desktop_image: ImageInfo) -> Iterator[SandboxFactory]:
    """``make(wait=True, **spec_fields)``: start a sandbox from the desktop image."""
    started: list[LocalSandboxState] = []

    def make(wait: bool = True, **fields: Any) -> LocalSandboxState:
        fields.setdefault("sandbox_id", new_sandbox_id())
        fields.setdefault("rootfs", str(desktop_image.rootfs))
        state = local_runtime.start(LocalSandboxSpec(**fields))
        started.append(state)
        if wait:
            wait_for_status(state)
        return state

    try:
        yield make
    finally:
        errors = []
        for state in started:
            try:
                local_runtime.stop(state.sandbox_id, home=sandbox_home(state))
            except Exception as exc:  # keep stopping the others
                errors.append(f"{state.sandbox_id}: {exc}")
        if errors:
            raise AssertionError("sandbox teardown failed: " + "; ".join(errors))


@pytest.fixture(scope="session")
def computer_server_endpoint(request: pytest.FixtureRequest) -> Endpoint:
    explicit = os.environ.get(TEST_ENDPOINT_ENV)
    if explicit:
        return Endpoint(explicit.rstrip("/"), os.environ.get(ENDPOINT_TOKEN_ENV) or None)
    return Endpoint.of(request.getfixturevalue("local_sandbox"))


@pytest.fixture(scope="session")
def docker_engine() -> None:
    """A Docker engine that answers. The ``docker`` precondition (checked before any fixture) starts one where
    none runs; this fixture is for tests that need the engine without the marker's image."""
    why = preconditions.CHECKS["docker"]()
    if why is not None:
        pytest.fail(why, pytrace=False)


@pytest.fixture(scope="session")
def docker_image(docker_engine: None) -> str:
    """The desktop image in the engine (imported from the built rootfs once); its tag."""
    from ale_iac.images import ensure_docker_image

    return ensure_docker_image("desktop", log=lambda line: print(line, file=sys.stderr))
