"""A trajectory (ATIF, any version up to 1.5) read leniently into a conversation to show.

``ale_iac.agent_sdk.trajectory`` is the strict model deployers write; a report must also show a
trajectory written by another tool, a newer ATIF, or one cut short, so this reads only what it
shows, ignores unknown fields, and turns a step it cannot read into a visible note instead of
failing the page. Screenshots are paths relative to the agent's work dir (``extra.artifacts_dir``);
one that does not resolve to a regular image file inside the unit's folder is dropped with a note,
so a record can never pull a file from elsewhere on the machine into a report.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".gif", ".webp"})
ARGS_ONE_LINE = 100
TOKEN_FIELDS = ("prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd")


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _ToolCall(_Loose):
    tool_call_id: str = ""
    function_name: str = "?"
    arguments: Any = None


class _Result(_Loose):
    source_call_id: str | None = None
    content: Any = ""
    is_error: bool = False
    extra: dict[str, Any] | None = None


class _Observation(_Loose):
    results: list[_Result] = []


class _Step(_Loose):
    step_id: int | None = None
    timestamp: str | None = None
    source: str = "agent"
    model_name: str | None = None
    message: Any = ""
    reasoning_content: str | None = None
    tool_calls: list[_ToolCall] | None = None
    observation: _Observation | None = None
    metrics: dict[str, Any] | None = None
    extra: dict[str, Any] | None = None


class _Agent(_Loose):
    name: str = "?"
    version: str | None = None
    model_name: str | None = None


class _Root(_Loose):
    schema_version: str = "?"
    session_id: str | None = None
    agent: _Agent = _Agent()
    steps: list[Any] = []
    notes: str | None = None
    final_metrics: dict[str, Any] | None = None
    extra: dict[str, Any] | None = None


@dataclass
class Screenshot:
    path: Path
    """Resolved, inside the unit's folder, a regular file."""
    label: str
    """The path as the trajectory wrote it."""


@dataclass
class ResultView:
    content: str
    is_error: bool
    screenshots: list[Screenshot] = field(default_factory=list)


@dataclass
class CallView:
    call_id: str
    name: str
    arguments: str
    """Pretty-printed JSON."""
    results: list[ResultView] = field(default_factory=list)


@dataclass
class StepView:
    step_id: int
    source: str
    timestamp: str | None
    model_name: str | None
    message: str
    reasoning: str | None
    calls: list[CallView] = field(default_factory=list)
    results: list[ResultView] = field(default_factory=list)
    """Results not tied to one of this step's calls."""
    screenshots: list[Screenshot] = field(default_factory=list)
    """Screenshots of the step itself (message parts, ``extra.screenshots``)."""
    tokens: dict[str, float] = field(default_factory=dict)
    unreadable: str | None = None

    @property
    def has_error(self) -> bool:
        return any(r.is_error for r in self.results) or any(r.is_error for c in self.calls for r in c.results)

    @property
    def all_screenshots(self) -> list[Screenshot]:
        shots = list(self.screenshots)
        shots += [s for r in self.results for s in r.screenshots]
        shots += [s for c in self.calls for r in c.results for s in r.screenshots]
        return shots


@dataclass
class TrajectoryView:
    schema_version: str
    agent: str
    agent_version: str | None
    model_name: str | None
    notes: str | None
    steps: list[StepView]
    tokens: dict[str, float]
    """Totals: ``final_metrics`` where it has them, else the sum over the steps."""
    problems: list[str]

    @property
    def tool_calls(self) -> int:
        return sum(len(s.calls) for s in self.steps)

    @property
    def screenshots(self) -> int:
        return sum(len(s.all_screenshots) for s in self.steps)


def _text(content: Any) -> tuple[str, list[str]]:
    """A message or result as text, and the image paths among its parts (ATIF 1.5 content parts)."""
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    if isinstance(content, list):
        texts, images = [], []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                texts.append(str(part.get("text", "")))
            elif isinstance(part, dict) and part.get("type") == "image":
                source = part.get("source")
                if isinstance(source, dict) and isinstance(source.get("path"), str):
                    images.append(source["path"])
            else:
                texts.append(json.dumps(part, ensure_ascii=False, default=str))
        return "\n".join(texts), images
    return json.dumps(content, ensure_ascii=False, indent=2, default=str), []


