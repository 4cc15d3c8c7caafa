"""The ``sandbox`` executor refuses, before anything starts, a unit whose substrate lacks the model channel an
in-sandbox agent reaches its model through: naming the substrate and the capability."""

from __future__ import annotations

from pathlib import Path

import pytest

from ale_iac.agent_sdk import AgentConfig
from ale_iac.contract import LINUX_DESKTOP_PATHS
from ale_iac.errors import AleIacError
from ale_iac.executors.sandbox import SandboxExecutor
from ale_iac.runner.records import Redactor
from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.substrates import registry
from ale_iac.substrates.base import Capability, MissingCapabilityError


def _handle(provider: str, managed: bool = True) -> SandboxHandle:
    return SandboxHandle(
        stack="s",
        unit="u0",
        provider=provider,
        endpoint="http://127.0.0.1:1",
        snapshot="desktop",
        image="desktop",
        resource_id="s-u0-abcdef",
        paths=LINUX_DESKTOP_PATHS,
        managed=managed,
    )


def _executor(handle: SandboxHandle, tmp_path: Path) -> SandboxExecutor:
    config = AgentConfig.model_validate({"name": "a", "deployer": "tests.support.agents:WriterAgent"})
    return SandboxExecutor(config=config, sandbox=handle, work_dir=tmp_path, env={}, redact=Redactor())


@pytest.mark.parametrize("provider", registry.names())
def test_a_substrate_without_a_host_channel_is_named_with_the_capability(
    provider: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every registered substrate has the channel today; one that lacked it (a new one, say) is refused so."""
    substrate = registry.get(provider)
    monkeypatch.setattr(type(substrate), "capabilities", substrate.capabilities - {Capability.HOST_CHANNEL})
    with pytest.raises(MissingCapabilityError) as refused:
        _executor(_handle(provider), tmp_path).model_access()
    message = str(refused.value)
    assert message.startswith(f"the {provider} substrate does not provide host channel")
    assert "run the agent with executor: docker or local" in message


def test_a_cloud_unit_is_refused_as_no_host_substrate(tmp_path: Path) -> None:
    with pytest.raises(AleIacError, match="unit u0 runs on gcloud, which is no host substrate: it has no host channel"):
        _executor(_handle("gcloud", managed=False), tmp_path).model_access()
