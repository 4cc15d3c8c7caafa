"""Agent configuration and results: plain data that may cross an executor boundary as JSON."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

AgentStatus = Literal["completed", "failed", "timeout"]
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


class AgentConfig(BaseModel):
    """An agent preset (``agents/<name>/preset.yaml``), possibly overridden by the experiment."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Agent name used in unit ids and records.")
    deployer: str = Field(description="'file.py:Class' relative to the preset folder, or 'module:Class'.")
    executor: str | None = Field(
        default=None,
        description="Where the deployer runs (one of ale_iac.agent.available_executors()); default: the deployer's.",
    )
    model: str | None = Field(default=None, description="Model identifier, if the agent uses one.")
    secrets: list[str] = Field(
        default_factory=list,
        description="Names of environment variables handed to the agent as secrets (values are redacted "
        "from every record).",
    )
    settings: dict[str, Any] = Field(default_factory=dict, description="Deployer-specific knobs.")
    source_dir: str = Field(default="", description="Folder of the preset (set by the loader).")


class AgentRunResult(BaseModel):
    """What ``launch`` returns. Pure data: it may cross an executor boundary as JSON."""

    model_config = ConfigDict(extra="forbid")

    status: AgentStatus
    exit_code: int | None = None
    error: str | None = None
    duration_s: float = 0.0
    logs: list[str] = Field(default_factory=list, description="Raw log files the agent wrote (work-dir relative).")
