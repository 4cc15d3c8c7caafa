"""The stack-output contract: the only thing the declaring side (infra/) and the running side
(sandbox/, runner/) share.

Every program that declares sandboxes exports one output, ``units``: a mapping of unit name to a
dict of the shape of :class:`UnitOutputs`. The runtime parses that dict into a ``SandboxHandle``;
it never looks at resources, providers or Pulumi state.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

UNITS_OUTPUT = "units"
"""Name of the stack output that carries the per-unit handles."""

OsName = Literal["linux", "windows"]

ENDPOINT_TOKEN_ENV = "ALE_IAC_ENDPOINT_TOKEN"
"""Environment variable that carries an endpoint's bearer token to a process (a bridge, an agent's
MCP server): never a command-line argument, which every user of the host can read."""


class SandboxPaths(BaseModel):
    """Path conventions baked into an image; tasks and agents use them instead of hard-coding."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    home: str = Field(description="Home directory of the user the computer-server runs as.")
    work_dir_base: str = Field(description="Where per-run agent work dirs are created.")
    task_data_root: str = Field(description="Root of staged task data (input/, reference/, output/).")
    python: str = Field(description="A Python interpreter inside the sandbox.")


class UnitOutputs(BaseModel):
    """What a stack exports per unit: everything a SandboxHandle needs, nothing provider-internal."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    unit: str = Field(description="Unit name, unique within its stack.")
    provider: str = Field(description="Provider kind that realised the unit (local, static, gcloud, ...).")
    endpoint: str = Field(description="Base URL of the unit's Cua computer-server.")
    endpoint_token: SecretStr | None = Field(
        default=None,
        description="Bearer token the endpoint requires (a secret: the stack output is marked secret, and it is "
        "shown as '**********' wherever a handle is printed or recorded). None for endpoints without authentication.",
    )
    os: OsName = "linux"
    snapshot: str = Field(description="Logical snapshot the unit was routed from.")
    image: str = Field(description="Image the sandbox was created from.")
    resource_id: str = Field(description="Provider-side identity (instance id, sandbox id, endpoint).")
    region: str | None = Field(default=None, description="Zone or region for cloud units.")
    paths: SandboxPaths
    labels: dict[str, str] = Field(default_factory=dict)
    expires_at: str | None = Field(default=None, description="ISO-8601 time after which gc may reap it.")
    managed: bool = Field(default=True, description="False for endpoints ale-iac did not create (static).")

    def token(self) -> str | None:
        """The endpoint's bearer token in clear (for a client or a bridge's environment)."""
        return self.endpoint_token.get_secret_value() if self.endpoint_token else None

    def to_output(self) -> dict[str, Any]:
        """The plain dict a stack exports (the token in clear: the caller marks the output secret)."""
        data = self.model_dump()
        data["endpoint_token"] = self.token()
        return data


def parse_units(raw: Any) -> dict[str, UnitOutputs]:
    """Parse the ``units`` stack output; raises ``ValueError`` naming the unit and field on bad data."""
    if not isinstance(raw, dict):
        raise ValueError(f"stack output '{UNITS_OUTPUT}' must be a mapping, got {type(raw).__name__}")
    parsed: dict[str, UnitOutputs] = {}
    for name, value in raw.items():
        try:
            parsed[str(name)] = UnitOutputs.model_validate(value)
        except Exception as exc:  # pydantic.ValidationError, re-raised with the unit's name
            raise ValueError(f"stack output '{UNITS_OUTPUT}.{name}' is not a unit handle: {exc}") from exc
    return parsed
