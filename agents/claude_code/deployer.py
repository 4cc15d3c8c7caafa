"""Claude Code (the real CLI, headless) as an ale-iac agent, under every executor.

The deployer never asks where it runs; ``self.executor`` says what it needs to know:

* ``executor.cli("claude-code")``: the native executable, installed from npm on the host
  (``ale_iac.agent_sdk.clis``) and carried to where the deployer runs.
* ``executor.model_access()``: the base URL of the run's model gateway and the unit's token, sent
  as the API key. The real key never reaches the agent.
* ``executor.native_shell``: inside the sandbox the agent keeps its own shell and file tools
  (``settings.native_tools``) and gets only the ``cua`` bridge; elsewhere it gets both bridges and
  no built-in tool at all (``--tools ""``), so it can touch nothing but the sandbox.
* ``executor.bridge(kind)``: how to start each MCP bridge (stdio) from where the deployer runs.

Its state (HOME, CLAUDE_CONFIG_DIR, CLAUDE_CODE_TMPDIR, XDG_RUNTIME_DIR) lives in the work dir under
``claude-code/``; its transcript (``--output-format stream-json --verbose``) is the log
``claude-code/transcript.jsonl``, which ``transcript.py`` turns into the ATIF trajectory.

The preset's ``settings`` (all optional)::

    max_turns: 50             # --max-turns; none by default
    max_retries: 0            # CLAUDE_CODE_MAX_RETRIES: API retries (the CLI's default is 10, with backoff)
    bridge_startup_s: 60      # MCP_TIMEOUT: how long the CLI waits for each MCP bridge to start
    native_tools: [Bash, Read, Write, Edit]   # built-in tools kept inside the sandbox
    extra_args: []            # appended to the command line (before the prompt)
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ale_iac.agent_sdk import (
    AgentConfig,
    AgentInfo,
    AgentRunResult,
    BaseAgentDeployer,
    BridgeKind,
    BridgeLaunch,
    ModelApi,
    ToolCatalog,
    Trajectory,
    sibling_module,
)
from ale_iac.errors import AleIacError, ConfigError, format_validation_error

CLI = "claude-code"
STATE = "claude-code"
TRANSCRIPT_LOG = f"{STATE}/transcript.jsonl"
SETUP_LOG = f"{STATE}/setup.log"
MCP_CONFIG = f"{STATE}/mcp.json"
PROMPT_FILE = f"{STATE}/prompt.txt"
SCREENSHOT_DIR = "screenshots"


if TYPE_CHECKING:  # mypy reads the siblings by their path in the repository; the runner loads them by file
    from agents.claude_code import transcript
else:
    transcript = sibling_module(__file__, "transcript")


class ClaudeCodeSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_turns: int | None = Field(default=None, gt=0, description="--max-turns (agentic turns); none by default.")
    max_retries: int = Field(default=0, ge=0, le=10, description="CLAUDE_CODE_MAX_RETRIES: API retries.")
    bridge_startup_s: int = Field(
        default=60,
        ge=10,
        le=60,
        description="MCP_TIMEOUT: how long the CLI waits for each MCP bridge to start (the CLI caps it at 60 s). "
        "A bridge is a Python process whose imports take tens of seconds on a loaded host.",
    )
    native_tools: list[str] = Field(
        default_factory=lambda: ["Bash", "Read", "Write", "Edit"],
        description="Built-in tools the agent keeps where it runs inside the sandbox (all allowed).",
    )
    extra_args: list[str] = Field(default_factory=list, description="More CLI arguments, before the prompt.")


def parse_settings(source: str, settings: dict[str, Any]) -> ClaudeCodeSettings:
    try:
        return ClaudeCodeSettings.model_validate(settings)
    except ValidationError as exc:
        raise format_validation_error(source, exc, prefix="settings", model=ClaudeCodeSettings) from None


def bridge_kinds(native_shell: bool) -> list[BridgeKind]:
    """Inside the sandbox the agent has the machine's shell and files: only the GUI bridge."""
    return ["cua"] if native_shell else ["vm", "cua"]


def allowed_tools(native_shell: bool, native_tools: list[str]) -> list[str]:
    """What ``--allowedTools`` grants: each bridge as a whole (a server-level rule ``mcp__<server>``
    allows all of that server's tools), and in the sandbox the native tools kept."""
    return [f"mcp__{kind}" for kind in bridge_kinds(native_shell)] + (list(native_tools) if native_shell else [])


