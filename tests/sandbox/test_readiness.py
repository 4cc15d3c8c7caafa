"""Readiness against a real sandbox that never gets ready: the error says why, from the sandbox's own logs."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import SecretStr

from ale_iac.contract import LINUX_DESKTOP_PATHS
from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.sandbox.readiness import SandboxNotReadyError, wait_ready
from ale_iac.substrates.local import sandboxes as local_sandboxes
from tests.support.sandbox import SandboxFactory

pytestmark = pytest.mark.sandbox


def test_a_sandbox_that_never_gets_ready_is_explained_by_its_logs(sandbox_factory: SandboxFactory) -> None:
    # sh given ale-init's options fails at once: the computer-server never starts.
    state = sandbox_factory(wait=False, init="/bin/sh")
    handle = SandboxHandle(
        stack="",
        unit="u0",
        provider="local",
        endpoint=state.endpoint,
        endpoint_token=SecretStr(local_sandboxes.auth_token(state)),
        snapshot="desktop",
        image="desktop",
        resource_id=state.sandbox_id,
        paths=LINUX_DESKTOP_PATHS,
    )
    with pytest.raises(SandboxNotReadyError) as info:
        asyncio.run(wait_ready(handle, 5))
    message = str(info.value)
    assert f"at {state.endpoint} was not ready after 5 s" in message
    assert "--- supervisor.log ---" in message and "--- init.log ---" in message
    assert "Illegal option" in message
