"""The scripted reference agent: no model, a fixed plan of MCP tool calls, to prove the plumbing end to end.

It is an *out-of-sandbox* agent: it runs in the runner's process (the ``local`` executor) and reaches
the sandbox only through the two MCP bridges, spawned over stdio from ``executor.bridge("vm"|"cua")``
and driven with the real ``mcp`` client (``ClientSession`` + ``stdio_client``). It knows the prompt and
its preset, nothing else: it never reads a task's files on the host, so it cannot see the hidden
reference (which is not in the sandbox while it runs either).

The preset's ``settings``::

    plans:
      - match: 'ALE Notepad'          # regex searched in the prompt; the first plan that matches runs
        steps:
          - {bridge: cua, tool: click, args: {coordinate: [400, 300]}}
          - {bridge: vm, tool: run_command, args: {command: 'ls {task_data_root}'}, save_as: listing}
          - {bridge: vm, tool: read_text, args: {path: '/nope'}, expect_error: true}
    call_timeout_s: 120               # per tool call (optional)
    bridge_start_timeout_s: 60        # bridge start + initialize + list_tools (optional)

String arguments (at any depth) are filled with variables: ``{task_data_root}``, ``{home}``,
``{work_dir_base}`` (the sandbox's path conventions), ``{task_id}``, ``{input_dir}``, ``{output_dir}``
(the unit's task and its folders in the sandbox), the named groups of the plan's ``match``, and the
``save_as`` results of earlier steps (for ``run_command`` its stdout, stripped; otherwise the result
text). Only ``{name}`` with a known name is replaced, so shell and awk braces pass through untouched;
``{{name}}`` gives a literal ``{name}``.

A tool error fails the run, unless the step says ``expect_error: true`` (then a *success* fails it).
Every call is recorded in ``scripted/calls.jsonl`` in the work dir (arguments, result text, is_error,
duration); screenshots are saved as ``screenshots/step-<n>.png``, ``<n>`` being the trajectory step
that took them; ``parse_artifacts`` turns the log into an ATIF trajectory.

Before any sandbox exists, ``validate_config`` checks the plans against the bridges' tool schemas:
every step must name a tool of its bridge, with no unknown argument, every required one, and values
of the schema's types.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import datetime as dt
import json
import re
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TextIO

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import CallToolResult, ImageContent, PaginatedRequestParams, TextContent
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ale_iac.agent_sdk import (
    AgentConfig,
    AgentInfo,
    AgentRunResult,
    BaseAgentDeployer,
    BridgeLaunch,
    ToolCatalog,
    Trajectory,
    TrajectoryBuilder,
)
from ale_iac.errors import ConfigError, format_validation_error

AGENT_VERSION = "1"
RAW_LOG = "scripted/calls.jsonl"
PLAN_FILE = "scripted/plan.json"
SCREENSHOT_DIR = "screenshots"
BridgeName = Literal["vm", "cua"]
_VAR_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_PLACEHOLDER = re.compile(r"\{\{(" + _VAR_NAME + r")\}\}|\{(" + _VAR_NAME + r")\}")
_SECRET_MASK = "***"
_IMAGE_EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/webp": "webp", "image/gif": "gif"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PlanStep(_Strict):
    bridge: BridgeName = Field(description="Which MCP bridge serves the tool: vm (CLI) or cua (GUI).")
    tool: str = Field(min_length=1, description="Tool name on that bridge.")
    args: dict[str, Any] = Field(default_factory=dict, description="Tool arguments; strings are filled.")
    save_as: str | None = Field(default=None, pattern=f"^{_VAR_NAME}$", description="Variable for the result.")
    expect_error: bool = Field(default=False, description="The call must fail (a tool error).")
    note: str | None = Field(default=None, description="Shown as the step's message in the trajectory.")


class Plan(_Strict):
    match: str = Field(min_length=1, description="Regex searched in the prompt (re.search).")
    steps: list[PlanStep] = Field(min_length=1)

    @field_validator("match")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from None
        return value


class ScriptedSettings(_Strict):
    plans: list[Plan] = Field(min_length=1)
    call_timeout_s: float = Field(default=120.0, gt=0)
    bridge_start_timeout_s: float = Field(default=60.0, gt=0)


def parse_settings(source: str, settings: dict[str, Any]) -> ScriptedSettings:
    try:
        return ScriptedSettings.model_validate(settings)
    except ValidationError as exc:
        raise format_validation_error(source, exc, prefix="settings", model=ScriptedSettings) from None


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict,),
    "null": (type(None),),
}


def _type_ok(value: Any, schema: Mapping[str, Any]) -> bool:
    """Whether ``value`` has one of the JSON types ``schema`` allows (anything, if it names none)."""
    variants = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(variants, list):
        return any(_type_ok(value, v) for v in variants if isinstance(v, Mapping))
    kinds = schema.get("type")
    if kinds is None:
        return True
    for kind in [kinds] if isinstance(kinds, str) else kinds:
        if isinstance(value, bool) and kind in ("integer", "number"):
            continue
        if isinstance(value, _JSON_TYPES.get(kind, ())):
            return True
    return False


def check_plans(settings: ScriptedSettings, tools: ToolCatalog) -> list[str]:
    """What is wrong with the plans against the bridges' tools: unknown tools, unknown, missing or
    mistyped arguments. Empty if nothing is."""
    problems = []
    for p, plan in enumerate(settings.plans):
        for number, step in enumerate(plan.steps, start=1):
            where = f"plans.{p}.steps.{number - 1}"
            offered = tools.get(step.bridge, {})
            schema = offered.get(step.tool)
            if schema is None:
                known = ", ".join(sorted(offered))
                problems.append(f"{where}: the {step.bridge} bridge has no tool {step.tool!r} (it has: {known})")
                continue
            properties: Mapping[str, Any] = schema.get("properties", {})
            for name in sorted(set(step.args) - set(properties)):
                expected = ", ".join(sorted(properties)) or "none"
                problems.append(f"{where}: {step.tool} has no argument {name!r} (expected: {expected})")
            for name in schema.get("required", []):
                if name not in step.args:
                    problems.append(f"{where}: {step.tool} needs the argument {name!r}")
            for name, value in step.args.items():
                if name in properties and not _type_ok(value, properties[name]):
                    wanted = properties[name].get("type") or "another type"
                    problems.append(f"{where}: {step.tool} argument {name!r} must be {wanted}, not {value!r}")
    return problems


def fill(value: Any, variables: dict[str, str]) -> Any:
    """``value`` with ``{name}`` placeholders of known variables replaced, in strings at any depth."""
    if isinstance(value, str):

        def replace(m: re.Match[str]) -> str:
            if m.group(1) is not None:
                return "{" + m.group(1) + "}"
            return variables.get(m.group(2), m.group(0))

        return _PLACEHOLDER.sub(replace, value)
    if isinstance(value, list):
        return [fill(v, variables) for v in value]
    if isinstance(value, dict):
        return {k: fill(v, variables) for k, v in value.items()}
    return value


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _PlanFailedError(Exception):
    """Ends the run with status failed; the message is the run's error."""


