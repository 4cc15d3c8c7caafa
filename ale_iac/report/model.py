"""A run read back from its record (``ale_iac/runner/records.py`` describes the layout).

Only files under the run folder are read: the runner redacted them as it wrote them, so what a
report shows is already free of secrets. Everything is read leniently, because a report must work
on a run that is still going (a unit with no ``run.json`` end, a half-written last event line, no
trajectory yet) or was killed: what is missing is shown as missing, and what cannot be read is
listed in ``problems`` instead of stopping the report.

Phases come from ``events.jsonl`` (written as they happen, so a running unit's current phase is
there) and fall back to ``run.json``'s ``phases`` (complete only once the unit is done).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ale_iac.report.atif import TrajectoryView, read_trajectory
from ale_iac.runner.records import MANIFEST
from ale_iac.runner.status import UnitStatus

CONTEXT_EVENTS = 4
"""Events shown before an error, as its context."""
LOG_TAIL_BYTES = 8192
MAX_LOGS = 10


def parse_time(value: Any) -> dt.datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


@dataclass
class Event:
    t: str | None
    kind: str
    fields: dict[str, Any]
    offset_s: float | None = None
    """Seconds since the unit started."""


@dataclass
class Phase:
    name: str
    started_at: dt.datetime | None
    seconds: float | None
    """None while the phase runs."""
    ok: bool | None
    details: dict[str, Any] = field(default_factory=dict)
    offset_s: float | None = None


@dataclass
class ErrorView:
    kind: str
    message: str
    phase: str | None
    t: str | None
    context: list[Event] = field(default_factory=list)
    step_id: int | None = None
    """The trajectory step, for a tool call that failed."""
    detail: str | None = None
    """More text the record has for it (a hook's traceback)."""


@dataclass
class LogTail:
    name: str
    text: str
    truncated: bool


@dataclass
class AgentSetup:
    """Where an agent of the run ran and on which model (``experiment.json``; an older record: ``run.json``)."""

    name: str
    executor: str | None
    model: str | None
    model_base_url: str | None = None


@dataclass
class UnitView:
    unit_id: str
    folder: Path
    agent: str
    task: str
    repeat: int | None
    status: str
    """A :class:`UnitStatus` value, or ``queued`` for a unit with no folder yet."""
    score: float | None = None
    error: str | None = None
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    duration_s: float | None = None
    agent_s: float | None = None
    stack: str | None = None
    cleanup_mode: str | None = None
    cleanup_outcome: str | None = None
    phases: list[Phase] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    errors: list[ErrorView] = field(default_factory=list)
    trajectory: TrajectoryView | None = None
    outputs: list[tuple[str, int]] = field(default_factory=list)
    logs: list[LogTail] = field(default_factory=list)
    agent_config: dict[str, Any] = field(default_factory=dict)
    """The agent's preset as ``run.json`` records it."""
    grading: dict[str, Any] = field(default_factory=dict)
    """What the grader said beside the score (``eval_result.json``: ``Evaluation`` details, ALE's raw scores)."""
    egress: dict[str, Any] = field(default_factory=dict)
    """The summary of the unit's egress under its policy (``run.json``'s ``egress``); empty: it had none."""
    egress_attempts: list[dict[str, Any]] = field(default_factory=list)
    """Every attempt through the unit's egress proxy (``egress.jsonl``)."""
    problems: list[str] = field(default_factory=list)

    @property
    def queued(self) -> bool:
        return self.status == "queued"

    @property
    def finished(self) -> bool:
        return self.status in set(UnitStatus) and self.status != UnitStatus.RUNNING

    @property
    def running(self) -> bool:
        return self.status == UnitStatus.RUNNING

    @property
    def failed(self) -> bool:
        return self.finished and self.status != UnitStatus.SUCCEEDED

    @property
    def current_phase(self) -> str | None:
        return next((p.name for p in reversed(self.phases) if p.seconds is None), None) if self.running else None

    def elapsed_s(self, now: dt.datetime) -> float | None:
        """The unit's time: its recorded duration, or for a running unit the time since it started."""
        if self.duration_s is not None:
            return self.duration_s
        if self.started_at is None:
            return None
        return max(0.0, ((self.finished_at or now) - self.started_at).total_seconds())

    def phase_seconds(self) -> dict[str, float]:
        return {p.name: p.seconds for p in self.phases if p.seconds is not None}


@dataclass
class RunView:
    run_id: str
    folder: Path
    experiment: str
    cleanup: str | None
    units: list[UnitView]
    generated_at: dt.datetime
    profile: str | None = None
    profile_file: str | None = None
    pool: str | None = None
    agent_setups: list[AgentSetup] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def in_progress(self) -> bool:
        return any(not u.finished for u in self.units)

    @property
    def agents(self) -> list[str]:
        return list(dict.fromkeys(u.agent for u in self.units))

    @property
    def tasks(self) -> list[str]:
        return list(dict.fromkeys(u.task for u in self.units))

    @property
    def scores(self) -> list[float]:
        return [u.score for u in self.units if u.score is not None]

    @property
    def mean_score(self) -> float | None:
        return sum(self.scores) / len(self.scores) if self.scores else None

    def count(self, state: str) -> int:
        return sum(1 for u in self.units if getattr(u, state))

    @property
    def wall_s(self) -> float | None:
        """From the first unit's start to the last one's end (or now, while it runs)."""
        starts = [u.started_at for u in self.units if u.started_at]
        if not starts:
            return None
        ends = [u.finished_at or self.generated_at for u in self.units if u.started_at]
        return (max(ends) - min(starts)).total_seconds()

    def unit(self, unit_id: str) -> UnitView:
        return next(u for u in self.units if u.unit_id == unit_id)

    def agent_setup(self, name: str) -> AgentSetup | None:
        return next((a for a in self.agent_setups if a.name == name), None)


def _json(path: Path, problems: list[str]) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except ValueError as exc:
        problems.append(f"{path.name}: not readable JSON ({exc})")
        return None
    if not isinstance(data, dict):
        problems.append(f"{path.name}: not a JSON object")
        return None
    return data


def _events(path: Path, problems: list[str]) -> list[Event]:
    if not path.is_file():
        return []
    events = []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except ValueError:
            # The last line of a running unit may be half written.
            if number != len(lines):
                problems.append(f"events.jsonl line {number}: not JSON; skipped")
            continue
        if isinstance(data, dict):
            fields = {k: v for k, v in data.items() if k not in ("t", "event")}
            events.append(Event(t=data.get("t"), kind=str(data.get("event", "?")), fields=fields))
    return events


def _phases(events: list[Event], recorded: Any) -> list[Phase]:
    phases: dict[str, Phase] = {}
    for event in events:
        name = event.fields.get("phase")
        if not isinstance(name, str):
            continue
        if event.kind == "phase_start":
            phases[name] = Phase(name, parse_time(event.t), None, None)
        elif event.kind == "phase_end":
            phase = phases.setdefault(name, Phase(name, None, None, None))
            seconds = event.fields.get("seconds")
            phase.seconds = float(seconds) if isinstance(seconds, int | float) else 0.0
            phase.ok = bool(event.fields.get("ok", True))
            phase.details = {k: v for k, v in event.fields.items() if k not in ("phase", "ok", "seconds")}
    if phases or not isinstance(recorded, dict):
        return list(phases.values())
    for name, data in recorded.items():
        if isinstance(data, dict):
            seconds = data.get("seconds")
            phases[name] = Phase(
                name,
                parse_time(data.get("started_at")),
                float(seconds) if isinstance(seconds, int | float) else None,
                data.get("ok"),
                {k: v for k, v in data.items() if k not in ("started_at", "seconds", "ok")},
            )
    return list(phases.values())


def _phase_at(events: list[Event], index: int) -> str | None:
    """The phase an event happened in: the last one started before it (by order: the clock has ties)."""
    for event in reversed(events[:index]):
        if event.kind == "phase_start" and isinstance(event.fields.get("phase"), str):
            return str(event.fields["phase"])
    return None


def _event_errors(unit: UnitView) -> list[ErrorView]:
    """Errors among the events: ``error`` and every ``*_error`` event (a hook's, the trajectory's),
    a phase that ended ``ok: false``, an interruption. Each with the events before it as context."""
    errors: list[ErrorView] = []
    for index, event in enumerate(unit.events):
        context = unit.events[max(0, index - CONTEXT_EVENTS) : index]
        phase = _phase_at(unit.events, index)
        if event.kind == "error" or event.kind.endswith("_error"):
            trace = event.fields.get("traceback")
            detail = trace if isinstance(trace, str) else None
            errors.append(
                ErrorView(event.kind, str(event.fields.get("error", "")), phase, event.t, context, None, detail)
            )
        elif event.kind == "interrupted":
            errors.append(
                ErrorView("interrupted", "the run was interrupted (SIGINT or SIGTERM)", phase, event.t, context)
            )
        elif event.kind == "phase_end" and event.fields.get("ok") is False:
            message = str(event.fields.get("error") or "the phase failed")
            errors.append(ErrorView("phase failed", message, str(event.fields.get("phase")), event.t, context))
    return errors


def _errors(unit: UnitView) -> list[ErrorView]:
    """What went wrong in a unit, each thing once (the record may say it in several places: a hook's
    error event, its phase's end, the unit's error event, ``run.json``), first mention first."""
    errors = _event_errors(unit)
    # An agent that fails or times out may be recorded as the unit's error alone.
    if unit.error and unit.status != UnitStatus.INTERRUPTED:
        at = next(
            (i for i, e in enumerate(unit.events) if e.kind == "phase_end" and e.fields.get("phase") == "agent"), None
        )
        context = unit.events[max(0, at - CONTEXT_EVENTS) : at + 1] if at is not None else []
        errors.append(ErrorView(unit.status, unit.error, "agent" if at is not None else None, None, context))
    for step in unit.trajectory.steps if unit.trajectory else []:
        results = [(f"{c.name}: ", r) for c in step.calls for r in c.results] + [("", r) for r in step.results]
        errors += [
            ErrorView("tool error", prefix + r.content, "agent", step.timestamp, [], step.step_id)
            for prefix, r in results
            if r.is_error
        ]
    seen: set[str] = set()
    unique = []
    for error in errors:
        if error.message in seen and error.step_id is None:
            continue
        seen.add(error.message)
        unique.append(error)
    return unique


def _safe_file(folder: Path, rel: str) -> Path | None:
    """``folder/rel`` if it is a regular file inside ``folder`` (a record may hold symlinks)."""
    path = (folder / rel).resolve()
    return path if path.is_relative_to(folder.resolve()) and path.is_file() else None


def _log_tails(folder: Path, agent_result: dict[str, Any] | None) -> list[LogTail]:
    """The end of each log the agent's result names, of every ``*.log`` in its work dir, and of the
    record's own (``hooks.log``: the task hooks' output); paths relative to the unit's folder."""
    listed = agent_result.get("logs") if agent_result else None
    agent_dir = folder / "agent"
    found = sorted(p.relative_to(folder).as_posix() for p in agent_dir.rglob("*.log")) if agent_dir.is_dir() else []
    found += sorted(p.name for p in folder.glob("*.log"))  # the record's own: the task hooks' output
    names = list(dict.fromkeys([*([f"agent/{n}" for n in listed] if isinstance(listed, list) else []), *found]))
    tails = []
    for name in names[:MAX_LOGS]:
        path = _safe_file(folder, name)
        if path is None:
            continue
        size = path.stat().st_size
        with path.open("rb") as handle:
            handle.seek(max(0, size - LOG_TAIL_BYTES))
            text = handle.read().decode("utf-8", errors="replace")
        tails.append(LogTail(name, text, size > LOG_TAIL_BYTES))
    return tails


def _outputs(folder: Path) -> list[tuple[str, int]]:
    out = folder / "output"
    if not out.is_dir():
        return []
    files = [p for p in sorted(out.rglob("*")) if p.is_file() and not p.is_symlink()]
    return [(p.relative_to(out).as_posix(), p.stat().st_size) for p in files]


def _name_parts(unit_id: str) -> tuple[str, str, int | None]:
    """``agent__task__rN`` as the runner names units: for a unit that has no run.json yet."""
    parts = unit_id.split("__")
    if len(parts) == 3 and parts[2].startswith("r") and parts[2][1:].isdigit():
        return parts[0], parts[1], int(parts[2][1:])
    return "?", unit_id, None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _grading(result: dict[str, Any] | None) -> dict[str, Any]:
    """The grader's details (what ``evaluate`` returned beside the score), and ALE's list of raw scores."""
    if result is None:
        return {}
    details = result.get("details")
    grading = dict(details) if isinstance(details, dict) else {}
    if "raw_scores" in result:
        grading["raw_scores"] = result["raw_scores"]
    return grading


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _agent_setups(listed: Any, units: list[UnitView]) -> list[AgentSetup]:
    """Each agent's executor and model as the manifest records them; a manifest written before it did: what
    each unit's ``run.json`` says of its agent's preset (its executor only when the preset named one)."""
    if isinstance(listed, list):
        return [
            AgentSetup(str(a["name"]), _text(a.get("executor")), _text(a.get("model")), _text(a.get("model_base_url")))
            for a in listed
            if isinstance(a, dict) and a.get("name")
        ]
    setups: dict[str, AgentSetup] = {}
    for unit in units:
        if unit.agent in setups or not unit.agent_config:
            continue
        model = unit.agent_config.get("model")
        model = model if isinstance(model, dict) else {}
        executor = _text(unit.agent_config.get("executor"))
        setups[unit.agent] = AgentSetup(unit.agent, executor, _text(model.get("name")), _text(model.get("base_url")))
    return list(setups.values())


EGRESS_FIELDS = ("time", "host", "port", "method", "allowed", "reason", "address", "bytes_out", "bytes_in")
"""What the report shows of an egress attempt (the fields of ``substrates.egress_proxy.LOG_FIELDS``)."""
EGRESS_SUMMARY = (
    *("policy", "attempts", "allowed", "refused", "bytes_out", "bytes_in"),
    *("channel_bytes_out", "channel_bytes_in"),
)


def _egress_attempts(path: Path, problems: list[str]) -> list[dict[str, Any]]:
    """The attempts of a unit's egress proxy, one JSON object a line (a torn last line is a problem, not an error)."""
    if not path.is_file():
        return []
    attempts = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        try:
            entry = json.loads(line)
        except ValueError:
            problems.append(f"egress.jsonl line {number}: not JSON")
            continue
        if isinstance(entry, dict):
            attempts.append({key: entry.get(key) for key in EGRESS_FIELDS})
    return attempts


def load_unit(folder: Path) -> UnitView:
    problems: list[str] = []
    agent, task, repeat = _name_parts(folder.name)
    if not folder.is_dir():
        return UnitView(folder.name, folder, agent, task, repeat, "queued")
    run = _json(folder / "run.json", problems) or {}
    events = _events(folder / "events.jsonl", problems)
    agent_data, task_data, cleanup = run.get("agent"), run.get("task"), run.get("cleanup")
    status = run.get("status")
    unit = UnitView(
        unit_id=folder.name,
        folder=folder,
        agent=str(agent_data.get("name", agent)) if isinstance(agent_data, dict) else agent,
        task=str(task_data.get("id", task)) if isinstance(task_data, dict) else task,
        repeat=run.get("repeat") if isinstance(run.get("repeat"), int) else repeat,
        status=status if isinstance(status, str) else UnitStatus.RUNNING,
        score=_number(run.get("score")),
        error=run.get("error") if isinstance(run.get("error"), str) else None,
        started_at=parse_time(run.get("started_at")) or (parse_time(events[0].t) if events else None),
        finished_at=parse_time(run.get("finished_at")),
        duration_s=_number(run.get("duration_s")),
        agent_s=_number(run.get("agent_s")),
        stack=run.get("stack") if isinstance(run.get("stack"), str) else None,
        cleanup_mode=run.get("cleanup_mode") if isinstance(run.get("cleanup_mode"), str) else None,
        cleanup_outcome=str(cleanup.get("outcome")) if isinstance(cleanup, dict) else None,
        events=events,
        agent_config=agent_data if isinstance(agent_data, dict) else {},
        problems=problems,
    )
    if not run and not events:
        unit.status = "queued"
    unit.phases = _phases(events, run.get("phases"))
    if unit.started_at is not None:
        for event in unit.events:
            when = parse_time(event.t)
            event.offset_s = (when - unit.started_at).total_seconds() if when else None
        for phase in unit.phases:
            phase.offset_s = (phase.started_at - unit.started_at).total_seconds() if phase.started_at else None
    if (folder / "trajectory.json").is_file():
        try:
            unit.trajectory = read_trajectory(folder / "trajectory.json", folder)
            problems += unit.trajectory.problems
        except (OSError, ValueError) as exc:
            problems.append(f"trajectory.json: {exc}")
    unit.errors = _errors(unit)
    unit.grading = _grading(_json(folder / "eval_result.json", problems))
    egress = run.get("egress")
    unit.egress = {key: egress.get(key, "?") for key in EGRESS_SUMMARY} if isinstance(egress, dict) else {}
    unit.egress_attempts = _egress_attempts(folder / "egress.jsonl", problems)
    unit.outputs = _outputs(folder)
    if unit.failed or unit.errors:
        unit.logs = _log_tails(folder, _json(folder / "agent_result.json", problems))
    return unit


def load_run(run_dir: Path, now: dt.datetime | None = None) -> RunView:
    """The run recorded in ``run_dir``, as far as it got."""
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} is not a folder")
    problems: list[str] = []
    manifest = _json(run_dir / MANIFEST, problems)
    if manifest is None:
        problems.append(f"{MANIFEST} is missing: not a run folder, or a run that never started")
        manifest = {}
    listed = [str(u) for u in manifest.get("units", []) if isinstance(u, str)]
    found = sorted(p.name for p in run_dir.iterdir() if (p / "run.json").is_file() or (p / "events.jsonl").is_file())
    ids = list(dict.fromkeys([*listed, *found]))
    spec = manifest.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    units = [load_unit(run_dir / unit_id) for unit_id in ids if "/" not in unit_id and unit_id not in ("", ".", "..")]
    pool = _text(manifest.get("pool")) or _text(spec.get("pool"))
    # A manifest from before it recorded the profile: the spec's, and a spec with neither ran on `local`.
    profile = _text(manifest.get("profile")) or _text(spec.get("profile")) or (None if pool or not spec else "local")
    return RunView(
        run_id=str(manifest.get("run_id", run_dir.name)),
        folder=run_dir,
        experiment=_text(spec.get("name")) or "?",
        cleanup=_text(manifest.get("cleanup")),
        units=units,
        generated_at=now or dt.datetime.now(dt.UTC),
        profile=profile,
        profile_file=_text(manifest.get("profile_file")),
        pool=pool,
        agent_setups=_agent_setups(manifest.get("agents"), units),
        problems=problems,
    )
