"""Codex (the real CLI, ``codex exec``) as an ale-iac agent, under every executor.

The deployer never asks where it runs; ``self.executor`` says what it needs to know:

* ``executor.cli("codex")``: the native executable, installed from npm on the host
  (``ale_iac.agent_sdk.clis``) and carried to where the deployer runs.
* ``executor.model_access()``: the base URL of the run's model gateway (OpenAI Responses, with
  ``/v1``) and the unit's token, sent as the bearer key. The real key never reaches the agent.
* ``executor.native_shell``: inside the sandbox the agent keeps its own shell tool, with Codex's own
  command sandbox off (``-s danger-full-access``: the machine is the sandbox) and gets only the
  ``cua`` bridge; elsewhere it gets both bridges and no shell (``--disable shell_tool``).
* ``executor.bridge(kind)``: how to start each MCP bridge (stdio) from where the deployer runs.
  Codex starts MCP servers with an almost empty environment, so the bridge's environment is written
  into the configuration.

Its state (HOME, CODEX_HOME with ``config.toml`` and the session's rollout file) lives in the work
dir under ``codex/``; its transcript (``--json``) is the log ``codex/transcript.jsonl``, which
``transcript.py`` turns into the ATIF trajectory.

The preset's ``settings`` (all optional)::

    max_retries: 0            # request_max_retries and stream_max_retries of the model provider
    bridge_startup_s: 120     # startup_timeout_sec of each MCP bridge (Codex's own default is shorter)
    extra_args: []            # appended to the `codex exec` command line (before the prompt)
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
    ModelAccess,
    ModelApi,
    ToolCatalog,
    Trajectory,
    sibling_module,
)
from ale_iac.errors import AleIacError, ConfigError, format_validation_error

CLI = "codex"
STATE = "codex"
TRANSCRIPT_LOG = f"{STATE}/transcript.jsonl"
SETUP_LOG = f"{STATE}/setup.log"
VERSION_LOG = f"{STATE}/version.log"
CONFIG = f"{STATE}/codex-home/config.toml"
PROMPT_FILE = f"{STATE}/prompt.txt"
SCREENSHOT_DIR = "screenshots"
PROVIDER = "ale"
KEY_ENV = "OPENAI_API_KEY"


if TYPE_CHECKING:  # mypy reads the siblings by their path in the repository; the runner loads them by file
    from agents.codex import transcript
else:
    transcript = sibling_module(__file__, "transcript")


class CodexSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_retries: int = Field(default=0, ge=0, le=10, description="request_max_retries and stream_max_retries.")
    bridge_startup_s: int = Field(
        default=120,
        ge=10,
        le=600,
        description="startup_timeout_sec of each MCP bridge: a bridge is a Python process whose imports take "
        "tens of seconds on a loaded host, longer than Codex waits by default.",
    )
    extra_args: list[str] = Field(default_factory=list, description="More `codex exec` arguments, before the prompt.")


def parse_settings(source: str, settings: dict[str, Any]) -> CodexSettings:
    try:
        return CodexSettings.model_validate(settings)
    except ValidationError as exc:
        raise format_validation_error(source, exc, prefix="settings", model=CodexSettings) from None


def bridge_kinds(native_shell: bool) -> list[BridgeKind]:
    """Inside the sandbox the agent has the machine's shell and files: only the GUI bridge."""
    return ["cua"] if native_shell else ["vm", "cua"]


