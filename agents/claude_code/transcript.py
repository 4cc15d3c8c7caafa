"""Claude Code's ``--output-format stream-json --verbose`` transcript, read into an ATIF trajectory.

Pure functions, no I/O: the deployer reads the log through its executor and writes the images this
returns. The log is the CLI's stdout and stderr in one file, so lines that are not JSON events
(stderr notices) are kept aside as the log's tail, for errors.

Events (Claude Code 2.1.332): ``system/init`` (tools, MCP servers and their status), ``assistant``
(one per content block: text, thinking or tool_use; its ``usage`` is a placeholder),
``user`` (tool results, paired with their call by ``tool_use_id``), ``system/api_retry``,
``system/permission_denied``, and a final ``result`` (``is_error``, ``terminal_reason``,
``api_error_status``, ``usage``, ``modelUsage``, ``total_cost_usd``). ``result.subtype`` says
``success`` even for API errors, so it is not read.

Each event is read into a model of its type (below); the CLI adds fields in every release, so the models
ignore fields they do not name. An event of a known type that does not fit its model is kept as an
:class:`UnreadableEvent` and becomes a system step that says so; events of other types are skipped.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import (
    AliasGenerator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    JsonValue,
    RootModel,
    Tag,
    TypeAdapter,
    model_validator,
)
from pydantic.alias_generators import to_camel

from ale_iac.agent_sdk import (
    AgentInfo,
    Step,
    TokenMetrics,
    Trajectory,
    TrajectoryBuilder,
    UnreadableEvent,
    read_events,
)

TAIL_LINES = 12
NO_RESULT = "(no result: the run ended before the tool returned)"
_IMAGE_EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/webp": "webp", "image/gif": "gif"}
_RESULT_EXTRAS = ("terminal_reason", "num_turns", "duration_ms", "stop_reason")


# -- the events -------------------------------------------------------------------------------------------


def _objects(value: object) -> list[dict[str, Any]]:
    """The JSON objects of a list (anything else in it, or a value that is no list: none)."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _string_or_none(value: object) -> object:
    return value if isinstance(value, str) else None


def _empty_if_none(value: object) -> object:
    return {} if value is None else value


Stamp = Annotated[str | None, BeforeValidator(_string_or_none)]
"""An event's ``timestamp``: anything but a string is no timestamp."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class TextBlock(_Model):
    type: Literal["text"]
    text: str = ""


class ThinkingBlock(_Model):
    type: Literal["thinking"]
    thinking: str = ""


class ToolUseBlock(_Model):
    type: Literal["tool_use"]
    id: str | None = None
    name: str = "?"
    input: Annotated[dict[str, JsonValue], BeforeValidator(lambda v: v if isinstance(v, dict) else {})] = {}


class OtherBlock(_Model):
    """A content block of a type this parser does not read."""


def _block_kind(value: object) -> str:
    kind = value.get("type") if isinstance(value, dict) else None
    return kind if kind in ("text", "thinking", "tool_use") else "other"


AssistantBlock = Annotated[
    Annotated[TextBlock, Tag("text")]
    | Annotated[ThinkingBlock, Tag("thinking")]
    | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[OtherBlock, Tag("other")],
    Discriminator(_block_kind),
]


class ImageSource(_Model):
    data: str = ""
    media_type: str = "image/png"


class ImagePart(_Model):
    type: Literal["image"]
    source: Annotated[ImageSource, BeforeValidator(_empty_if_none)] = ImageSource()

    def decoded(self) -> bytes | None:
        try:
            return base64.b64decode(self.source.data, validate=True)
        except (binascii.Error, ValueError):
            return None


class OtherPart(RootModel[dict[str, JsonValue]]):
    """A part of a tool result that is neither text nor an image: shown as the JSON it came as."""


def _part_kind(value: object) -> str:
    kind = value.get("type") if isinstance(value, dict) else None
    return kind if kind in ("text", "image") else "other"


ResultPart = Annotated[
    Annotated[TextBlock, Tag("text")] | Annotated[ImagePart, Tag("image")] | Annotated[OtherPart, Tag("other")],
    Discriminator(_part_kind),
]
ResultContent = Annotated[str | list[ResultPart], BeforeValidator(lambda v: v if isinstance(v, str) else _objects(v))]
"""A tool result's content: a string, or text, image and other parts."""


