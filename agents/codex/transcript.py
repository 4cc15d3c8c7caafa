"""Codex's ``codex exec --json`` transcript, read into an ATIF trajectory.

Pure functions, no I/O: the deployer reads the log through its executor and writes the images this
returns. The log is the CLI's stdout and stderr in one file, so lines that are not JSON events
(stderr notices such as ``Reading additional input from stdin...``) are kept aside as the log's
tail, for errors.

Events (Codex 0.171.0): ``thread.started`` (the session id), ``turn.started``, ``item.started`` and
``item.completed`` (items ``agent_message``, ``reasoning``, ``mcp_tool_call``, ``command_execution``,
``file_change``, ``web_search``, ``todo_list``, ``error``), ``error`` (retry notices), and per turn
``turn.completed`` (``usage``) or ``turn.failed`` (``error.message``). A tool call is paired with
its result by the item's id, which both of its events carry.

Each event and item is read into a model of its type (below); the CLI adds fields in releases, so the
models ignore fields they do not name. An event of a known type that does not fit its model is kept as an
``UnreadableEvent`` and becomes a system step that says so; events and items of other types are skipped.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import (
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


# -- the items --------------------------------------------------------------------------------------------


def _objects(value: object) -> list[dict[str, Any]]:
    """The JSON objects of a list (anything else in it, or a value that is no list: none)."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _object_or_empty(value: object) -> object:
    return value if isinstance(value, dict) else {}


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class TextPart(_Model):
    type: Literal["text"]
    text: str = ""


class ImagePart(_Model):
    type: Literal["image"]
    data: str = ""
    mime_type: str | None = None
    mime_type_camel: str | None = Field(default=None, validation_alias="mimeType")

    @property
    def media_type(self) -> str:
        return self.mime_type_camel or self.mime_type or "image/png"

    def decoded(self) -> bytes | None:
        try:
            return base64.b64decode(self.data, validate=True)
        except (binascii.Error, ValueError):
            return None


class OtherPart(RootModel[dict[str, JsonValue]]):
    """A content block that is neither text nor an image: shown as the JSON it came as."""


def _part_kind(value: object) -> str:
    kind = value.get("type") if isinstance(value, dict) else None
    return kind if kind in ("text", "image") else "other"


ContentPart = Annotated[
    Annotated[TextPart, Tag("text")] | Annotated[ImagePart, Tag("image")] | Annotated[OtherPart, Tag("other")],
    Discriminator(_part_kind),
]


class McpResult(_Model):
    content: Annotated[list[ContentPart], BeforeValidator(_objects)] = []
    structured_content: JsonValue = None
    is_error: bool = False

    def text(self, images: list[tuple[str, bytes]]) -> str:
        """The result's text blocks (its structured content when it has none); image blocks are collected
        into ``images`` (media type, bytes)."""
        parts: list[str] = []
        for part in self.content:
            if isinstance(part, TextPart):
                parts.append(part.text)
            elif isinstance(part, ImagePart):
                data = part.decoded()
                if data is None:
                    parts.append("[image: not valid base64]")
                else:
                    images.append((part.media_type, data))
            else:
                parts.append(json.dumps(part.root))
        if not parts and self.structured_content is not None:
            parts.append(json.dumps(self.structured_content))
        return "\n".join(parts)


class _Item(_Model):
    id: str | None = None


class _ToolItem(_Item):
    status: str | None = None

    @property
    def failed(self) -> bool:
        return self.status == "failed"


class McpToolCall(_ToolItem):
    type: Literal["mcp_tool_call"]
    server: str | None = None
    tool: str | None = None
    arguments: Annotated[dict[str, JsonValue], BeforeValidator(_object_or_empty)] = {}
    result: Annotated[McpResult | None, BeforeValidator(lambda v: v if isinstance(v, dict) else None)] = None
    error: JsonValue = None
    """The call's failure: an object with a ``message``, or a message."""

    def call(self) -> tuple[str, dict[str, JsonValue]]:
        return f"mcp__{self.server}__{self.tool}", dict(self.arguments)

    def outcome(self, images: list[tuple[str, bytes]]) -> tuple[str, bool]:
        text = self.result.text(images) if self.result is not None else ""
        is_error = self.failed or bool(self.error) or (self.result is not None and self.result.is_error)
        if self.error:
            message = self.error.get("message") if isinstance(self.error, dict) else self.error
            text = f"{text}\n{message}".strip() if text else str(message)
        return text, is_error


