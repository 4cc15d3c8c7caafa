"""Trajectories in an ATIF-compatible shape (Agent Trajectory Interchange Format, v1.4).

Root: ``schema_version``, ``session_id``, ``agent`` {name, version, model_name}, ``steps``, ``notes``,
``final_metrics``, ``extra``. Each step has a 1-based sequential ``step_id``, ``timestamp``,
``source`` (system | user | agent), ``message``, optional ``tool_calls`` [{tool_call_id,
function_name, arguments}] and ``observation`` {results: [{source_call_id, content}]}. Screenshots
are written as files next to the trajectory and referenced from the observation's ``extra``.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, TypeVar, Unpack

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from ale_iac.clock import utc_now

SCHEMA_VERSION = "ATIF-v1.4"
StepSource = Literal["system", "user", "agent"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ToolCall(_Model):
    tool_call_id: str
    function_name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ObservationResult(_Model):
    source_call_id: str | None = None
    content: str
    is_error: bool = False
    extra: dict[str, Any] | None = None


class Observation(_Model):
    results: list[ObservationResult] = Field(default_factory=list)


class Step(_Model):
    step_id: int
    timestamp: str = Field(default_factory=utc_now)
    source: StepSource
    message: str = ""
    tool_calls: list[ToolCall] | None = None
    observation: Observation | None = None
    extra: dict[str, Any] | None = None


class AgentInfo(_Model):
    name: str
    version: str = "unknown"
    model_name: str | None = None


class FinalMetrics(_Model):
    total_steps: int = 0
    total_tool_calls: int = 0
    total_errors: int = 0
    total_prompt_tokens: int | None = None
    total_completion_tokens: int | None = None
    total_cached_tokens: int | None = None
    total_cost_usd: float | None = None


class TokenMetrics(TypedDict, total=False):
    """The optional token fields of :class:`FinalMetrics`, as a transcript parser finds them."""

    total_prompt_tokens: int
    total_completion_tokens: int
    total_cached_tokens: int
    total_cost_usd: float | None


class Trajectory(_Model):
    schema_version: str = SCHEMA_VERSION
    session_id: str
    agent: AgentInfo
    steps: list[Step] = Field(default_factory=list)
    notes: str | None = None
    final_metrics: FinalMetrics | None = None
    extra: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check_ids(self) -> Trajectory:
        for expected, step in enumerate(self.steps, start=1):
            if step.step_id != expected:
                raise ValueError(f"step_id {step.step_id} at position {expected}: step ids must be 1, 2, 3, ...")
        call_ids = {c.tool_call_id for s in self.steps for c in (s.tool_calls or [])}
        for step in self.steps:
            for result in step.observation.results if step.observation else []:
                if result.source_call_id is not None and result.source_call_id not in call_ids:
                    raise ValueError(f"observation refers to unknown tool call {result.source_call_id}")
        return self


class TrajectoryBuilder:
    """Appends steps with sequential ids; ``build()`` adds the final metrics."""

    def __init__(self, session_id: str, agent: AgentInfo) -> None:
        self.session_id = session_id
        self.agent = agent
        self.steps: list[Step] = []
        self._call_ids = itertools.count(1)

    def add(self, source: StepSource, message: str = "", **extra: Any) -> Step:
        step = Step(step_id=len(self.steps) + 1, source=source, message=message, extra=extra or None)
        self.steps.append(step)
        return step

    def add_tool_call(
        self,
        name: str,
        arguments: dict[str, Any],
        result: str,
        *,
        is_error: bool = False,
        message: str = "",
        observation_extra: dict[str, Any] | None = None,
        call_id: str | None = None,
    ) -> Step:
        """One agent step that calls one tool, with the tool's result as its observation (``call_id``:
        the agent's own id for the call, if it has one)."""
        call_id = call_id or f"call_{next(self._call_ids)}"
        step = Step(
            step_id=len(self.steps) + 1,
            source="agent",
            message=message,
            tool_calls=[ToolCall(tool_call_id=call_id, function_name=name, arguments=arguments)],
            observation=Observation(
                results=[
                    ObservationResult(
                        source_call_id=call_id, content=result, is_error=is_error, extra=observation_extra
                    )
                ]
            ),
        )
        self.steps.append(step)
        return step

    def build(
        self, notes: str | None = None, extra: dict[str, Any] | None = None, **token_metrics: Unpack[TokenMetrics]
    ) -> Trajectory:
        """The trajectory; ``token_metrics`` are the optional FinalMetrics token fields."""
        calls = [c for s in self.steps for c in (s.tool_calls or [])]
        errors = sum(1 for s in self.steps for r in (s.observation.results if s.observation else []) if r.is_error)
        metrics = FinalMetrics(
            total_steps=len(self.steps), total_tool_calls=len(calls), total_errors=errors, **token_metrics
        )
        return Trajectory(
            session_id=self.session_id,
            agent=self.agent,
            steps=list(self.steps),
            notes=notes,
            final_metrics=metrics,
            extra=extra,
        )


def json_lines(text: str, kind_key: str = "type") -> tuple[list[dict[str, Any]], list[str]]:
    """A CLI's JSON-lines output split into its events (JSON objects with a string ``kind_key``) and
    every other line (warnings, a crash's output), each in order: what a transcript parser starts from."""
    events: list[dict[str, Any]] = []
    other: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("{"):
            try:
                event = json.loads(stripped)
            except json.JSONDecodeError:
                event = None
            if isinstance(event, dict) and isinstance(event.get(kind_key), str):
                events.append(event)
                continue
        other.append(line)
    return events, other


EventT = TypeVar("EventT")


@dataclass(frozen=True)
class UnreadableEvent:
    """An event whose type a transcript parser knows, in a shape its model of that type does not fit."""

    type: str
    timestamp: str | None
    """The event's ``timestamp``, when it has a string one."""
    error: str
    """Where it does not fit (at most three places), e.g. ``message: Input should be a valid dictionary``."""


def read_events(
    text: str, events: TypeAdapter[EventT], kind_key: str = "type"
) -> tuple[list[EventT | UnreadableEvent], list[str]]:
    """:func:`json_lines`, each event read into a model: ``events`` adapts a discriminated union of the
    parser's event models, tagged by kind (the tag is left out of the error's locations). An event that
    does not fit its model is an :class:`UnreadableEvent` in its place, so one odd event costs one step,
    not the whole trajectory."""
    raws, other = json_lines(text, kind_key)
    read: list[EventT | UnreadableEvent] = []
    for raw in raws:
        try:
            read.append(events.validate_python(raw))
        except ValidationError as exc:
            where = [f"{'.'.join(str(p) for p in e['loc'][1:]) or 'event'}: {e['msg']}" for e in exc.errors()[:3]]
            stamp = raw.get("timestamp")
            read.append(
                UnreadableEvent(str(raw[kind_key]), stamp if isinstance(stamp, str) else None, "; ".join(where))
            )
    return read, other