def _arguments(arguments: Any) -> str:
    """A tool call's arguments as JSON: on one line when short, indented when not."""
    data = arguments if arguments is not None else {}
    line = json.dumps(data, ensure_ascii=False, default=str)
    return line if len(line) <= ARGS_ONE_LINE else json.dumps(data, ensure_ascii=False, indent=2, default=str)


def _tokens(metrics: dict[str, Any] | None) -> dict[str, float]:
    if not metrics:
        return {}
    return {
        k: float(metrics[k])
        for k in TOKEN_FIELDS
        if isinstance(metrics.get(k), int | float) and not isinstance(metrics.get(k), bool)
    }


class _Shots:
    """Resolves screenshot paths against the agent's work dir, confined to the unit's folder."""

    def __init__(self, unit_dir: Path, artifacts_dir: str, problems: list[str]) -> None:
        self.root = unit_dir.resolve()
        self.base = unit_dir / artifacts_dir
        self.problems = problems

    def __call__(self, paths: Any) -> list[Screenshot]:
        if not isinstance(paths, list):
            return []
        shots = []
        for rel in paths:
            if not isinstance(rel, str):
                continue
            path = (self.base / rel).resolve()
            if not path.is_relative_to(self.root):
                self.problems.append(f"screenshot {rel!r} points outside the unit's record; not shown")
            elif path.suffix.lower() not in IMAGE_SUFFIXES or not path.is_file():
                self.problems.append(f"screenshot {rel!r} is missing or not an image file")
            else:
                shots.append(Screenshot(path=path, label=rel))
        return shots


def _result(raw: _Result, shots: _Shots) -> ResultView:
    text, images = _text(raw.content)
    extra = raw.extra or {}
    return ResultView(content=text, is_error=raw.is_error, screenshots=shots(extra.get("screenshots")) + shots(images))


def _step(position: int, raw: Any, shots: _Shots) -> StepView:
    try:
        step = _Step.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return StepView(position, "?", None, None, "", None, unreadable=f"{where}: {first['msg']}")
    message, images = _text(step.message)
    extra = step.extra or {}
    view = StepView(
        step_id=step.step_id if step.step_id is not None else position,
        source=step.source,
        timestamp=step.timestamp,
        model_name=step.model_name,
        message=message,
        reasoning=step.reasoning_content,
        screenshots=shots(images) + shots(extra.get("screenshots")),
        tokens=_tokens(step.metrics)
        or _tokens(extra.get("metrics") if isinstance(extra.get("metrics"), dict) else None),
    )
    calls = {}
    for call in step.tool_calls or []:
        view.calls.append(CallView(call.tool_call_id, call.function_name, _arguments(call.arguments)))
        calls[call.tool_call_id] = view.calls[-1]
    for result in step.observation.results if step.observation else []:
        target = calls.get(result.source_call_id or "")
        (target.results if target else view.results).append(_result(result, shots))
    return view


def read_trajectory(path: Path, unit_dir: Path) -> TrajectoryView:
    """The trajectory at ``path`` as a conversation; raises ValueError if it is not a trajectory at all."""
    try:
        root = _Root.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        raise ValueError(f"not a readable trajectory: {exc.errors()[0]['msg']}") from None
    problems: list[str] = []
    extra = root.extra or {}
    artifacts = extra.get("artifacts_dir")
    shots = _Shots(unit_dir, artifacts if isinstance(artifacts, str) else "agent", problems)
    steps = [_step(i, raw, shots) for i, raw in enumerate(root.steps, start=1)]
    problems += [f"step {s.step_id}: unreadable ({s.unreadable})" for s in steps if s.unreadable]
    final = root.final_metrics or {}
    totals = _tokens({k.removeprefix("total_"): v for k, v in final.items() if k.startswith("total_")})
    if not totals:
        for step in steps:
            for key, value in step.tokens.items():
                totals[key] = totals.get(key, 0.0) + value
    return TrajectoryView(
        schema_version=root.schema_version,
        agent=root.agent.name,
        agent_version=root.agent.version,
        model_name=root.agent.model_name,
        notes=root.notes,
        steps=steps,
        tokens=totals,
        problems=problems,
    )