class CommandExecution(_ToolItem):
    type: Literal["command_execution"]
    command: str = ""
    aggregated_output: str | None = None
    exit_code: int | None = None

    def call(self) -> tuple[str, dict[str, JsonValue]]:
        return "exec_command", {"command": self.command}  # as run: `/bin/bash -lc '<cmd>'`

    def outcome(self, images: list[tuple[str, bytes]]) -> tuple[str, bool]:
        text = self.aggregated_output or ""
        code = self.exit_code
        return f"{text}\n[exit code {code}]" if code is not None else text, self.failed or code not in (0, None)


class FileChange(_ToolItem):
    type: Literal["file_change"]
    changes: JsonValue = Field(default_factory=list)

    def call(self) -> tuple[str, dict[str, JsonValue]]:
        return "apply_patch", {"changes": self.changes}

    def outcome(self, images: list[tuple[str, bytes]]) -> tuple[str, bool]:
        return json.dumps(self.changes), self.failed


class WebSearch(_ToolItem):
    type: Literal["web_search"]
    query: JsonValue = ""
    details: dict[str, JsonValue]
    """The item as the CLI wrote it, less its id and type: its result."""

    @model_validator(mode="before")
    @classmethod
    def _keep_details(cls, data: object) -> object:
        if isinstance(data, dict):
            return {**data, "details": {k: v for k, v in data.items() if k not in ("id", "type")}}
        return data

    def call(self) -> tuple[str, dict[str, JsonValue]]:
        return "web_search", {"query": self.query}

    def outcome(self, images: list[tuple[str, bytes]]) -> tuple[str, bool]:
        return json.dumps(self.details), self.failed


ToolItem = McpToolCall | CommandExecution | FileChange | WebSearch


class AgentMessage(_Item):
    type: Literal["agent_message"]
    text: str = ""


class Reasoning(_Item):
    type: Literal["reasoning"]
    text: str = ""


class TodoList(_Item):
    type: Literal["todo_list"]
    items: JsonValue = Field(default_factory=list)


class ErrorItem(_Item):
    type: Literal["error"]
    message: str = ""


class OtherItem(_Item):
    """An item of a type this parser does not read (or none: an event without an item)."""


_ITEM_TYPES = frozenset(
    {
        "mcp_tool_call",
        "command_execution",
        "file_change",
        "web_search",
        "agent_message",
        "reasoning",
        "todo_list",
        "error",
    }
)


def _item_kind(value: object) -> str:
    kind = value.get("type") if isinstance(value, dict) else None
    return kind if isinstance(kind, str) and kind in _ITEM_TYPES else "other"


Item = Annotated[
    Annotated[McpToolCall, Tag("mcp_tool_call")]
    | Annotated[CommandExecution, Tag("command_execution")]
    | Annotated[FileChange, Tag("file_change")]
    | Annotated[WebSearch, Tag("web_search")]
    | Annotated[AgentMessage, Tag("agent_message")]
    | Annotated[Reasoning, Tag("reasoning")]
    | Annotated[TodoList, Tag("todo_list")]
    | Annotated[ErrorItem, Tag("error")]
    | Annotated[OtherItem, Tag("other")],
    Discriminator(_item_kind),
    BeforeValidator(_object_or_empty),
]


# -- the events -------------------------------------------------------------------------------------------


class ThreadStarted(_Model):
    type: Literal["thread.started"]
    thread_id: str | None = None


class ItemStarted(_Model):
    type: Literal["item.started"]
    item: Item = OtherItem()


class ItemCompleted(_Model):
    type: Literal["item.completed"]
    item: Item = OtherItem()


class ErrorEvent(_Model):
    type: Literal["error"]
    message: str = ""


class Usage(_Model):
    input_tokens: int | None = None
    cached_input_tokens: int | None = None
    output_tokens: int | None = None


