"""Synthetic run records, in the runner's format (``ale_iac/runner/records.py``), for the report's tests
and its benchmark: any number of units, screenshots, failures, and runs caught midway.

Each unit's trajectory is built with the agent SDK's own ``TrajectoryBuilder``; screenshots are real
PNGs of a fake desktop (a few variants, drawn once per process). Times are deterministic.
"""

from __future__ import annotations

import datetime as dt
import functools
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from PIL import Image, ImageDraw

from ale_iac.agent_sdk import AgentInfo, TrajectoryBuilder

State = Literal["succeeded", "agent_failed", "setup_failed", "running", "interrupted", "queued"]
START = dt.datetime(2026, 12, 1, 4, 0, 0, tzinfo=dt.UTC)
HOSTILE = '<script>document.title="pwned"</script><img src=x onerror=alert(1)>'
"""What an agent might type: must show as text in a report, never run."""


@dataclass
class Unit:
    agent: str = "synthetic"
    task: str = "task-1"
    repeat: int = 0
    state: State = "succeeded"
    screenshots: int = 2
    score: float | None = 1.0
    tokens: bool = False
    details: dict[str, Any] | None = None
    """What the grader returned beside the score (``Evaluation(score, details)``)."""
    load_s: float | None = None
    """The ``load`` phase's time, the runner's first phase (left out when None)."""

    @property
    def unit_id(self) -> str:
        return f"{self.agent}__{self.task}__r{self.repeat}"


@functools.cache
def screenshot_png(variant: int) -> bytes:
    """A 1280x800 'desktop' with a window and some text: real pixels, different per variant."""
    image = Image.new("RGB", (1280, 800), (24 + variant * 20, 60, 90))
    draw = ImageDraw.Draw(image)
    left, top = 80 + variant * 30, 60 + variant * 20
    draw.rectangle((left, top, left + 700, top + 460), fill=(245, 245, 245), outline=(0, 0, 0))
    draw.rectangle((left, top, left + 700, top + 24), fill=(40, 80, 160))
    for line in range(12):
        draw.text((left + 12, top + 36 + 18 * line), f"line {line} of window {variant}", fill=(20, 20, 20))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _t(seconds: float) -> str:
    return (START + dt.timedelta(seconds=seconds)).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _Writer:
    """One unit's folder, its events in order on a clock that starts at ``offset`` seconds."""

    def __init__(self, folder: Path, offset: float) -> None:
        self.folder = folder
        self.clock = offset
        self.events: list[dict[str, object]] = []
        self.phases: dict[str, dict[str, object]] = {}
        folder.mkdir(parents=True)

    def event(self, kind: str, **fields: object) -> None:
        self.events.append({"t": _t(self.clock), "event": kind, **fields})

    def phase(self, name: str, seconds: float | None, ok: bool = True, **details: object) -> None:
        self.phases[name] = {"started_at": _t(self.clock)}
        self.event("phase_start", phase=name)
        if seconds is None:
            return
        self.clock += seconds
        self.phases[name].update(seconds=seconds, ok=ok, **details)
        self.event("phase_end", phase=name, ok=ok, seconds=seconds, **details)

    def json(self, name: str, data: object) -> None:
        (self.folder / name).write_text(json.dumps(data, indent=2))

    def close(self, half_line: bool = False) -> None:
        text = "".join(json.dumps(e) + "\n" for e in self.events)
        if half_line:
            text += '{"t": "2026-12-01T04:0'
        (self.folder / "events.jsonl").write_text(text)


def _trajectory(w: _Writer, unit: Unit, index: int) -> None:
    builder = TrajectoryBuilder(f"session-{index}", AgentInfo(name=unit.agent, version="1", model_name="test-model"))
    builder.add("user", f"Do {unit.task}. Write your results to /data/tasks/{unit.task}/output.")
    shots = w.folder / "agent" / "screenshots"
    shots.mkdir(parents=True)
    for k in range(1, unit.screenshots + 1):
        name = f"screenshots/step-{k}.png"
        (w.folder / "agent" / name).write_bytes(screenshot_png(k % 7))
        builder.add_tool_call("cua.screenshot", {}, "Screenshot captured", observation_extra={"screenshots": [name]})
        builder.add_tool_call("cua.click", {"coordinate": [400 + k, 300]}, f"Clicked at [{400 + k}, 300]")
    builder.add_tool_call("cua.type", {"text": HOSTILE}, f"Typed: {HOSTILE}", message=f"typing {HOSTILE}")
    if unit.state == "agent_failed":
        builder.add_tool_call("vm.read_text", {"path": "/nope"}, "No such file: /nope", is_error=True)
    data = builder.build(notes=f"{unit.state} run", extra={"artifacts_dir": "agent"}).model_dump(
        mode="json", exclude_none=True
    )
    for number, step in enumerate(data["steps"]):
        step["timestamp"] = _t(w.clock + 0.05 * number)
    if unit.tokens:
        for step in data["steps"]:
            if step["source"] == "agent":
                step["metrics"] = {"prompt_tokens": 1200, "completion_tokens": 80, "cost_usd": 0.002}
        agent_steps = sum(1 for s in data["steps"] if s["source"] == "agent")
        data["final_metrics"].update(total_prompt_tokens=1200 * agent_steps, total_completion_tokens=80 * agent_steps)
    w.json("trajectory.json", data)