class ToolResultBlock(_Model):
    type: Literal["tool_result"]
    tool_use_id: str | None = None
    content: ResultContent = ""
    is_error: bool = False


def _user_block_kind(value: object) -> str:
    return "tool_result" if isinstance(value, dict) and value.get("type") == "tool_result" else "other"


UserBlock = Annotated[
    Annotated[ToolResultBlock, Tag("tool_result")] | Annotated[OtherBlock, Tag("other")],
    Discriminator(_user_block_kind),
]


class _Event(_Model):
    timestamp: Stamp = None


class McpServer(BaseModel):
    """One MCP server in ``system/init`` (its other fields kept: the trajectory shows them)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    name: str | None = None
    status: str | None = None


class InitEvent(_Event):
    type: Literal["system"]
    subtype: Literal["init"]
    session_id: str | None = None
    claude_code_version: str | None = None
    model: str | None = None
    tools: JsonValue = None
    """Passed on to the trajectory as the CLI wrote it."""
    mcp_servers: Annotated[list[McpServer] | None, BeforeValidator(lambda v: None if v is None else _objects(v))] = None


class ApiRetryEvent(_Event):
    type: Literal["system"]
    subtype: Literal["api_retry"]
    attempt: int | None = None
    max_retries: int | None = None
    error_status: int | None = None
    error: str | None = None


class PermissionDeniedEvent(_Event):
    type: Literal["system"]
    subtype: Literal["permission_denied"]
    details: dict[str, JsonValue]
    """The event as the CLI wrote it, less its type."""

    @model_validator(mode="before")
    @classmethod
    def _keep_details(cls, data: object) -> object:
        if isinstance(data, dict):
            return {**data, "details": {k: v for k, v in data.items() if k != "type"}}
        return data


class AssistantMessage(_Model):
    id: str | None = None
    model: str | None = None
    content: Annotated[list[AssistantBlock], BeforeValidator(_objects)] = []


class AssistantEvent(_Event):
    type: Literal["assistant"]
    message: Annotated[AssistantMessage, BeforeValidator(_empty_if_none)] = AssistantMessage()
    parent_tool_use_id: str | None = None
    is_api_error_message: bool = False
    api_error_status: int | None = None

    @property
    def api_error(self) -> bool:
        """A message the CLI made up to report an API error (no model wrote it)."""
        return self.is_api_error_message or self.message.model == "<synthetic>"


class UserMessage(_Model):
    content: Annotated[list[UserBlock], BeforeValidator(_objects)] = []


class UserEvent(_Event):
    type: Literal["user"]
    message: Annotated[UserMessage, BeforeValidator(_empty_if_none)] = UserMessage()


class Usage(_Model):
    input_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    output_tokens: int | None = None


class ModelUsage(Usage):
    """One model's usage in ``modelUsage``: the same counts, in camelCase."""

    model_config = ConfigDict(extra="ignore", frozen=True, alias_generator=AliasGenerator(validation_alias=to_camel))


class ResultEvent(_Event):
    type: Literal["result"]
    is_error: bool = False
    subtype: str | None = None
    terminal_reason: str | None = None
    api_error_status: int | None = None
    result: JsonValue = None
    errors: Annotated[list[JsonValue], BeforeValidator(lambda v: v or [])] = []
    usage: Annotated[Usage | None, BeforeValidator(lambda v: v if isinstance(v, dict) else None)] = None
    model_usage: Annotated[
        dict[str, ModelUsage],
        BeforeValidator(lambda v: {k: m for k, m in v.items() if isinstance(m, dict)} if isinstance(v, dict) else {}),
    ] = Field(default={}, validation_alias="modelUsage")
    total_cost_usd: Annotated[float | None, BeforeValidator(lambda v: v if isinstance(v, int | float) else None)] = None
    num_turns: int | None = None
    duration_ms: int | float | None = None
    stop_reason: str | None = None

    def failure(self) -> str:
        """What the CLI said went wrong: its result text, or its errors."""
        return str(self.result or "; ".join(str(e) for e in self.errors))