class TurnCompleted(_Model):
    type: Literal["turn.completed"]
    usage: Annotated[Usage | None, BeforeValidator(lambda v: v if isinstance(v, dict) else None)] = None


class TurnFailed(_Model):
    type: Literal["turn.failed"]
    error: JsonValue = None
    """An object with a ``message``, or a message."""

    def failure(self) -> str:
        message = self.error.get("message") if isinstance(self.error, dict) else self.error
        return str(message or "turn failed")


class OtherEvent(_Model):
    """An event of a type this parser does not read (``turn.started``, ...)."""

    type: str


_EVENT_TYPES = ("thread.started", "item.started", "item.completed", "error", "turn.completed", "turn.failed")


def _event_kind(value: object) -> str:
    kind = value.get("type") if isinstance(value, dict) else None
    return kind if kind in _EVENT_TYPES else "other"


ReadEvent = ThreadStarted | ItemStarted | ItemCompleted | ErrorEvent | TurnCompleted | TurnFailed | OtherEvent
Event = ReadEvent | UnreadableEvent
_EVENT: TypeAdapter[ReadEvent] = TypeAdapter(
    Annotated[
        Annotated[ThreadStarted, Tag("thread.started")]
        | Annotated[ItemStarted, Tag("item.started")]
        | Annotated[ItemCompleted, Tag("item.completed")]
        | Annotated[ErrorEvent, Tag("error")]
        | Annotated[TurnCompleted, Tag("turn.completed")]
        | Annotated[TurnFailed, Tag("turn.failed")]
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
    def thread(self) -> ThreadStarted | None:
        return next((e for e in self.events if isinstance(e, ThreadStarted)), None)

    @property
    def completed_turns(self) -> list[TurnCompleted]:
        return [e for e in self.events if isinstance(e, TurnCompleted)]

    @property
    def failed_turns(self) -> list[TurnFailed]:
        return [e for e in self.events if isinstance(e, TurnFailed)]

    def tail(self, lines: int = TAIL_LINES) -> str:
        kept = [line for line in self.other_lines if line.strip()]
        return "\n".join(kept[-lines:])


def read_transcript(text: str) -> Transcript:
    return Transcript(*read_events(text, _EVENT))


def run_error(transcript: Transcript, exit_code: int | None) -> str | None:
    """Why the run failed, or None when it completed: exit 0, a completed turn and no failed one."""
    failed = transcript.failed_turns
    if failed:
        return f"turn failed: {failed[-1].failure()}"
    if not transcript.completed_turns:
        where = "before writing a transcript" if not transcript.events else "without completing a turn"
        tail = transcript.tail()
        return f"the CLI exited {exit_code} {where}" + (f": {tail}" if tail else "")
    if exit_code != 0:
        tail = transcript.tail()
        return f"the CLI exited {exit_code}" + (f": {tail}" if tail else "")
    return None


@dataclass
class Parsed:
    trajectory: Trajectory
    images: dict[str, bytes] = field(default_factory=dict)
    """Work-dir-relative path -> bytes of each image a tool returned (screenshots)."""


def _usage_metrics(transcript: Transcript) -> TokenMetrics:
    usages = [turn.usage for turn in transcript.completed_turns if turn.usage is not None]
    if not usages:
        return {}
    return {
        # OpenAI's input_tokens include the cached ones; output_tokens include reasoning
        "total_prompt_tokens": sum(u.input_tokens or 0 for u in usages),
        "total_completion_tokens": sum(u.output_tokens or 0 for u in usages),
        "total_cached_tokens": sum(u.cached_input_tokens or 0 for u in usages),
    }


# -- the trajectory ---------------------------------------------------------------------------------------


class _Steps:
    """The trajectory's steps, added event by event."""

    def __init__(self, builder: TrajectoryBuilder, image_dir: str) -> None:
        self.builder = builder
        self.image_dir = image_dir
        self.images: dict[str, bytes] = {}
        self.open_calls: dict[str, Step] = {}
        """item id -> its step, until its item.completed."""
        self.last_system = ""

    def system(self, message: str, **extra: JsonValue) -> None:
        """A system step, unless it says again what the one before said."""
        if message != self.last_system:
            self.builder.add("system", message, **extra)
            self.last_system = message

    def add(self, event: Event) -> None:
        match event:
            case ItemStarted(item=McpToolCall() | CommandExecution() | FileChange() | WebSearch() as item):
                self.start_call(item)
            case ItemCompleted(item=McpToolCall() | CommandExecution() | FileChange() | WebSearch() as item):
                self.end_call(item)
            case ItemCompleted(item=AgentMessage() as item):
                self.builder.add("agent", item.text)
            case ItemCompleted(item=Reasoning() as item):
                self.builder.add("agent", "", reasoning=item.text)
            case ItemCompleted(item=TodoList() as item):
                self.builder.add("agent", "", plan=item.items)
            case ItemCompleted(item=ErrorItem() as item):
                self.system(f"codex: {item.message}", level="warning")
            case ErrorEvent():
                self.system(f"codex: {event.message}")
            case TurnFailed():
                self.system(f"turn failed: {event.failure()}")
            case UnreadableEvent():
                self.system(f"unreadable {event.type} event in the transcript ({event.error})")

    def start_call(self, item: ToolItem) -> Step:
        name, arguments = item.call()
        item_id = item.id or f"item_{len(self.open_calls)}"
        step = self.builder.add_tool_call(name, arguments, NO_RESULT, is_error=True, call_id=item_id)
        self.open_calls[item_id] = step
        return step

    def end_call(self, item: ToolItem) -> None:
        """The call's result, in the step its item.started opened (or in a new one, if none did)."""
        step = self.open_calls.pop(str(item.id), None) or self.start_call(item)
        self.open_calls.pop(str(item.id), None)
        if step.observation is None:  # a tool call step always has one
            return
        found: list[tuple[str, bytes]] = []
        result = step.observation.results[0]
        result.content, result.is_error = item.outcome(found)
        saved = []
        for number, (media_type, data) in enumerate(found, start=1):
            suffix = f"-{number}" if len(found) > 1 else ""
            rel = f"{self.image_dir}/step-{step.step_id}{suffix}.{_IMAGE_EXTENSIONS.get(media_type, 'bin')}"
            self.images[rel] = data
            saved.append(rel)
        if saved:
            result.extra = {"screenshots": saved}
            if not result.content:
                result.content = f"[{len(saved)} image(s)]"

    def ending(self, transcript: Transcript, status: str, exit_code: int | None, error: str | None) -> None:
        """How the run ended, when the log does not say it: stopped from outside, or the CLI gone."""
        ended = transcript.completed_turns or transcript.failed_turns
        tail = transcript.tail()
        said = f": {tail}" if tail else ""
        if not ended and status == "timeout":
            self.system(f"the run was stopped: {error or 'timeout'}")
        elif not ended and not transcript.events:
            self.system(f"the CLI exited {exit_code} before writing a transcript{said}")
        elif not ended:
            self.system(f"the CLI exited {exit_code} without completing a turn{said}")
        elif status != "completed" and error and not transcript.failed_turns:
            self.system(error)


def _run_info(
    transcript: Transcript, steps: list[Step], status: str, exit_code: int | None, error: str | None
) -> dict[str, JsonValue]:
    """The trajectory's ``extra``: the run's result and, after a completed turn, the final answer."""
    info: dict[str, JsonValue] = {"status": status, "exit_code": exit_code}
    if error:
        info["error"] = error
    answers = [s.message for s in steps if s.source == "agent" and s.message and not s.tool_calls]
    if answers and transcript.completed_turns:
        info["final_answer"] = answers[-1]
    return info


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
    thread = transcript.thread
    builder = TrajectoryBuilder((thread.thread_id if thread else None) or session_id, agent)
    steps = _Steps(builder, image_dir)
    if prompt is not None:
        builder.add("user", prompt)
    for event in transcript.events:
        steps.add(event)
    steps.ending(transcript, status, exit_code, error)
    info = _run_info(transcript, builder.steps, status, exit_code, error)
    return Parsed(builder.build(extra=info, **_usage_metrics(transcript)), steps.images)
