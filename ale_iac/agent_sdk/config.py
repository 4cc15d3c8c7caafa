"""Agent configuration and results: plain data that may cross an executor boundary as JSON."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

AgentStatus = Literal["completed", "failed", "timeout"]
ModelApi = Literal["anthropic", "openai"]
"""The model APIs the gateway speaks: Anthropic Messages and OpenAI Responses."""
BridgeKind = Literal["vm", "cua"]
"""The two MCP bridges: ``vm`` (shell, files, clipboard, PTY) and ``cua`` (mouse, keyboard, screen)."""
ToolCatalog = Mapping[str, Mapping[str, Mapping[str, Any]]]
"""What the bridges offer, known without a sandbox: bridge kind -> tool name -> the JSON Schema of its arguments."""


class TaskPaths(BaseModel):
    """The unit's task, as an agent may know it: its id and its folders in the sandbox."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_id: str
    input_dir: str
    output_dir: str


class ModelConfig(BaseModel):
    """The model an agent uses and where it is served. The agent never sees the key: the run's model
    gateway holds it and hands the agent a per-unit token (see docs/models.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="Model identifier sent to the API.")
    api: ModelApi | None = Field(default=None, description="Wire API; default: the one the deployer speaks.")
    base_url: str | None = Field(
        default=None,
        description="Upstream base URL (Anthropic: without /v1; OpenAI: with /v1); default: the vendor's. "
        "Any compatible endpoint works, including a local one.",
    )
    api_key_secret: str | None = Field(
        default=None,
        description="Name of the environment variable holding the API key; none for an endpoint without auth.",
    )
    scripted_name: str | None = Field(
        default=None,
        min_length=1,
        description="The model name sent instead of `name` when the run follows a model plan "
        "(`ale-iac evaluate --model-plan`): Codex offers its MCP tools only to a model it does not know.",
    )

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"{value!r} is not an http(s) URL")
        return value.rstrip("/") if value else value


class AgentConfig(BaseModel):
    """An agent preset (``agents/<name>/preset.yaml``), possibly overridden by the experiment."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Agent name used in unit ids and records.")
    deployer: str = Field(description="'file.py:Class' relative to the preset folder, or 'module:Class'.")
    executor: str | None = Field(
        default=None,
        description="Where the deployer runs (see ale_iac.agent_sdk.available_executors()); default: the deployer's.",
    )
    model: ModelConfig | None = Field(
        default=None, description="The model, if the agent uses one: a name, or {name, api, base_url, api_key_secret}."
    )
    secrets: list[str] = Field(
        default_factory=list,
        description="Names of environment variables handed to the agent as secrets (values are redacted "
        "from every record).",
    )
    settings: dict[str, Any] = Field(default_factory=dict, description="Deployer-specific knobs.")
    source_dir: str = Field(default="", description="Folder of the preset (set by the loader).")

    @field_validator("model", mode="before")
    @classmethod
    def _model_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value


class AgentRunResult(BaseModel):
    """What ``launch`` returns. Pure data: it may cross an executor boundary as JSON."""

    model_config = ConfigDict(extra="forbid")

    status: AgentStatus
    exit_code: int | None = None
    error: str | None = None
    duration_s: float = 0.0
    logs: list[str] = Field(default_factory=list, description="Raw log files the agent wrote (work-dir relative).")