class ClaudeCodeDeployer(BaseAgentDeployer):
    default_executor: ClassVar[str] = "sandbox"
    supported_executors: ClassVar[frozenset[str]] = frozenset({"local", "sandbox", "docker"})
    clis: ClassVar[tuple[str, ...]] = (CLI,)
    model_api: ClassVar[ModelApi | None] = "anthropic"

    @classmethod
    def validate_config(cls, config: AgentConfig, tools: ToolCatalog) -> None:
        source = f"{config.source_dir}/preset.yaml" if config.source_dir else f"agent {config.name}"
        if config.model is None:
            raise ConfigError(source, "model", "Claude Code needs a model: set `model: {name: ..., base_url: ...}`")
        if config.model.api not in (None, "anthropic"):
            raise ConfigError(source, "model.api", f"Claude Code speaks the Anthropic API, not {config.model.api!r}")
        settings = parse_settings(source, config.settings)
        for kind in ("vm", "cua"):
            if not tools.get(kind):
                raise ConfigError(source, "settings", f"the {kind} bridge offers no tools")
        for name in settings.native_tools:
            if not name or not name.replace("_", "").isalnum():
                raise ConfigError(source, "settings.native_tools", f"{name!r} is not a tool name")

    def _source(self) -> str:
        return f"agent {self.config.name}"

    # -- install ---------------------------------------------------------------------------------------

    async def install(self) -> None:
        """Locate the CLI, get the model's address, write the MCP configuration and make the state dirs."""
        self.settings = parse_settings(self._source(), self.config.settings)
        self.cli_path = self.executor.cli(CLI)
        self.access = self.executor.model_access()
        native = self.executor.native_shell
        servers: dict[str, Any] = {}
        for kind in bridge_kinds(native):
            launch = self.executor.bridge(kind)
            servers[kind] = {"type": "stdio", "command": launch.command, "args": launch.args, "env": self._env(launch)}
        self.mcp_path = self.executor.write_text(MCP_CONFIG, json.dumps({"mcpServers": servers}, indent=2) + "\n")
        state = PurePosixPath(self.mcp_path).parent  # the native path of <work dir>/claude-code
        self.dirs = {
            "HOME": str(state / "home"),
            "CLAUDE_CONFIG_DIR": str(state / "config"),
            "XDG_RUNTIME_DIR": str(state / "run"),
            "CLAUDE_CODE_TMPDIR": str(state / "run"),
        }
        made = await self.executor.run(
            ["install", "-d", "-m", "0700", *sorted(set(self.dirs.values()))], log_name=SETUP_LOG, timeout_s=60
        )
        if made.exit_code != 0:
            raise AleIacError(f"could not make Claude Code's state dirs (exit {made.exit_code}, see {SETUP_LOG})")

    def _env(self, launch: BridgeLaunch) -> dict[str, str]:
        """A bridge's environment, without the agent's secrets (it never needs them)."""
        hidden = set(self.config.secrets)
        if self.config.model and self.config.model.api_key_secret:
            hidden.add(self.config.model.api_key_secret)
        return {k: v for k, v in launch.env.items() if k not in hidden}

    # -- launch ----------------------------------------------------------------------------------------

    def argv(self, prompt: str) -> list[str]:
        native = self.executor.native_shell
        tools = ",".join(self.settings.native_tools) if native else ""
        argv = [
            self.cli_path,
            "-p",
            "--output-format",
            "stream-json",
            "--verbose",
            "--model",
            self.access.model,
            "--tools",
            tools,
            "--allowedTools",
            ",".join(allowed_tools(native, self.settings.native_tools)),
            "--mcp-config",
            self.mcp_path,
            "--strict-mcp-config",
            "--no-session-persistence",
        ]
        if self.settings.max_turns is not None:
            argv += ["--max-turns", str(self.settings.max_turns)]
        return [*argv, *self.settings.extra_args, "--", prompt]

    def launch_env(self) -> dict[str, str]:
        return {
            **self.dirs,
            "ANTHROPIC_BASE_URL": self.access.base_url,
            "ANTHROPIC_API_KEY": self.access.api_key,
            "ANTHROPIC_AUTH_TOKEN": "",  # a host's bearer token would take precedence over the key
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # no telemetry, no HEAD probe of the base URL
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_MAX_RETRIES": str(self.settings.max_retries),
            "ENABLE_TOOL_SEARCH": "false",  # MCP tools offered directly, not deferred behind ToolSearch
            "MCP_TIMEOUT": str(self.settings.bridge_startup_s * 1000),
        }

    async def launch(self, prompt: str) -> AgentRunResult:
        if not hasattr(self, "access"):
            raise AleIacError("launch() before install()")
        started = time.monotonic()
        self.executor.write_text(PROMPT_FILE, prompt)
        process = await self.executor.run(
            self.argv(prompt), log_name=TRANSCRIPT_LOG, env=self.launch_env(), timeout_s=None
        )
        logs = [TRANSCRIPT_LOG, MCP_CONFIG]
        parsed = transcript.read_transcript(self.executor.read_text(TRANSCRIPT_LOG))
        error = transcript.run_error(parsed, process.exit_code)
        return AgentRunResult(
            status="failed" if error else "completed",
            exit_code=process.exit_code,
            error=error,
            duration_s=time.monotonic() - started,
            logs=logs,
        )

    # -- parse_artifacts -------------------------------------------------------------------------------

    def parse_artifacts(self, result: AgentRunResult) -> Trajectory:
        text = self.executor.read_text(TRANSCRIPT_LOG) if self.executor.exists(TRANSCRIPT_LOG) else ""
        prompt = self.executor.read_text(PROMPT_FILE) if self.executor.exists(PROMPT_FILE) else None
        install = self.executor.clis.get(CLI)
        agent = AgentInfo(
            name=self.config.name,
            version=install.version if install else "unknown",
            model_name=self.config.model.name if self.config.model else None,
        )
        parsed = transcript.to_trajectory(
            text,
            prompt=prompt,
            agent=agent,
            session_id=f"{self.config.name}-{uuid.uuid4().hex[:12]}",
            status=result.status,
            exit_code=result.exit_code,
            error=result.error,
            image_dir=SCREENSHOT_DIR,
        )
        for rel, data in parsed.images.items():
            self.executor.write_bytes(rel, data)
        trajectory: Trajectory = parsed.trajectory
        return trajectory
