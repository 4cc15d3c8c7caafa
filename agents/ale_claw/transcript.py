"""The harness's own log and its ATIF trajectory.

The log (``ale_claw/events.jsonl`` in the work dir) has one JSON record per event: ``start`` (prompt,
system prompt, tools, model), ``model`` (one model turn: text, tool calls, usage as the API reported
it, stop reason, latency, the context view's statistics, the failed attempts before it), ``tool`` (one
tool call's result: text, is_error, screenshot files, the bridge calls it made, restarts), ``model_error``
(a failed attempt: status, retryable, the back-off), and ``end`` (status, error). ``to_trajectory``
parses it into those events (:class:`Log`; a record that is not one of them is left out) and turns them
into the trajectory: a system step, the user's prompt, then one agent step per model turn with its tool
calls and their results as the observation.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ale_iac.agent_sdk import AgentInfo, Step, Trajectory, TrajectoryBuilder

Json = Any
"""A value the log carries through to the trajectory as it is (usage as the API reported it, statistics)."""


class _Event(BaseModel):
    model_config = ConfigDict(extra="ignore")

    t: str | None = None


class StartEvent(_Event):
    type: Literal["start"]
    session_id: str | None = None
    system: str = ""
    prompt: str = ""
    model: str | None = None
    tools: list[dict[str, Json]] | None = None
    raw_log: str | None = None


class Call(BaseModel):
    id: str
    name: str
    arguments: dict[str, Json] | None = None


class ModelEvent(_Event):
    type: Literal["model"]
    text: str = ""
    calls: list[Call] | None = None
    usage: dict[str, int] | None = None
    api_usage: Json = None
    stop_reason: str | None = None
    response_id: str | None = None
    latency_s: float | None = None
    context: dict[str, Json] | None = None
    failed_attempts: list[dict[str, Json]] | None = None


class ToolEvent(_Event):
    type: Literal["tool"]
    call_id: str | None = None
    text: str = ""
    is_error: bool = False
    screenshots: list[str] | None = None
    duration_s: float | None = None
    bridge_calls: Json = None
    output: dict[str, Json] | None = None


class ModelErrorEvent(_Event):
    type: Literal["model_error"]
    final: bool = False
    status: int | None = None
    message: str | None = None
    retryable: bool | None = None
    attempt: int | None = None


class EndEvent(_Event):
    type: Literal["end"]
    status: str | None = None
    error: str | None = None
    bridge_restarts: dict[str, int] | None = None


AnyEvent = StartEvent | ModelEvent | ToolEvent | ModelErrorEvent | EndEvent


class _Record(BaseModel):
    event: AnyEvent = Field(discriminator="type")


class Log(BaseModel):
    """The log's events, in order."""

    events: list[AnyEvent]

    @classmethod
    def parse(cls, records: list[dict[str, Any]]) -> Log:
        events: list[AnyEvent] = []
        for record in records:
            try:
                events.append(_Record.model_validate({"event": record}).event)
            except ValidationError:
                continue  # not an event of this log (or a garbled one)
        return cls(events=events)

    @property
    def start(self) -> StartEvent | None:
        return next((e for e in self.events if isinstance(e, StartEvent)), None)

    @property
    def end(self) -> EndEvent | None:
        return next((e for e in reversed(self.events) if isinstance(e, EndEvent)), None)

    @property
    def turns(self) -> list[ModelEvent]:
        return [e for e in self.events if isinstance(e, ModelEvent)]

    @property
    def results(self) -> dict[str, ToolEvent]:
        return {str(e.call_id): e for e in self.events if isinstance(e, ToolEvent)}

    @property
    def model_errors(self) -> list[ModelErrorEvent]:
        return [e for e in self.events if isinstance(e, ModelErrorEvent)]


def to_trajectory(
    records: list[dict[str, Any]], *, agent: AgentInfo, session_id: str, status: str, error: str | None
) -> Trajectory:
    log = Log.parse(records)
    start, end = log.start, log.end
    builder = TrajectoryBuilder(session_id=str((start and start.session_id) or session_id), agent=agent)
    if start is not None:
        system = builder.add("system", start.system, tools=start.tools)
        system.timestamp = str(start.t or system.timestamp)
        user = builder.add("user", start.prompt)
        user.timestamp = str(start.t or user.timestamp)
    totals = {"prompt": 0, "completion": 0, "cached": 0}
    results = log.results
    for turn in log.turns:
        usage = dict(turn.usage or {})
        totals["prompt"] += int(usage.get("prompt_tokens", 0))
        totals["completion"] += int(usage.get("completion_tokens", 0))
        totals["cached"] += int(usage.get("cached_tokens", 0))
        builder.steps.append(_agent_step(len(builder.steps) + 1, turn, usage, results))
    final_status = str((end and end.status) or status)
    final_error = (end and end.error) or error
    failed_last = [e for e in log.model_errors if e.final]
    if failed_last or final_status != "completed":
        builder.add(
            "system",
            f"run ended: {final_status}" + (f": {final_error}" if final_error else ""),
            model_errors=[e.model_dump(include={"status", "message", "retryable", "attempt"}) for e in failed_last]
            or None,
        )
    notes = f"ale-claw: {final_status}" + (f" ({final_error})" if final_error else "")
    return builder.build(
        notes=notes,
        extra={
            "status": final_status,
            "error": final_error,
            "model_turns": len(log.turns),
            "model_errors": len(log.model_errors),
            "bridge_restarts": end.bridge_restarts if end else None,
            "raw_log": start.raw_log if start else None,
        },
        total_prompt_tokens=totals["prompt"],
        total_completion_tokens=totals["completion"],
        total_cached_tokens=totals["cached"],
    )


def _agent_step(step_id: int, turn: ModelEvent, usage: dict[str, int], results: dict[str, ToolEvent]) -> Step:
    """One model turn: its text, its tool calls, and their results as the observation."""
    calls = turn.calls or []
    observations = [_observation(call, results.get(call.id)) for call in calls]
    step_extra: dict[str, Any] = {
        "usage": usage,
        "api_usage": turn.api_usage,
        "stop_reason": turn.stop_reason,
        "response_id": turn.response_id,
        "latency_s": turn.latency_s,
        "context": turn.context,
    }
    if turn.failed_attempts:
        step_extra["failed_attempts"] = turn.failed_attempts
    return Step.model_validate(
        {
            "step_id": step_id,
            "timestamp": str(turn.t),
            "source": "agent",
            "message": turn.text,
            "tool_calls": [
                {"tool_call_id": c.id, "function_name": c.name, "arguments": c.arguments or {}} for c in calls
            ]
            or None,
            "observation": {"results": observations} if observations else None,
            "extra": {k: v for k, v in step_extra.items() if v is not None},
        }
    )


def _observation(call: Call, result: ToolEvent | None) -> dict[str, Any]:
    if result is None:  # cut before the tool ran (cancelled, wall time)
        return {"source_call_id": call.id, "content": "(no result: the run ended)", "is_error": True}
    extra: dict[str, Any] = {
        k: v
        for k, v in (
            ("duration_s", result.duration_s),
            ("bridge_calls", result.bridge_calls),
            ("output", result.output),
        )
        if v
    }
    if result.screenshots:
        extra["screenshots"] = result.screenshots
    return {
        "source_call_id": call.id,
        "content": result.text,
        "is_error": result.is_error,
        "extra": extra or None,
    }
