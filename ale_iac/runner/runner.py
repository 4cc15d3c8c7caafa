"""``ale-iac evaluate``: run every unit of an experiment with bounded concurrency, record, summarize.

Interrupts: the first SIGINT/SIGTERM cancels every unit; each unit's cleanup runs (destroying its
stack) before the process exits. A second one stops waiting, prints what is left and the command
that removes it, and exits at once.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from ale_iac.engine import Engine
from ale_iac.errors import AleIacError, ConfigError
from ale_iac.profile import CleanupMode, resolve_profile
from ale_iac.provision import ensure_images
from ale_iac.runner.experiment import Experiment, UnitPlan
from ale_iac.runner.lifecycle import INTERRUPTED, RunContext, UnitOutcome, run_unit
from ale_iac.runner.records import Redactor
from ale_iac.runner.registry import RunRegistry

RESULTS = "results.jsonl"
MANIFEST = "experiment.json"


@dataclass
class RunSummary:
    run_id: str
    run_dir: Path
    outcomes: list[UnitOutcome]
    skipped: list[str] = field(default_factory=list)
    interrupted: bool = False

    @property
    def retained(self) -> list[UnitOutcome]:
        return [o for o in self.outcomes if o.cleanup == "retained"]


def _new_run_dir(experiment: Experiment) -> tuple[str, Path]:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    run_id = f"{experiment.spec.name}-{stamp}-{os.getpid() % 100000:05d}"
    return run_id, experiment.output_root / run_id


def _latest_run_dir(experiment: Experiment) -> Path | None:
    candidates = sorted(
        (p for p in experiment.output_root.glob(f"{experiment.spec.name}-*") if (p / MANIFEST).exists()),
        key=lambda p: p.stat().st_mtime,
    )
    return candidates[-1] if candidates else None


def _finished_units(run_dir: Path) -> set[str]:
    done = set()
    for run_json in run_dir.glob("*/run.json"):
        try:
            status = json.loads(run_json.read_text()).get("status")
        except (OSError, ValueError):
            continue
        if status not in (None, "running", INTERRUPTED):
            done.add(run_json.parent.name)
    return done


def _secrets(experiment: Experiment) -> dict[str, str]:
    values = {}
    for agent in experiment.agents:
        for name in agent.secrets:
            if not os.environ.get(name):
                raise ConfigError(
                    agent.source_dir, f"agent {agent.name}: secrets", f"environment variable {name} is not set"
                )
            values[name] = os.environ[name]
    return values


class Progress:
    """Per-unit phase, elapsed time, status and score: a live table on a terminal, lines otherwise."""

    def __init__(self, units: list[UnitPlan], console: Console) -> None:
        self.console = console
        self.rows: dict[str, dict[str, Any]] = {
            u.unit_id: {"phase": "queued", "start": None, "status": "", "score": None} for u in units
        }
        self.live: Live | None = None

    def table(self) -> Table:
        table = Table("unit", "phase", "elapsed", "status", "score", title="ale-iac evaluate")
        now = time.monotonic()
        for unit_id, row in self.rows.items():
            elapsed = "" if row["start"] is None else f"{(row.get('end') or now) - row['start']:.0f}s"
            score = "" if row["score"] is None else f"{row['score']:.2f}"
            table.add_row(unit_id, row["phase"], elapsed, row["status"], score)
        return table

    def phase(self, unit_id: str, phase: str) -> None:
        row = self.rows[unit_id]
        if row["start"] is None:
            row["start"] = time.monotonic()
        if phase == "done":
            row["end"] = time.monotonic()
        row["phase"] = phase
        if self.live is None:
            self.console.print(f"[{unit_id}] {phase}", highlight=False, markup=False)

    def finish(self, outcome: UnitOutcome) -> None:
        row = self.rows[outcome.unit_id]
        row.update(status=outcome.status, score=outcome.score, phase="done")
        if self.live is None:
            score = "-" if outcome.score is None else f"{outcome.score:.2f}"
            self.console.print(
                f"[{outcome.unit_id}] {outcome.status} score={score} cleanup={outcome.cleanup}",
                highlight=False,
                markup=False,
            )


async def _run_all(
    experiment: Experiment, plans: list[UnitPlan], ctx: RunContext, concurrency: int, progress: Progress
) -> tuple[list[UnitOutcome], bool]:
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=max(8, concurrency * 3), thread_name_prefix="ale"))
    semaphore = asyncio.Semaphore(concurrency)
    results_path = ctx.run_dir / RESULTS
    outcomes: list[UnitOutcome] = []

    async def one(plan: UnitPlan) -> None:
        async with semaphore:
            outcome = await run_unit(plan, ctx)
        outcomes.append(outcome)
        progress.finish(outcome)
        with results_path.open("a") as handle:
            handle.write(json.dumps(ctx.redactor.json(outcome.as_result())) + "\n")

    tasks = [asyncio.create_task(one(p), name=p.unit_id) for p in plans]
    interrupts = 0

    def on_signal(signum: int) -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts == 1:
            progress.console.print(
                f"\n[yellow]{signal.Signals(signum).name}: stopping; destroying in-flight units "
                "(interrupt again to leave them)[/yellow]"
            )
            for task in tasks:
                task.cancel()
            return
        left = ctx.registry.stacks
        progress.console.print("\n[red]second interrupt: exiting without finishing cleanup[/red]")
        if left:
            progress.console.print("stacks left behind: " + ", ".join(left))
            progress.console.print("remove them with:  ale-iac gc")
        os._exit(130)

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    return outcomes, interrupts > 0


def run_experiment(
    experiment: Experiment,
    *,
    resume: bool = False,
    console: Console | None = None,
) -> RunSummary:
    console = console or Console()
    spec = experiment.spec
    secrets_env = _secrets(experiment)
    redactor = Redactor(secrets_env.values())

    engine: Engine | None = None
    profile = None
    if spec.pool:
        engine = Engine()
        cleanup = spec.cleanup or CleanupMode.DESTROY
    else:
        loaded = resolve_profile(spec.profile or "local")
        profile = loaded.profile
        for task in experiment.tasks:
            try:
                profile.route(task.card.snapshot)
            except ConfigError as exc:
                raise ConfigError(task.folder / "task.yaml", "snapshot", exc.detail) from None
        cleanup = spec.cleanup or profile.cleanup
        ensure_images(profile, log=lambda line: console.print(f"[dim]{line}[/dim]", highlight=False))
        engine = Engine()

    fingerprint = experiment.fingerprint()
    plans = experiment.units
    skipped: list[str] = []
    if resume:
        run_dir = _latest_run_dir(experiment)
        if run_dir is None:
            raise AleIacError(f"nothing to resume: no earlier run of '{spec.name}' under {experiment.output_root}")
        manifest = json.loads((run_dir / MANIFEST).read_text())
        if manifest.get("fingerprint") != fingerprint:
            raise AleIacError(
                f"refusing to resume {run_dir}: the experiment changed since that run (agents, tasks, profile or "
                "repeats differ); start a new run without --resume"
            )
        run_id = manifest["run_id"]
        done = _finished_units(run_dir)
        skipped = [p.unit_id for p in plans if p.unit_id in done]
        plans = [p for p in plans if p.unit_id not in done]
        console.print(f"resuming {run_dir}: {len(skipped)} finished, {len(plans)} to run")
    else:
        run_id, run_dir = _new_run_dir(experiment)
        run_dir.mkdir(parents=True, exist_ok=False)
        (run_dir / MANIFEST).write_text(
            json.dumps(
                redactor.json(
                    {
                        "run_id": run_id,
                        "fingerprint": fingerprint,
                        "experiment": str(experiment.source),
                        "spec": spec.model_dump(mode="json"),
                        "cleanup": cleanup.value,
                        "units": [p.unit_id for p in plans],
                    }
                ),
                indent=2,
            )
        )

    registry = RunRegistry(run_id, run_dir)
    progress = Progress(plans, console)
    ctx = RunContext(
        run_id=run_id,
        run_dir=run_dir,
        engine=engine,
        profile=profile,
        pool=spec.pool,
        cleanup=cleanup,
        unit_timeout_s=spec.unit_timeout_s,
        registry=registry,
        redactor=redactor,
        secrets_env=secrets_env,
        on_phase=progress.phase,
    )
    try:
        if console.is_terminal and plans:
            with Live(get_renderable=progress.table, console=console, refresh_per_second=4) as live:
                progress.live = live
                outcomes, interrupted = asyncio.run(_run_all(experiment, plans, ctx, spec.concurrency, progress))
        else:
            outcomes, interrupted = asyncio.run(_run_all(experiment, plans, ctx, spec.concurrency, progress))
    finally:
        registry.close()
    outcomes.sort(key=lambda o: o.unit_id)
    return RunSummary(run_id=run_id, run_dir=run_dir, outcomes=outcomes, skipped=skipped, interrupted=interrupted)


def print_summary(summary: RunSummary, console: Console) -> None:
    table = Table("unit", "agent", "task", "status", "score", "time", "cleanup", title=f"results: {summary.run_dir}")
    for o in summary.outcomes:
        table.add_row(
            o.unit_id,
            o.agent,
            o.task,
            o.status,
            "-" if o.score is None else f"{o.score:.2f}",
            f"{o.duration_s:.1f}s",
            o.cleanup,
        )
    console.print(table)
    scored = [o.score for o in summary.outcomes if o.score is not None]
    if scored:
        console.print(f"mean score {sum(scored) / len(scored):.3f} over {len(scored)} graded unit(s)")
    if summary.skipped:
        console.print(f"skipped (already finished): {len(summary.skipped)}")
    for o in summary.retained:
        endpoint = (o.handle or {}).get("endpoint")
        console.print(f"retained: stack {o.stack} -> {endpoint}  (destroy: ale-iac sandbox destroy {o.stack})")
    if summary.interrupted:
        console.print("[yellow]run was interrupted; rerun with --resume to finish it[/yellow]")


def exit_code(summary: RunSummary) -> int:
    if summary.interrupted:
        return 130
    return 0 if all(o.status == "succeeded" for o in summary.outcomes) else 1