class OtherEvent(_Event):
    """An event of a type (or system subtype) this parser does not read."""

    type: str


def _event_kind(value: object) -> str:
    if not isinstance(value, dict):
        return "other"
    kind = value.get("type")
    if kind == "system":
        subtype = value.get("subtype")
        return f"system/{subtype}" if subtype in ("init", "api_retry", "permission_denied") else "other"
    return kind if kind in ("assistant", "user", "result") else "other"


ReadEvent = InitEvent | ApiRetryEvent | PermissionDeniedEvent | AssistantEvent | UserEvent | ResultEvent | OtherEvent
Event = ReadEvent | UnreadableEvent
_EVENT: TypeAdapter[ReadEvent] = TypeAdapter(
    Annotated[
        Annotated[InitEvent, Tag("system/init")]
        | Annotated[ApiRetryEvent, Tag("system/api_retry")]
        | Annotated[PermissionDeniedEvent, Tag("system/permission_denied")]
        | Annotated[AssistantEvent, Tag("assistant")]
        | Annotated[UserEvent, Tag("user")]
        | Annotated[ResultEvent, Tag("result")]
        | Annotated[OtherEvent, Tag("other")],
        Discriminator(_event_kind),
    ]
)


# -- the transcript ---------------------------------------------------------------------------------------


@dataclass
class Transcript:
    """A log split into the CLI's JSON events and its other lines."""

    events: list[Event]
    other_lines: list[str]

    @property
    def init(self) -> InitEvent | None:
        return next((e for e in self.events if isinstance(e, InitEvent)), None)

    @property
    def result(self) -> ResultEvent | None:
        return next((e for e in reversed(self.events) if isinstance(e, ResultEvent)), None)

    def tail(self, lines: int = TAIL_LINES) -> str:
        kept = [line for line in self.other_lines if line.strip()]
        return "\n".join(kept[-lines:])


def read_transcript(text: str) -> Transcript:
    return Transcript(*read_events(text, _EVENT))


def failed_servers(transcript: Transcript) -> list[str]:
    """MCP servers the CLI could not start (``init.mcp_servers[].status`` other than connected)."""
    init = transcript.init
    servers = (init.mcp_servers if init else None) or []
    return [f"{server.name} ({server.status})" for server in servers if server.status != "connected"]


def run_error(transcript: Transcript, exit_code: int | None) -> str | None:
    """Why the run failed, or None when it completed: exit 0, a final result that is not an error,
    and every MCP server connected."""
    result = transcript.result
    if result is None:
        where = "before writing a transcript" if not transcript.events else "without a final result"
        tail = transcript.tail()
        return f"the CLI exited {exit_code} {where}" + (f": {tail}" if tail else "")
    if result.is_error:
        reason = result.terminal_reason or result.subtype or "error"
        status = result.api_error_status
        return f"{reason}{f' (HTTP {status})' if status else ''}: {result.failure() or 'no detail'}"
    failed = failed_servers(transcript)
    if failed:
        return f"MCP server(s) failed to start: {', '.join(failed)}"
    if exit_code != 0:
        return f"the CLI exited {exit_code}" + (f": {transcript.tail()}" if transcript.tail() else "")
    return None


@dataclass
class Parsed:
    trajectory: Trajectory
    images: dict[str, bytes] = field(default_factory=dict)
    """Work-dir-relative path -> bytes of each image a tool returned (screenshots)."""