def _unit(folder: Path, unit: Unit, index: int, run_id: str) -> None:
    w = _Writer(folder, offset=index * 2.5)
    started = w.clock
    run: dict[str, object] = {
        "unit_id": unit.unit_id,
        "run_id": run_id,
        "agent": {"name": unit.agent, "deployer": "tests.support:Synthetic", "secrets": []},
        "task": {"id": unit.task, "card": {"id": unit.task, "instruction": f"Do {unit.task}."}},
        "repeat": unit.repeat,
        "status": "running",
        "started_at": _t(started),
        "cleanup_mode": "destroy",
    }
    stack = f"run-{index:03d}-{unit.unit_id}"
    agent_s = 0.0
    if unit.load_s is not None:
        w.phase("load", unit.load_s, task=unit.task)
    w.phase("provision", 3.0 + (index % 5) * 0.3, stack=stack, endpoint="http://127.0.0.1:60000")
    run.update(stack=stack, handle={"endpoint": "http://127.0.0.1:60000", "endpoint_token": "***"})
    w.phase("ready", 0.8 + (index % 3) * 0.2, server_version="0.3.46", attempts=2)
    if unit.state == "running":
        w.phase("setup", 1.0, inputs_staged=1)
        w.phase("agent", None)
        w.json("run.json", {**run, "phases": w.phases})
        w.close(half_line=True)
        return
    if unit.state == "setup_failed":
        # As the lifecycle records a hook that raises: the hook's error with its traceback (and its
        # output in hooks.log), the phase's end, then the unit's error.
        error = "RuntimeError: setup fails on purpose"
        w.phase("setup", None)
        w.clock += 0.4
        trace = 'Traceback (most recent call last):\n  File "main.py", line 7, in setup\n' + error + "\n"
        w.event("hook_error", hook="setup", error=error, traceback=trace)
        (w.folder / "hooks.log").write_text(f"--- setup ---\nstaging...\n{trace}")
        w.event("hook_output", hook="setup", file="hooks.log", chars=len(trace))
        w.event("phase_end", phase="setup", ok=False, seconds=0.4, error=error)
        w.phases["setup"].update(seconds=0.4, ok=False, error=error)
        w.event("error", status="setup_failed", error=error)
        status, score = "setup_failed", None
    elif unit.state == "interrupted":
        w.phase("setup", 1.0, inputs_staged=1)
        w.phase("agent", None)
        w.clock += 5.0
        w.event("interrupted")
        status, error, score = "interrupted", "interrupted", None
    else:
        w.phase("setup", 1.0, inputs_staged=1)
        _trajectory(w, unit, index)
        failed = unit.state == "agent_failed"
        error = "agent crashed (exit -11)" if failed else None
        agent_s = 2.0 + 0.05 * unit.screenshots
        w.phase("agent", agent_s, not failed, agent_status="failed" if failed else "completed", error=error)
        (w.folder / "agent" / "agent.log").write_text("starting\n" * 50 + "Segmentation fault\n")
        w.json(
            "agent_result.json", {"status": "failed" if failed else "completed", "error": error, "logs": ["agent.log"]}
        )
        score = 0.0 if failed else unit.score
        w.phase("evaluate", 0.05, score=score)
        result = {"score": score, "task": unit.task, "evaluated_at": _t(w.clock)}
        w.json("eval_result.json", {**result, "details": unit.details} if unit.details else result)
        (w.folder / "output").mkdir()
        (w.folder / "output" / "answer.txt").write_text("42\n")
        w.event("outputs_pulled", files=1)
        status = "agent_failed" if failed else "succeeded"
    w.phase("cleanup", 1.7, outcome="destroyed")
    run.update(
        status=status,
        score=score,
        error=error,
        cleanup={"mode": "destroy", "outcome": "destroyed"},
        finished_at=_t(w.clock),
        duration_s=round(w.clock - started, 3),
        agent_s=agent_s,
    )
    w.json("run.json", {**run, "phases": w.phases})
    w.close()


def make_run(
    root: Path,
    units: list[Unit],
    name: str = "synth",
    stamp: str = "20261201-040000-00001",
    setup: dict[str, Any] | None = None,
) -> Path:
    """``root/<name>-<stamp>/``: a run record of ``units`` (a ``queued`` one gets no folder). ``setup``: what
    the manifest says of where the run ran (``runner.setup_record``); without it, a manifest from before
    it said so."""
    run_id = f"{name}-{stamp}"
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    manifest = {
        "run_id": run_id,
        "fingerprint": "0000",
        "experiment": f"/nowhere/{name}.yaml",
        "spec": {"name": name, "concurrency": 2},
        "cleanup": "destroy",
        **(setup or {}),
        "units": [u.unit_id for u in units],
    }
    (run_dir / "experiment.json").write_text(json.dumps(manifest, indent=2))
    for index, unit in enumerate(units):
        if unit.state != "queued":
            _unit(run_dir / unit.unit_id, unit, index, run_id)
    return run_dir


def grid(agents: int, tasks: int, repeats: int = 1, **fields: Any) -> list[Unit]:
    """Every agent on every task, ``repeats`` times, all with the same ``fields``."""
    return [
        Unit(agent=f"agent{a}", task=f"task-{t}", repeat=r, **fields)
        for a in range(agents)
        for t in range(tasks)
        for r in range(repeats)
    ]


def bridge_calls(trajectory: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(tool name, result text, is_error) of every tool call in a trajectory."""
    calls = []
    for step in trajectory["steps"]:
        results = {r.get("source_call_id"): r for r in (step.get("observation") or {}).get("results", [])}
        for call in step.get("tool_calls") or []:
            result = results.get(call["tool_call_id"], {})
            calls.append((call["function_name"], str(result.get("content", "")), bool(result.get("is_error"))))
    return calls