class ScriptedDeployer(BaseAgentDeployer):
    """Replays the first plan whose ``match`` is found in the prompt, through the vm and cua MCP bridges."""

    default_executor: ClassVar[str] = "local"
    supported_executors: ClassVar[frozenset[str]] = frozenset({"local"})
    settings: ScriptedSettings

    def _source(self) -> str:
        return f"agent {self.config.name}"

    @classmethod
    def validate_config(cls, config: AgentConfig, tools: ToolCatalog) -> None:
        """The settings parse, and every plan step calls a real tool with valid arguments."""
        source = config.source_dir and f"{config.source_dir}/preset.yaml"
        settings = parse_settings(source or f"agent {config.name}", config.settings)
        problems = check_plans(settings, tools)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise ConfigError(f"agent {config.name}", "settings", problems[0] + more)

    # -- install ---------------------------------------------------------------------------------------

    async def install(self) -> None:
        """Validate the plans (a bad preset fails here, before any sandbox work) and record them."""
        self.settings = parse_settings(self._source(), self.config.settings)
        self.executor.write_text(PLAN_FILE, json.dumps(self.settings.model_dump(mode="json"), indent=2) + "\n")

    # -- launch ----------------------------------------------------------------------------------------

    async def launch(self, prompt: str) -> AgentRunResult:
        if not hasattr(self, "settings"):
            self.settings = parse_settings(self._source(), self.config.settings)
        started = time.monotonic()
        self._records: list[str] = []
        self._bridge_logs: list[str] = []
        self._pending_bridge_logs: list[tuple[str, str]] = []
        self._call_number = 0
        selected = self._select(prompt)
        self._record(
            "start",
            session_id=f"{self.config.name}-{uuid.uuid4().hex[:12]}",
            agent=self.config.name,
            prompt=prompt,
            plan_index=selected[0] if selected else None,
            plan_match=selected[1].match if selected else None,
            # names only: the values never leave executor.env
            secrets=sorted(name for name in self.config.secrets if name in self.executor.env),
        )
        status: Literal["completed", "failed"] = "completed"
        error: str | None = None
        try:
            if selected is None:
                patterns = ", ".join(repr(p.match) for p in self.settings.plans)
                raise _PlanFailedError(f"no plan matches the prompt (plans tried: {patterns})")
            index, plan, match = selected
            task = self.executor.task
            variables = {
                **(
                    {"task_id": task.task_id, "input_dir": task.input_dir, "output_dir": task.output_dir}
                    if task
                    else {}
                ),
                "task_data_root": self.executor.sandbox.paths.task_data_root.rstrip("/"),
                "home": self.executor.sandbox.paths.home.rstrip("/"),
                "work_dir_base": self.executor.sandbox.paths.work_dir_base.rstrip("/"),
                **{k: v for k, v in match.groupdict().items() if v is not None},
            }
            await self._run_plan(index, plan, variables)
        except _PlanFailedError as exc:
            status, error = "failed", str(exc)
        except Exception as exc:  # a bug or an unexpected failure: still a result, not a crash of the runner
            status, error = "failed", f"scripted agent error: {_describe(exc)}"
        except BaseException as exc:  # cancelled (the runner's timeout) or interrupted: record, re-raise
            self._record("end", status="cancelled", error=_describe(exc))
            self._flush_bridge_logs()
            raise
        self._record("end", status=status, error=error)
        self._flush_bridge_logs()
        return AgentRunResult(
            status=status,
            error=error,
            duration_s=time.monotonic() - started,
            logs=[RAW_LOG, *self._bridge_logs],
        )

    def _select(self, prompt: str) -> tuple[int, Plan, re.Match[str]] | None:
        for index, plan in enumerate(self.settings.plans):
            match = re.search(plan.match, prompt)
            if match is not None:
                return index, plan, match
        return None

    async def _run_plan(self, index: int, plan: Plan, variables: dict[str, str]) -> None:
        needed: list[BridgeName] = sorted({step.bridge for step in plan.steps})
        # Both bridges start at once: each is a Python process that takes seconds to come up.
        start_timeout = self.settings.bridge_start_timeout_s
        bridges = {kind: _Bridge(kind, self.executor.bridge(kind), start_timeout) for kind in needed}
        try:
            for bridge in bridges.values():
                await bridge.wait_ready()
            # Check every tool name before the first call, so a typo fails fast and leaves the sandbox alone.
            for number, step in enumerate(plan.steps, start=1):
                tools = bridges[step.bridge].tools
                if step.tool not in tools:
                    raise _PlanFailedError(
                        f"plan {index} step {number}: the {step.bridge} bridge has no tool {step.tool!r} "
                        f"(it has: {', '.join(sorted(tools))})"
                    )
            for number, step in enumerate(plan.steps, start=1):
                arguments = fill(step.args, variables)
                outcome = await self._call(bridges[step.bridge].session, step, arguments)
                where = f"plan {index} step {number} ({step.bridge}.{step.tool})"
                if outcome.is_error and not step.expect_error:
                    raise _PlanFailedError(f"{where} failed: {_first_line(outcome.text)}")
                if step.expect_error and not outcome.is_error:
                    raise _PlanFailedError(f"{where} was expected to fail but succeeded")
                if step.save_as:
                    variables[step.save_as] = outcome.saved_value
        finally:
            for kind, bridge in bridges.items():
                log = await bridge.close()
                if log.strip():
                    self._pending_bridge_logs.append((f"scripted/bridge-{kind}.log", log))

    async def _call(self, session: ClientSession, step: PlanStep, arguments: dict[str, Any]) -> _Outcome:
        self._call_number += 1
        number = self._call_number
        started_at = _now()
        start = time.monotonic()
        try:
            result = await session.call_tool(step.tool, arguments, read_timeout_seconds=self.settings.call_timeout_s)
        except Exception as exc:
            outcome = _Outcome(text=f"call failed: {_describe(exc)}", is_error=True)
        else:
            outcome = self._outcome(number, result)
        self._record(
            "call",
            n=number,
            bridge=step.bridge,
            tool=step.tool,
            note=step.note,
            arguments=arguments,
            result=outcome.text,
            is_error=outcome.is_error,
            structured=outcome.structured,
            screenshots=outcome.screenshots,
            started_at=started_at,
            duration_s=round(time.monotonic() - start, 4),
        )
        return outcome

    def _outcome(self, number: int, result: object) -> _Outcome:
        if not isinstance(result, CallToolResult):
            return _Outcome(text=f"unexpected reply type {type(result).__name__}", is_error=True)
        texts: list[str] = []
        screenshots: list[str] = []
        for block in result.content:
            if isinstance(block, TextContent):
                texts.append(block.text)
            elif isinstance(block, ImageContent):
                ext = _IMAGE_EXTENSIONS.get(block.mime_type, "png")
                suffix = "" if not screenshots else f"-{len(screenshots) + 1}"
                # the trajectory's step: the prompt is step 1, call n is step n + 1
                relpath = f"{SCREENSHOT_DIR}/step-{number + 1}{suffix}.{ext}"
                try:
                    self._write_bytes(relpath, base64.b64decode(block.data, validate=True))
                except (binascii.Error, ValueError) as exc:
                    texts.append(f"[image not saved: {exc}]")
                    continue
                screenshots.append(relpath)
            else:
                texts.append(f"[{getattr(block, 'type', type(block).__name__)} content]")
        structured = result.structured_content if isinstance(result.structured_content, dict) else None
        return _Outcome(
            text="\n".join(texts),
            is_error=bool(result.is_error),
            structured=structured,
            screenshots=screenshots,
        )

    # -- records ---------------------------------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        """Mask secret values before anything is written (the executor redacts again on write)."""
        for name in self.config.secrets:
            value = self.executor.env.get(name)
            if value:
                text = text.replace(value, _SECRET_MASK)
        return text

    def _record(self, kind: str, **fields: Any) -> None:
        """Append one JSON line to the raw log and rewrite it, so it is complete even if we are cancelled."""
        line = json.dumps({"type": kind, "t": _now(), **fields}, ensure_ascii=False, default=str)
        self._records.append(self._scrub(line) + "\n")
        self.executor.write_text(RAW_LOG, "".join(self._records))

    def _write_bytes(self, relpath: str, data: bytes) -> None:
        self.executor.write_bytes(relpath, data)

    def _flush_bridge_logs(self) -> None:
        for relpath, text in self._pending_bridge_logs:
            self.executor.write_text(relpath, self._scrub(text))
            self._bridge_logs.append(relpath)
        self._pending_bridge_logs = []

    # -- trajectory ------------------------------------------------------------------------------------

    def parse_artifacts(self, result: AgentRunResult) -> Trajectory:
        """The ATIF trajectory, rebuilt from the raw log alone: the prompt, then one agent step per call."""
        records = self._read_log()
        start: dict[str, Any] = next((r for r in records if r.get("type") == "start"), {})
        end: dict[str, Any] = next((r for r in reversed(records) if r.get("type") == "end"), {})
        builder = TrajectoryBuilder(
            session_id=str(start.get("session_id") or f"{self.config.name}-{uuid.uuid4().hex[:12]}"),
            agent=AgentInfo(name=self.config.name, version=f"scripted-{AGENT_VERSION}", model_name=None),
        )
        if "prompt" in start:
            prompt = builder.add("user", str(start["prompt"]))
            prompt.timestamp = str(start.get("t") or prompt.timestamp)  # when the agent got it, not now
        for call in (r for r in records if r.get("type") == "call"):
            extra: dict[str, Any] = {
                "bridge": call.get("bridge"),
                "tool": call.get("tool"),
                "duration_s": call.get("duration_s"),
                "started_at": call.get("started_at"),
            }
            if call.get("screenshots"):
                extra["screenshots"] = call["screenshots"]
            if call.get("structured") is not None:
                extra["structured_content"] = call["structured"]
            step = builder.add_tool_call(
                f"{call.get('bridge')}.{call.get('tool')}",
                dict(call.get("arguments") or {}),
                str(call.get("result", "")),
                is_error=bool(call.get("is_error")),
                message=str(call.get("note") or f"call {call.get('n')}"),
                observation_extra=extra,
            )
            step.timestamp = str(call.get("started_at") or step.timestamp)
        status = end.get("status") or result.status
        error = end.get("error") or result.error
        notes = f"scripted plan {start.get('plan_index')}: {status}" + (f" ({error})" if error else "")
        return builder.build(
            notes=notes,
            extra={
                "status": status,
                "error": error,
                "plan_index": start.get("plan_index"),
                "plan_match": start.get("plan_match"),
                "raw_log": RAW_LOG,
            },
        )

    def _read_log(self) -> list[dict[str, Any]]:
        if not self.executor.exists(RAW_LOG):
            return []
        records = []
        for line in self.executor.read_text(RAW_LOG).splitlines():
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a torn last line (killed mid-write): skip it
                if isinstance(record, dict):
                    records.append(record)
        return records