def _text_of(content: str | list[TextBlock | ImagePart | OtherPart], images: list[tuple[str, bytes]]) -> str:
    """A tool result's text; image parts are collected into ``images`` (media type, bytes)."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for part in content:
        if isinstance(part, TextBlock):
            parts.append(part.text)
        elif isinstance(part, ImagePart):
            data = part.decoded()
            if data is None:
                parts.append("[image: not valid base64]")
            else:
                images.append((part.source.media_type, data))
        else:
            parts.append(json.dumps(part.root))
    return "\n".join(parts)


def _usage_metrics(result: ResultEvent) -> TokenMetrics:
    if result.usage is not None:
        counts: list[Usage] = [result.usage]
    elif result.model_usage:  # older or partial results: add up the per-model usage
        counts = list(result.model_usage.values())
    else:
        return {}
    fresh = sum(c.input_tokens or 0 for c in counts)
    cache_read = sum(c.cache_read_input_tokens or 0 for c in counts)
    cache_write = sum(c.cache_creation_input_tokens or 0 for c in counts)
    return {
        # Anthropic's input_tokens excludes cached tokens; ATIF's prompt tokens include them
        "total_prompt_tokens": fresh + cache_read + cache_write,
        "total_completion_tokens": sum(c.output_tokens or 0 for c in counts),
        "total_cached_tokens": cache_read,
        "total_cost_usd": None if result.total_cost_usd is None else float(result.total_cost_usd),
    }


# -- the trajectory ---------------------------------------------------------------------------------------


class _Steps:
    """The trajectory's steps, added event by event."""

    def __init__(self, builder: TrajectoryBuilder, image_dir: str) -> None:
        self.builder = builder
        self.image_dir = image_dir
        self.images: dict[str, bytes] = {}
        self.pending: dict[str, Step] = {}
        """tool_use id -> its step."""
        self.texts: list[tuple[str, str, str | None]] = []
        """(message id, text, timestamp) of text blocks not yet placed."""
        self.last_system = ""

    def system(self, message: str, **extra: JsonValue) -> None:
        """A system step, unless it says again what the one before said."""
        if message != self.last_system:
            self.builder.add("system", message, **extra)
            self.last_system = message

    def flush_texts(self, keep_for: str | None = None) -> str:
        """Emit the buffered text blocks as agent steps, except those of message ``keep_for``: their
        text is returned, to become the message of that message's tool call step."""
        kept = []
        for mid, body, stamp in self.texts:
            if keep_for is not None and mid == keep_for:
                kept.append(body)
                continue
            _stamped(self.builder.add("agent", body), stamp)
        self.texts.clear()
        return "\n".join(kept)

    def add(self, event: Event) -> None:
        match event:
            case AssistantEvent():
                self.assistant(event)
            case UserEvent():
                self.flush_texts()
                for block in event.message.content:
                    if isinstance(block, ToolResultBlock):
                        self.tool_result(block)
            case ApiRetryEvent():
                self.flush_texts()
                self.system(f"API retry {event.attempt}/{event.max_retries} (HTTP {event.error_status}): {event.error}")
            case PermissionDeniedEvent():
                self.flush_texts()
                self.system(f"permission denied: {json.dumps(event.details)}")
            case ResultEvent():
                self.flush_texts()
                if event.is_error:
                    reason = event.terminal_reason or "error"
                    self.system(
                        event.failure() or reason, terminal_reason=reason, api_error_status=event.api_error_status
                    )
            case UnreadableEvent():
                self.flush_texts()
                self.system(f"unreadable {event.type} event in the transcript ({event.error})")

    def assistant(self, event: AssistantEvent) -> None:
        stamp = event.timestamp
        extra: dict[str, JsonValue] = (
            {"parent_tool_use_id": event.parent_tool_use_id} if event.parent_tool_use_id else {}
        )
        mid = event.message.id or ""
        if event.api_error:
            self.flush_texts()
            body = "\n".join(b.text for b in event.message.content if isinstance(b, TextBlock))
            status = event.api_error_status
            self.system(body or "API error", **({"api_error_status": status} if status else {}))
            return
        for block in event.message.content:
            if isinstance(block, TextBlock):
                self.texts.append((mid, block.text, stamp))
            elif isinstance(block, ThinkingBlock):
                self.flush_texts()
                _stamped(self.builder.add("agent", "", reasoning=block.thinking, **extra), stamp)
            elif isinstance(block, ToolUseBlock):
                said = self.flush_texts(keep_for=mid)
                call_id = block.id or f"call_{len(self.pending) + 1}"
                step = self.builder.add_tool_call(
                    block.name, dict(block.input), NO_RESULT, is_error=True, message=said, call_id=call_id
                )
                if extra:
                    step.extra = extra
                self.pending[call_id] = _stamped(step, stamp)

    def tool_result(self, block: ToolResultBlock) -> None:
        call = self.pending.get(str(block.tool_use_id))
        if call is None or call.observation is None:
            return
        found: list[tuple[str, bytes]] = []
        observed = call.observation.results[0]
        observed.content = _text_of(block.content, found)
        observed.is_error = block.is_error
        saved = []
        for number, (media_type, data) in enumerate(found, start=1):
            suffix = f"-{number}" if len(found) > 1 else ""
            rel = f"{self.image_dir}/step-{call.step_id}{suffix}.{_IMAGE_EXTENSIONS.get(media_type, 'bin')}"
            self.images[rel] = data
            saved.append(rel)
        if saved:
            observed.extra = {"screenshots": saved}
            if not observed.content:
                observed.content = f"[{len(saved)} image(s)]"

    def ending(self, transcript: Transcript, status: str, exit_code: int | None, error: str | None) -> None:
        """How the run ended, when the log does not say it: stopped from outside, or the CLI gone."""
        result = transcript.result
        tail = transcript.tail()
        said = f": {tail}" if tail else ""
        if result is None and status == "timeout":
            self.system(f"the run was stopped: {error or 'timeout'}")
        elif result is None and not transcript.events:
            self.system(f"the CLI exited {exit_code} before writing a transcript{said}")
        elif result is None:
            self.system(f"the CLI exited {exit_code} without a final result{said}")
        elif status != "completed" and error and not result.is_error:
            self.system(error)


