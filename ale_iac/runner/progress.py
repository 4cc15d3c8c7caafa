"""What ``ale-iac evaluate`` shows while it runs.

On a terminal: one live display for the whole run (rich): a bar and the totals (done, running,
failed, queued, mean score so far, elapsed, an estimate of the time left) above a table of the units
with their phase and elapsed time. Otherwise (a file, a pipe, a CI log): plain lines, one per phase
change and per finished unit, each finished unit followed by a line of totals, and no escape codes.

The time left is an estimate from the units finished so far: each running unit needs the mean
duration minus what it has already run, each queued one the mean duration, and that work is shared
by as many units as run at once. There is no estimate before the first unit ends.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from ale_iac.runner.experiment import UnitPlan
from ale_iac.runner.lifecycle import UnitOutcome
from ale_iac.runner.status import UnitStatus

QUEUED, DONE = "queued", "done"
TABLE_CHROME = 9
"""Terminal lines the live display needs besides its unit rows (title, totals, bar, table frame)."""


def clock(seconds: float | None) -> str:
    """``0:01:05``; ``-`` for no value."""
    return "-" if seconds is None else str(dt.timedelta(seconds=max(0, round(seconds))))


@dataclass
class _Row:
    phase: str = QUEUED
    start: float | None = None
    phase_start: float | None = None
    end: float | None = None
    status: str = ""
    score: float | None = None
    duration: float | None = None

    @property
    def running(self) -> bool:
        return self.start is not None and not self.status


@dataclass(frozen=True)
class Totals:
    done: int
    running: int
    failed: int
    queued: int
    mean_score: float | None
    elapsed_s: float
    left_s: float | None

    def line(self, total: int) -> str:
        score = "-" if self.mean_score is None else f"{self.mean_score:.2f}"
        left = "-" if self.left_s is None else f"~{clock(self.left_s)}"
        return (
            f"{self.done}/{total} done ({self.failed} failed), {self.running} running, {self.queued} queued; "
            f"mean score {score}; elapsed {clock(self.elapsed_s)}; left {left}"
        )


class Progress:
    """Per-unit phase, elapsed time, status and score, and the run's totals (module docstring)."""

    def __init__(
        self,
        units: list[UnitPlan],
        console: Console,
        *,
        concurrency: int = 1,
        title: str = "ale-iac evaluate",
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console = console
        self.concurrency = max(1, concurrency)
        self.title = title
        self.now = now
        self.started = now()
        self.rows: dict[str, _Row] = {u.unit_id: _Row() for u in units}
        self.live: Live | None = None

    # --- events from the runner ---

    def phase(self, unit_id: str, phase: str) -> None:
        row, now = self.rows[unit_id], self.now()
        if row.start is None:
            row.start = now
        if phase == DONE:
            row.end = now
        row.phase, row.phase_start = phase, now
        if self.live is None:
            self.console.print(f"[{unit_id}] {phase}", highlight=False, markup=False)

    def finish(self, outcome: UnitOutcome) -> None:
        row = self.rows[outcome.unit_id]
        row.end = row.end or self.now()
        row.status, row.score, row.phase, row.duration = outcome.status, outcome.score, DONE, outcome.duration_s
        if self.live is None:
            score = "-" if outcome.score is None else f"{outcome.score:.2f}"
            self.console.print(
                f"[{outcome.unit_id}] {outcome.status} score={score} cleanup={outcome.cleanup}",
                highlight=False,
                markup=False,
            )
            self.console.print(f"progress: {self.totals().line(len(self.rows))}", highlight=False, markup=False)

    # --- what is shown ---

    def totals(self) -> Totals:
        now = self.now()
        rows = self.rows.values()
        done = [r for r in rows if r.status]
        running = [r for r in rows if r.running]
        queued = sum(1 for r in rows if r.start is None)
        scores = [r.score for r in done if r.score is not None]
        durations = [r.duration if r.duration is not None else (r.end or now) - (r.start or now) for r in done]
        left = None
        if durations and (running or queued):
            mean = sum(durations) / len(durations)
            work = sum(max(mean - (now - (r.start or now)), 0.0) for r in running) + queued * mean
            left = work / min(self.concurrency, len(running) + queued)
        elif durations:
            left = 0.0
        return Totals(
            done=len(done),
            running=len(running),
            failed=sum(1 for r in done if r.status != UnitStatus.SUCCEEDED),
            queued=queued,
            mean_score=sum(scores) / len(scores) if scores else None,
            elapsed_s=now - self.started,
            left_s=left,
        )

    def _ordered(self) -> list[tuple[str, _Row]]:
        """Running units first (oldest first), then failed ones, then the other finished ones
        (latest first), then the queued: what matters is at the top when the table is cut."""

        def key(item: tuple[str, _Row]) -> tuple[int, float]:
            row = item[1]
            if row.running:
                return 0, row.start or 0.0
            if row.status and row.status != UnitStatus.SUCCEEDED:
                return 1, -(row.end or 0.0)
            if row.status:
                return 2, -(row.end or 0.0)
            return 3, 0.0

        return sorted(self.rows.items(), key=key)

    def table(self, max_rows: int | None = None) -> Table:
        table = Table("unit", "phase", "in phase", "elapsed", "status", "score", expand=False)
        now = self.now()
        rows = self._ordered()
        shown = rows if max_rows is None or len(rows) <= max_rows else rows[: max(1, max_rows - 1)]
        for unit_id, row in shown:
            running = row.running
            elapsed = (
                row.duration
                if row.duration is not None
                else None
                if row.start is None
                else (row.end or now) - row.start
            )
            in_phase = (now - row.phase_start) if running and row.phase_start is not None else None
            style = "" if not row.status else ("green" if row.status == UnitStatus.SUCCEEDED else "red")
            table.add_row(
                unit_id,
                row.phase,
                clock(in_phase) if in_phase is not None else "",
                clock(elapsed) if elapsed is not None else "",
                Text(row.status, style=style),
                "" if row.score is None else f"{row.score:.2f}",
            )
        if len(shown) < len(rows):
            table.add_row(f"… {len(rows) - len(shown)} more", "", "", "", "", "")
        return table

    def render(self) -> RenderableType:
        totals = self.totals()
        total = len(self.rows)
        counts = Text.assemble(
            (f"{totals.done}/{total} done", "bold"),
            " · ",
            (f"{totals.running} running", "cyan"),
            " · ",
            (f"{totals.failed} failed", "red" if totals.failed else ""),
            f" · {totals.queued} queued",
        )
        # A grid, not the bar alone: a bar does not end its line.
        bar = Table.grid(padding=(0, 2))
        bar.add_row(
            ProgressBar(total=max(total, 1), completed=totals.done, width=min(40, self.console.width // 3)), counts
        )
        stats = Text.assemble(
            "mean score ",
            ("-" if totals.mean_score is None else f"{totals.mean_score:.2f}", "bold"),
            f" · elapsed {clock(totals.elapsed_s)} · left ",
            ("-" if totals.left_s is None else f"~{clock(totals.left_s)}", "bold"),
        )
        rows = max(3, self.console.size.height - TABLE_CHROME)
        return Group(Text(self.title, style="bold"), bar, stats, self.table(max_rows=rows))

    @contextlib.contextmanager
    def display(self) -> Iterator[None]:
        """The live display for the block's duration on a terminal; plain lines otherwise."""
        if not self.console.is_terminal or not self.rows:
            yield
            return
        with Live(get_renderable=self.render, console=self.console, refresh_per_second=4) as live:
            self.live = live
            try:
                yield
            finally:
                live.refresh()
                self.live = None
