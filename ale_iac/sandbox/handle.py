"""SandboxHandle: one unit of a stack as the runtime sees it, parsed from the stack's outputs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from ale_iac.contract import OsName, UnitOutputs

if TYPE_CHECKING:
    from ale_iac.sandbox.client import ComputerServerClient


class SandboxHandle(UnitOutputs):
    """Where a sandbox is and how its image is laid out: a unit's outputs plus the stack it is in.
    Immutable and JSON-serializable (the token is written as '**********')."""

    stack: str

    @classmethod
    def from_outputs(cls, stack: str, outputs: UnitOutputs) -> SandboxHandle:
        return cls(stack=stack, **outputs.model_dump())

    @classmethod
    def for_endpoint(cls, endpoint: str, os: OsName = "linux", token: str | None = None) -> SandboxHandle:
        """A handle for a bare endpoint (``--endpoint URL``): no stack, default Linux paths."""
        from ale_iac.contract import LINUX_DESKTOP_PATHS

        return cls(
            stack="",
            unit="endpoint",
            provider="endpoint",
            endpoint=endpoint.rstrip("/"),
            endpoint_token=SecretStr(token) if token else None,
            os=os,
            snapshot="",
            image="",
            resource_id=endpoint,
            paths=LINUX_DESKTOP_PATHS,
            managed=False,
        )

    def client(self, timeout: float = 60.0) -> ComputerServerClient:
        from ale_iac.sandbox.client import ComputerServerClient

        return ComputerServerClient(self.endpoint, timeout=timeout, token=self.token())

    def summary(self) -> dict[str, Any]:
        return self.model_dump(mode="json")