def _stamped(step: Step, stamp: str | None) -> Step:
    if stamp:
        step.timestamp = stamp
    return step


def _run_info(transcript: Transcript, status: str, exit_code: int | None, error: str | None) -> dict[str, JsonValue]:
    """The trajectory's ``extra``: the run's result, the CLI's own words on it, its tools and MCP servers."""
    info: dict[str, JsonValue] = {"status": status, "exit_code": exit_code}
    if error:
        info["error"] = error
    result = transcript.result
    if result is not None:
        info.update({k: getattr(result, k) for k in _RESULT_EXTRAS if k in result.model_fields_set})
        if isinstance(result.result, str):
            info["final_answer"] = result.result
    init = transcript.init
    if init is not None:
        info["tools"] = init.tools
        servers = init.mcp_servers
        info["mcp_servers"] = (
            None if servers is None else [s.model_dump(mode="json", exclude_unset=True) for s in servers]
        )
    return info


def _agent_info(init: InitEvent | None, agent: AgentInfo) -> AgentInfo:
    """The agent as the CLI names itself (its version, its model), else as the deployer knows it."""
    version = init.claude_code_version if init else None
    model = init.model if init else None
    return AgentInfo(name=agent.name, version=version or agent.version, model_name=model or agent.model_name or None)


def to_trajectory(
    text: str,
    *,
    prompt: str | None,
    agent: AgentInfo,
    session_id: str,
    status: str,
    exit_code: int | None = None,
    error: str | None = None,
    image_dir: str = "screenshots",
) -> Parsed:
    """The trajectory of one run from its log ``text``; ``status``/``exit_code``/``error`` are the
    run's result (a run stopped from outside, say on a timeout, has no word of it in its log)."""
    transcript = read_transcript(text)
    init = transcript.init
    builder = TrajectoryBuilder((init.session_id if init else None) or session_id, _agent_info(init, agent))
    steps = _Steps(builder, image_dir)
    if prompt is not None:  # the prompt went in just before the first event
        _stamped(
            builder.add("user", prompt), next((e.timestamp for e in transcript.events if e.timestamp is not None), None)
        )
    for failed in failed_servers(transcript):
        steps.system(f"MCP server {failed} did not start: its tools are missing")
    for event in transcript.events:
        steps.add(event)
    steps.flush_texts()
    steps.ending(transcript, status, exit_code, error)
    result = transcript.result
    metrics: TokenMetrics = _usage_metrics(result) if result else {}
    trajectory = builder.build(extra=_run_info(transcript, status, exit_code, error), **metrics)
    return Parsed(trajectory, steps.images)
