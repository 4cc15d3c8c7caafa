"""ALE-Claw: the reference out-of-sandbox agent harness, model-driven, on the two MCP bridges.

Its runtime (the loop, the conversation, the context policy, paged outputs, PTY bookkeeping) stays
where the deployer runs (``local``: the runner's process; ``docker``: a container); it reaches the
sandbox only through the ``vm`` and ``cua`` bridges it spawns over stdio (``executor.bridge``), and
its model only through ``executor.model_access()`` (the run's gateway and a per-unit token) with the
official SDK the preset's ``model.api`` names: ``anthropic`` (Messages) or ``openai`` (Responses).

Modules, next to this file: ``bridges`` (restartable MCP sessions), ``tools`` (the thick tools and the
retry policy), ``context`` (the conversation and what the model sees of it), ``models`` (the SDK
adapters), ``loop`` (turns, limits, back-off), ``transcript`` (the log to ATIF). See README.md.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ale_iac.agent_sdk import (
    AgentConfig,
    AgentInfo,
    AgentRunResult,
    AgentStatus,
    BaseAgentDeployer,
    BridgeKind,
    BridgeLaunch,
    ModelApi,
    ToolCatalog,
    Trajectory,
    sibling_module,
)
from ale_iac.errors import ConfigError, format_validation_error

AGENT_VERSION = "1"
STATE = "ale_claw"
RAW_LOG = f"{STATE}/events.jsonl"
SETTINGS_FILE = f"{STATE}/settings.json"
SCREENSHOT_DIR = "screenshots"
_KINDS: tuple[BridgeKind, ...] = ("vm", "cua")
_EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/webp": "webp"}
NEEDED_TOOLS: dict[BridgeKind, tuple[str, ...]] = {
    "vm": (
        "run_command",
        "read_text",
        "write_text",
        "read_bytes",
        "read_clipboard",
        "write_clipboard",
        "pty_start",
        "pty_input",
        "pty_read",
        "pty_kill",
    ),
    "cua": ("screenshot", "click", "mouse_move", "type", "key", "scroll", "drag", "wait"),
}


if TYPE_CHECKING:  # mypy reads the siblings by their path in the repository; the runner loads them by file
    from agents.ale_claw import bridges, context, loop, models, tools, transcript
else:
    bridges = sibling_module(__file__, "bridges")
    tools = sibling_module(__file__, "tools")
    context = sibling_module(__file__, "context")
    models = sibling_module(__file__, "models")
    loop = sibling_module(__file__, "loop")
    transcript = sibling_module(__file__, "transcript")


class HarnessSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_steps: int = Field(default=80, ge=1, description="Model turns before the run fails.")
    max_wall_s: float = Field(default=1800, gt=0, description="Wall time of the whole run (status timeout).")
    max_tokens: int = Field(default=4096, ge=16, le=16384, description="Reply tokens per model turn.")
    context_limit_tokens: int = Field(default=200_000, ge=1000, description="The model's context window.")
    budget_fraction: float = Field(default=0.8, gt=0, le=1, description="Share of the window the view may use.")
    keep_screenshots: int = Field(default=3, ge=0, description="Newest screenshots kept at full size.")
    downscale_screenshots: int = Field(default=3, ge=0, description="The next ones, kept at half size.")
    recent_turns: int = Field(default=4, ge=0, description="Tool turns whose outputs are kept whole.")
    old_output_chars: int = Field(default=2000, ge=200, description="Older tool outputs are cut to this.")
    page_chars: int = Field(default=12_000, ge=500, description="Page size of exec output and read.")
    read_lines: int = Field(default=2000, ge=1, description="Lines read returns by default.")
    exec_timeout_s: float = Field(default=120, gt=0, description="Default timeout of an exec command.")
    max_exec_timeout_s: float = Field(default=1200, gt=0, description="Longest timeout exec accepts.")
    call_timeout_s: float = Field(default=120, gt=0, description="Bridge call timeout (exec: its own + 30 s).")
    bridge_start_timeout_s: float = Field(default=60, gt=0)
    model_retries: int = Field(default=4, ge=0, le=20, description="Retries of a retryable model error.")
    retry_base_s: float = Field(default=2.0, ge=0, description="First back-off; doubled each retry.")
    retry_max_s: float = Field(default=60.0, ge=0, description="Longest back-off.")
    request_timeout_s: float = Field(default=600, gt=0, description="One model request.")
    system_prompt: str | None = Field(default=None, description="Replaces the built-in system prompt.")


def parse_settings(source: str, settings: dict[str, Any]) -> HarnessSettings:
    try:
        return HarnessSettings.model_validate(settings)
    except ValidationError as exc:
        raise format_validation_error(source, exc, prefix="settings", model=HarnessSettings) from None


SYSTEM_PROMPT = """You are ALE-Claw, an agent that does tasks on a Linux desktop machine (the sandbox) through tools.
- exec runs shell commands there; read, write and edit work on its files; clipboard reads or sets its clipboard;
  terminal keeps an interactive program running; computer sees and drives the screen (coordinates are [x, y]
  in [0, 1000] on both axes; take a screenshot to look).