class _Bridge:
    """One MCP bridge process and its client session, held open by a task of its own.

    ``stdio_client`` and ``ClientSession`` are anyio contexts that must be entered and left by the same
    task; a holder task per bridge lets both bridges start in parallel, and the plan's calls go through
    ``session`` from the deployer's task (the session's streams do not care which task sends).
    The bridge's stderr goes to a temporary file, returned by ``close`` so it can reach the work dir
    through the executor (redacted).
    """

    def __init__(self, kind: BridgeName, launch: BridgeLaunch, start_timeout_s: float) -> None:
        self.kind = kind
        self.command = " ".join([launch.command, *launch.args])
        self._params = StdioServerParameters(command=launch.command, args=list(launch.args), env=dict(launch.env))
        self._start_timeout_s = start_timeout_s
        self._errlog: TextIO = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
        self._ready: asyncio.Future[tuple[ClientSession, set[str]]] = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._hold(), name=f"scripted-bridge-{kind}")
        self.session: ClientSession
        self.tools: set[str] = set()

    async def _hold(self) -> None:
        try:
            async with (
                stdio_client(self._params, errlog=self._errlog) as (read, write),
                ClientSession(read, write, read_timeout_seconds=self._start_timeout_s) as session,
            ):
                await session.initialize()
                names: set[str] = set()
                cursor: str | None = None
                while True:
                    page = PaginatedRequestParams(cursor=cursor) if cursor else None
                    listing = await session.list_tools(params=page)
                    names.update(tool.name for tool in listing.tools)
                    cursor = listing.next_cursor
                    if not cursor:
                        break
                if not self._ready.done():
                    self._ready.set_result((session, names))
                await self._stop.wait()
        except BaseException as exc:
            if not self._ready.done():
                self._ready.set_exception(exc)
            if not isinstance(exc, Exception):
                raise

    async def wait_ready(self) -> None:
        try:
            self.session, self.tools = await asyncio.shield(self._ready)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            detail = _describe(exc)
            raise _PlanFailedError(f"cannot start the {self.kind} MCP bridge ({self.command}): {detail}") from exc

    async def close(self) -> str:
        """Stop the bridge (its process ends with the stdio client) and return what it wrote to stderr."""
        self._stop.set()
        if not self._ready.done():
            self._task.cancel()  # still starting: nothing to wind down politely
        with contextlib.suppress(BaseException):
            await self._task
        try:
            self._errlog.seek(0)
            return self._errlog.read()
        except (OSError, ValueError):
            return ""
        finally:
            self._errlog.close()


@dataclass(frozen=True)
class _Outcome:
    """One tool call's result, as the plan sees it."""

    text: str
    is_error: bool
    structured: dict[str, Any] | None = None
    screenshots: list[str] = field(default_factory=list)

    @property
    def saved_value(self) -> str:
        """What ``save_as`` stores: a command's stdout (stripped) when there is one, else the text."""
        if self.structured is not None and isinstance(self.structured.get("stdout"), str):
            return str(self.structured["stdout"]).strip()
        return self.text


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _describe(exc.exceptions[0])
    text = str(exc).strip()
    return f"{type(exc).__name__}: {_first_line(text)}" if text else type(exc).__name__


def _first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else "(no message)"
