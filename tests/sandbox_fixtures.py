"""Pytest plugin: real ``local`` sandboxes (bubblewrap + slirp4netns + the computer-server).

Loaded by ``tests/conftest.py`` (``pytest_plugins = ["tests.sandbox_fixtures"]``).

* ``desktop_image`` (session): the ``desktop`` image, built once and then reused from the cache.
* ``local_sandbox`` (session): one running sandbox whose ``/status`` answers; stopped at the end.
  It lives in its own ale-iac home, so the per-test ``ALE_IAC_HOME`` of ``conftest.py`` does not
  hide it; use ``sandbox_home(state)`` to address it.
* ``sandbox_factory`` (function): ``make(**spec_fields)`` starts more sandboxes (in the test's
  ale-iac home) and waits until they answer; all are stopped at teardown, pass or fail.

Tests using them carry ``@pytest.mark.sandbox``.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from ale_iac.contract import ENDPOINT_TOKEN_ENV
from ale_iac.images import ImageInfo, build_image
from ale_iac.sandbox.client import ComputerServerClient
from ale_iac.substrates.local import runtime as local_runtime
from ale_iac.substrates.local.runtime import LocalSandboxSpec, LocalSandboxState

READY_TIMEOUT_S = 90.0
POLL_INTERVAL_S = 0.05
"""Pause between two /status probes: keeps the loop from spinning on the 2 cores the server needs."""


class SandboxNotReadyError(AssertionError):
    pass


@dataclass(frozen=True)
class Endpoint:
    """A computer-server URL and the bearer token it requires (None for one that needs none)."""

    url: str
    token: str | None = None

    @classmethod
    def of(cls, state: LocalSandboxState) -> Endpoint:
        return cls(state.endpoint, local_runtime.auth_token(state))

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def client(self, **kwargs: Any) -> ComputerServerClient:
        return ComputerServerClient(self.url, token=self.token, **kwargs)

    def bridge_env(self) -> dict[str, str]:
        """What a bridge process needs in its environment to reach this endpoint."""
        return {ENDPOINT_TOKEN_ENV: self.token} if self.token else {}


Target = Endpoint | LocalSandboxState


def endpoint_of(target: Target) -> Endpoint:
    return target if isinstance(target, Endpoint) else Endpoint.of(target)


def wait_for_status(target: Target, timeout: float = READY_TIMEOUT_S) -> float:
    """Poll ``GET /status`` until it answers 200; returns the seconds waited.

    Raises with the endpoint, the last error seen and the sandbox's own log tails once the
    monotonic deadline passes.
    """
    endpoint = endpoint_of(target)
    started = time.monotonic()
    deadline = started + timeout
    last_error = "no attempt"
    with httpx.Client(timeout=httpx.Timeout(2.0), headers=endpoint.headers) as client:
        while True:
            try:
                response = client.get(f"{endpoint.url}/status")
                if response.status_code == 200:
                    return time.monotonic() - started
                last_error = f"HTTP {response.status_code}: {response.text[:200]}"
            except httpx.HTTPError as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            if time.monotonic() >= deadline:
                tails = local_runtime.log_tails(target) if isinstance(target, LocalSandboxState) else ""
                raise SandboxNotReadyError(
                    f"{endpoint.url}/status did not answer within {timeout:.0f} s; last error: {last_error}\n{tails}"
                )
            time.sleep(POLL_INTERVAL_S)


def cmd(
    target: Target, name: str, params: dict[str, Any] | None = None, *, http_timeout: float = 60.0
) -> dict[str, Any]:
    """One ``POST /cmd``; returns the decoded ``data: {json}`` reply."""
    endpoint = endpoint_of(target)
    response = httpx.post(
        f"{endpoint.url}/cmd",
        json={"command": name, "params": params or {}},
        timeout=http_timeout,
        headers=endpoint.headers,
    )
    response.raise_for_status()
    body = response.text.strip()
    assert body.startswith("data: "), f"unexpected reply framing: {body[:200]!r}"
    reply: dict[str, Any] = json.loads(body[len("data: ") :])
    return reply


def run(target: Target, command: str, *, http_timeout: float = 60.0) -> dict[str, Any]:
    """``run_command`` in the sandbox; returns stdout, stderr, return_code."""
    reply = cmd(target, "run_command", {"command": command}, http_timeout=http_timeout)
    assert "return_code" in reply, reply
    return reply


def sandbox_home(state: LocalSandboxState) -> Path:
    """The ale-iac home a sandbox was started in (its state dir is ``<home>/sandboxes/<id>``)."""
    return Path(state.state_dir).parent.parent


def new_sandbox_id(prefix: str = "test") -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


@pytest.fixture(scope="session")
def desktop_image() -> ImageInfo:
    """The desktop image; the first session on a machine builds it (a few minutes)."""
    return build_image("desktop")


@pytest.fixture(scope="session")
def local_sandbox(
    desktop_image: ImageInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalSandboxState]:
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


SandboxFactory = Callable[..., LocalSandboxState]


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
