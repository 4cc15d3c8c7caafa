"""The ``sandbox`` executor refuses, before anything starts, a unit without the model channel an in-sandbox agent
reaches its model through: naming the substrate and the capability, or the unit, its provider and the channel
its outputs lack (a remote unit has it when its endpoint is an ale-iac forwarder)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ale_iac.agent_sdk import AgentConfig
from ale_iac.contract import LINUX_DESKTOP_PATHS, forwarder_channel
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


def test_a_unit_whose_endpoint_is_no_forwarder_is_refused_naming_it_its_provider_and_the_channel(
    tmp_path: Path,
) -> None:
    for provider in ("gcloud", "static"):
        with pytest.raises(AleIacError) as refused:
            _executor(_handle(provider, managed=provider != "static"), tmp_path).model_access()
        message = str(refused.value)
        assert message.startswith(f"unit u0 runs on {provider}, whose endpoint is no ale-iac forwarder"), message
        assert "it has no host channel" in message and "run the agent with executor: docker or local" in message


def test_a_remote_unit_whose_outputs_carry_the_channel_has_it(tmp_path: Path) -> None:
    """A cloud VM of ale-iac's disk, a static endpoint declared a forwarder: the channel is the unit's, whatever its
    provider (the executor then asks for the unit's model grant)."""
    for provider in ("gcloud", "static"):
        handle = _handle(provider).model_copy(update={"gateway_channel": forwarder_channel()})
        assert registry.require_channel(handle) == forwarder_channel()
        with pytest.raises(AleIacError, match="has no model: set `model` in its preset"):
            _executor(handle, tmp_path).model_access()