- GUI effects can be asynchronous: look again (screenshot, or read the file an app writes) before relying on them.
- When the task is done, reply with a short summary and no tool call.{task}"""


class AleClawDeployer(BaseAgentDeployer):
    """The model-driven reference harness; ``model.api`` in the preset picks the SDK."""

    default_executor: ClassVar[str] = "local"
    supported_executors: ClassVar[frozenset[str]] = frozenset({"local", "docker"})
    model_api: ClassVar[ModelApi | None] = "anthropic"
    settings: HarnessSettings

    @classmethod
    def validate_config(cls, config: AgentConfig, tools: ToolCatalog) -> None:
        source = config.source_dir and f"{config.source_dir}/preset.yaml"
        parse_settings(source or f"agent {config.name}", config.settings)
        if config.model is None:
            raise ConfigError(f"agent {config.name}", "model", "ALE-Claw needs a model: {name, api, ...}")
        for kind, names in NEEDED_TOOLS.items():
            missing = [n for n in names if n not in tools.get(kind, {})]
            if missing:
                raise ConfigError(f"agent {config.name}", "settings", f"the {kind} bridge lacks {', '.join(missing)}")

    async def install(self) -> None:
        self.settings = parse_settings(f"agent {self.config.name}", self.config.settings)
        access = self.executor.model_access()  # fails here, before any sandbox work, without a model
        self.executor.write_text(
            SETTINGS_FILE,
            json.dumps(
                {"api": access.api, "model": access.model, "settings": self.settings.model_dump(mode="json")}, indent=2
            )
            + "\n",
        )

    async def launch(self, prompt: str) -> AgentRunResult:
        if not hasattr(self, "settings"):
            self.settings = parse_settings(f"agent {self.config.name}", self.config.settings)
        s = self.settings
        started = time.monotonic()
        self._records: list[str] = []
        self._shots: dict[int, int] = {}
        self._session_id = f"{self.config.name}-{uuid.uuid4().hex[:12]}"
        access = self.executor.model_access()
        self._model_name = access.model
        system = s.system_prompt or SYSTEM_PROMPT.format(task=self._task_note())
        self._record(
            "start",
            session_id=self._session_id,
            prompt=prompt,
            system=system,
            api=access.api,
            model=access.model,
            tools=[
                {"name": t.name, "description": t.description, "parameters": t.schema} for t in tools.Toolbox.specs()
            ],
            raw_log=RAW_LOG,
        )
        self._flush()
        held: dict[BridgeKind, bridges.Bridge] = {
            kind: bridges.Bridge(kind, _launcher(self, kind), s.bridge_start_timeout_s) for kind in _KINDS
        }
        adapter = models.make_adapter(access, s.request_timeout_s)
        status: AgentStatus = "failed"
        error: str | None = None
        answer = ""
        logs = [RAW_LOG]
        try:
            try:
                await _start_all(held)
                runner = self._loop(held, adapter, system)
                status, error, answer = await runner.run(prompt)
            except bridges.BridgeStartError as exc:
                status, error = "failed", str(exc)
            except Exception as exc:  # a bug: still a result, not a crash of the runner
                status, error = "failed", f"ale-claw error: {bridges.describe(exc)}"
            finally:
                await adapter.close()
                restarts = {kind: b.restarts for kind, b in held.items()}
                logs += await self._close_bridges(held)
        except BaseException as exc:  # cancelled by the runner's timeout: record it, re-raise
            self._record("end", status="cancelled", error=bridges.describe(exc))
            self._flush()
            raise
        self._record("end", status=status, error=error, answer=answer, bridge_restarts=restarts)
        self._flush()
        return AgentRunResult(status=status, error=error, duration_s=time.monotonic() - started, logs=logs)

    def _loop(self, held: dict[BridgeKind, bridges.Bridge], adapter: models.Adapter, system: str) -> loop.Loop:
        """The agent loop over the bridges, with the preset's context policy and limits."""
        s = self.settings
        caller = tools.BridgeCaller(held, s.call_timeout_s, bridges.BridgeDiedError)
        toolbox = tools.Toolbox(
            caller,
            page_chars=s.page_chars,
            exec_timeout_s=s.exec_timeout_s,
            max_exec_timeout_s=s.max_exec_timeout_s,
            read_lines=s.read_lines,
            generation=lambda kind: held[kind].generation,
        )
        return loop.Loop(
            adapter=adapter,
            toolbox=toolbox,
            policy=context.Policy(
                context_limit_tokens=s.context_limit_tokens,
                max_tokens=s.max_tokens,
                budget_fraction=s.budget_fraction,
                keep_screenshots=s.keep_screenshots,
                downscale_screenshots=s.downscale_screenshots,
                recent_turns=s.recent_turns,
                old_output_chars=s.old_output_chars,
            ),
            limits=loop.Limits(
                max_steps=s.max_steps,
                max_wall_s=s.max_wall_s,
                max_tokens=s.max_tokens,
                model_retries=s.model_retries,
                retry_base_s=s.retry_base_s,
                retry_max_s=s.retry_max_s,
            ),
            system=system,
            record=self._record,
            save_shot=self._save_shot,
            flush=self._flush,
        )

    async def _close_bridges(self, held: dict[BridgeKind, bridges.Bridge]) -> list[str]:
        """Close every bridge; the logs of those that wrote one, saved in the work dir."""
        logs = []
        for kind, bridge in held.items():
            log = await bridge.close()
            if log.strip():
                self.executor.write_text(f"{STATE}/bridge-{kind}.log", log)
                logs.append(f"{STATE}/bridge-{kind}.log")
        return logs

    def _task_note(self) -> str:
        task = self.executor.task
        if task is None:
            return ""
        return f"\nThe task's input folder is {task.input_dir}; its output folder is {task.output_dir}."

    def _record(self, kind: str, **fields: Any) -> None:
        line = json.dumps({"type": kind, "t": _now(), **fields}, ensure_ascii=False, default=str)
        self._records.append(line + "\n")

    def _flush(self) -> None:
        self.executor.write_text(RAW_LOG, "".join(self._records))

    def _save_shot(self, data: bytes, mime: str, step_id: int) -> str:
        count = self._shots.get(step_id, 0) + 1
        self._shots[step_id] = count
        suffix = "" if count == 1 else f"-{count}"
        relpath = f"{SCREENSHOT_DIR}/step-{step_id}{suffix}.{_EXTENSIONS.get(mime, 'png')}"
        self.executor.write_bytes(relpath, data)
        return relpath

    def parse_artifacts(self, result: AgentRunResult) -> Trajectory:
        records = []
        if self.executor.exists(RAW_LOG):
            for line in self.executor.read_text(RAW_LOG).splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a torn last line
                if isinstance(record, dict):
                    records.append(record)
        start = next((r for r in records if r.get("type") == "start"), {})
        agent = AgentInfo(
            name=self.config.name,
            version=f"ale-claw-{AGENT_VERSION}",
            model_name=str(start.get("model") or (self.config.model.name if self.config.model else "")) or None,
        )
        trajectory: Trajectory = transcript.to_trajectory(
            records,
            agent=agent,
            session_id=f"{self.config.name}-{uuid.uuid4().hex[:12]}",
            status=result.status,
            error=result.error,
        )
        return trajectory


def _launcher(deployer: AleClawDeployer, kind: BridgeKind) -> Callable[[], BridgeLaunch]:
    return lambda: deployer.executor.bridge(kind)


async def _start_all(held: dict[BridgeKind, bridges.Bridge]) -> None:
    import asyncio

    await asyncio.gather(*(bridge.start() for bridge in held.values()))


def _now() -> str:
    import datetime as dt

    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