def toml_string(value: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's, for every character JSON escapes here)."""
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{toml_string(str(k))} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML for {type(value).__name__}")


def config_toml(
    access: ModelAccess,
    bridges: dict[BridgeKind, BridgeLaunch],
    settings: CodexSettings,
    env: dict[BridgeKind, dict[str, str]],
) -> str:
    """Codex's config.toml: the gateway as the only model provider, nothing that talks to the outside
    (analytics, plugin sync, update checks), and each bridge as a required, pre-approved MCP server."""
    sections: list[tuple[str, dict[str, Any]]] = [
        (
            "",
            {
                "model": access.model,
                "model_provider": PROVIDER,
                "check_for_update_on_startup": False,
                "web_search": "disabled",
            },
        ),
        ("analytics", {"enabled": False}),
        ("features", {"plugins": False}),
        (
            f"model_providers.{PROVIDER}",
            {
                "name": "ale-iac model gateway",
                "base_url": access.base_url,
                "wire_api": "responses",
                "env_key": KEY_ENV,
                "request_max_retries": settings.max_retries,
                "stream_max_retries": settings.max_retries,
            },
        ),
    ]
    for kind, launch in bridges.items():
        sections.append(
            (
                f"mcp_servers.{kind}",
                {
                    "command": launch.command,
                    "args": launch.args,
                    "env": env[kind],
                    "required": True,  # wait for the bridge before the first model request
                    "startup_timeout_sec": settings.bridge_startup_s,
                    "default_tools_approval_mode": "approve",  # exec has nobody to ask
                },
            )
        )
    lines = ["# Written by agents/codex/deployer.py for one unit."]
    for header, values in sections:
        if header:
            lines += ["", f"[{header}]"]
        lines += [f"{key} = {toml_value(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


class CodexDeployer(BaseAgentDeployer):
    default_executor: ClassVar[str] = "sandbox"
    supported_executors: ClassVar[frozenset[str]] = frozenset({"local", "sandbox", "docker"})
    clis: ClassVar[tuple[str, ...]] = (CLI,)
    model_api: ClassVar[ModelApi | None] = "openai"

    @classmethod
    def validate_config(cls, config: AgentConfig, tools: ToolCatalog) -> None:
        source = f"{config.source_dir}/preset.yaml" if config.source_dir else f"agent {config.name}"
        if config.model is None:
            raise ConfigError(source, "model", "Codex needs a model: set `model: {name: ..., base_url: ...}`")
        if config.model.api not in (None, "openai"):
            raise ConfigError(source, "model.api", f"Codex speaks the OpenAI Responses API, not {config.model.api!r}")
        parse_settings(source, config.settings)
        for kind in ("vm", "cua"):
            if not tools.get(kind):
                raise ConfigError(source, "settings", f"the {kind} bridge offers no tools")

    def _source(self) -> str:
        return f"agent {self.config.name}"

    # -- install ---------------------------------------------------------------------------------------

    async def install(self) -> None:
        """Locate the CLI, get the model's address, write config.toml and make the state dirs."""
        self.settings = parse_settings(self._source(), self.config.settings)
        self.cli_path = self.executor.cli(CLI)
        self.access = self.executor.model_access()
        bridges = {kind: self.executor.bridge(kind) for kind in bridge_kinds(self.executor.native_shell)}
        env = {kind: self._env(launch) for kind, launch in bridges.items()}
        config_path = self.executor.write_text(CONFIG, config_toml(self.access, bridges, self.settings, env))
        codex_home = PurePosixPath(config_path).parent  # the native path of <work dir>/codex/codex-home
        self.dirs = {"CODEX_HOME": str(codex_home), "HOME": str(codex_home.parent / "home")}
        made = await self.executor.run(
            ["install", "-d", "-m", "0700", *sorted(set(self.dirs.values()))], log_name=SETUP_LOG, timeout_s=60
        )
        if made.exit_code != 0:
            raise AleIacError(f"could not make Codex's state dirs (exit {made.exit_code}, see {SETUP_LOG})")
        # Its version, for the trajectory (the --json transcript does not say it).
        await self.executor.run([self.cli_path, "--version"], log_name=VERSION_LOG, env=self.dirs, timeout_s=60)

    def _env(self, launch: BridgeLaunch) -> dict[str, str]:
        """A bridge's environment, without the agent's secrets (it never needs them)."""
        hidden = set(self.config.secrets)
        if self.config.model and self.config.model.api_key_secret:
            hidden.add(self.config.model.api_key_secret)
        return {k: v for k, v in launch.env.items() if k not in hidden}

    # -- launch ----------------------------------------------------------------------------------------

    def argv(self, prompt: str) -> list[str]:
        argv = [self.cli_path, "exec", "--json", "--skip-git-repo-check", "--color", "never"]
        if self.executor.native_shell:
            # The machine is the sandbox: Codex's own command sandbox (landlock, seccomp, bwrap) is
            # not needed, and may not work inside ours.
            argv += ["-s", "danger-full-access"]
        else:
            # Nothing runs on the host: no shell tool, no shell snapshot (a login shell at start).
            argv += ["--disable", "shell_tool", "--disable", "shell_snapshot"]
        return [*argv, *self.settings.extra_args, "--", prompt]

    def launch_env(self) -> dict[str, str]:
        return {**self.dirs, KEY_ENV: self.access.api_key}

    async def launch(self, prompt: str) -> AgentRunResult:
        if not hasattr(self, "access"):
            raise AleIacError("launch() before install()")
        started = time.monotonic()
        self.executor.write_text(PROMPT_FILE, prompt)
        process = await self.executor.run(
            self.argv(prompt), log_name=TRANSCRIPT_LOG, env=self.launch_env(), timeout_s=None
        )
        logs = [TRANSCRIPT_LOG, CONFIG]
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

    def _version(self) -> str:
        """The CLI's version: what ``codex --version`` printed at install, else the staged install's."""
        if self.executor.exists(VERSION_LOG):
            for line in self.executor.read_text(VERSION_LOG).splitlines():
                name, _, version = line.strip().partition(" ")
                if name == "codex-cli" and version[:1].isdigit():
                    return version
        install = self.executor.clis.get(CLI)
        return install.version if install else "unknown"

    def parse_artifacts(self, result: AgentRunResult) -> Trajectory:
        text = self.executor.read_text(TRANSCRIPT_LOG) if self.executor.exists(TRANSCRIPT_LOG) else ""
        prompt = self.executor.read_text(PROMPT_FILE) if self.executor.exists(PROMPT_FILE) else None
        agent = AgentInfo(
            name=self.config.name,
            version=self._version(),
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
