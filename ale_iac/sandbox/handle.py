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
        """The unit's handle. A unit reached through a Kubernetes port-forward (``outputs.port_forward``) gets the
        forward's local address as its endpoint, the forward opened here if this process has none to its pod."""
        data = outputs.model_dump()
        if outputs.port_forward is not None:
            from ale_iac.sandbox.portforward import local_endpoint

            data["endpoint"] = local_endpoint(outputs.port_forward)
        return cls(stack=stack, **data)

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

    def close_port_forward(self) -> None:
        """Close this process's port-forward to the unit's pod, if it opened one; for when this process is done
        with the unit. ``kubectl port-forward`` outlives the pod it leads to (it fails only the connections made
        after), so a forward left open keeps a kubectl process and a relay port until this process exits: one
        per unit of a run, without this."""
        if self.port_forward is not None:
            from ale_iac.sandbox.portforward import close

            close(self.port_forward)

    def client(self, timeout: float = 60.0) -> ComputerServerClient:
        """A client of the unit's computer-server whose commands see :meth:`command_env`."""
        from ale_iac.sandbox.client import ComputerServerClient

        return ComputerServerClient(self.endpoint, timeout=timeout, token=self.token(), env=self.command_env())

    def command_env(self) -> dict[str, str]:
        """What every command started in the unit through its computer-server sees (a task's hooks, the sandbox
        executor's agent and what it starts): with an egress policy, the proxy variables that lead to the unit's
        proxy (:data:`~ale_iac.substrates.egress.PROXY_ENV`); nothing otherwise (and nothing on Windows)."""
        if self.egress is None or self.os != "linux":
            return {}
        from ale_iac.substrates.egress import PROXY_ENV

        return dict(PROXY_ENV)

    def with_egress(self, policy: dict[str, Any]) -> SandboxHandle:
        """This handle once the unit's egress is open under ``policy`` (its route's, narrowed by its task's)."""
        return self.model_copy(update={"egress": policy})

    def summary(self) -> dict[str, Any]:
        return self.model_dump(mode="json")
