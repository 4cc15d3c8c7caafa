"""SandboxHandle: one unit of a stack as the runtime sees it, parsed from the stack's outputs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from ale_iac.contract import OsName, SandboxPaths, UnitOutputs

if TYPE_CHECKING:
    from ale_iac.sandbox.client import ComputerServerClient


class SandboxHandle(BaseModel):
    """Where a sandbox is and how its image is laid out. Immutable and JSON-serializable."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stack: str
    unit: str
    provider: str
    endpoint: str
    os: OsName
    snapshot: str
    image: str
    resource_id: str
    region: str | None = None
    paths: SandboxPaths
    labels: dict[str, str] = {}
    expires_at: str | None = None
    managed: bool = True

    @classmethod
    def from_outputs(cls, stack: str, outputs: UnitOutputs) -> SandboxHandle:
        return cls(stack=stack, **outputs.model_dump())

    @classmethod
    def for_endpoint(cls, endpoint: str, os: OsName = "linux") -> SandboxHandle:
        """A handle for a bare endpoint (``--endpoint URL``): no stack, default Linux paths."""
        from ale_iac.profile import LINUX_DESKTOP_PATHS

        return cls(
            stack="",
            unit="endpoint",
            provider="endpoint",
            endpoint=endpoint.rstrip("/"),
            os=os,
            snapshot="",
            image="",
            resource_id=endpoint,
            paths=LINUX_DESKTOP_PATHS,
            managed=False,
        )

    def client(self, timeout: float = 60.0) -> ComputerServerClient:
        from ale_iac.sandbox.client import ComputerServerClient

        return ComputerServerClient(self.endpoint, timeout=timeout)

    def summary(self) -> dict[str, Any]:
        return self.model_dump(mode="json")
