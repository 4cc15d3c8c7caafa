"""Two runs of one experiment side by side: per agent and task, the mean score and time of each and
the difference (this run minus the other). Repeats are averaged; units not finished are left out."""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean

from ale_iac.report.model import RunView, UnitView


@dataclass
class Side:
    units: int
    score: float | None
    seconds: float | None


@dataclass
class TaskDiff:
    agent: str
    task: str
    this: Side | None
    other: Side | None

    @property
    def score_delta(self) -> float | None:
        if self.this and self.other and self.this.score is not None and self.other.score is not None:
            return self.this.score - self.other.score
        return None

    @property
    def seconds_delta(self) -> float | None:
        if self.this and self.other and self.this.seconds is not None and self.other.seconds is not None:
            return self.this.seconds - self.other.seconds
        return None


@dataclass
class Comparison:
    other: RunView
    rows: list[TaskDiff]
    same_experiment: bool
    setup_differs: bool
    """The runs ran on different profiles or pools, or an agent on another executor or model."""


def _setup(run: RunView) -> tuple[object, ...]:
    agents = sorted((a.name, a.executor, a.model, a.model_base_url) for a in run.agent_setups)
    return run.profile, run.pool, tuple(agents)


def _side(units: list[UnitView]) -> Side | None:
    done = [u for u in units if u.finished]
    if not done:
        return None
    scores = [u.score for u in done if u.score is not None]
    seconds = [u.duration_s for u in done if u.duration_s is not None]
    return Side(len(done), fmean(scores) if scores else None, fmean(seconds) if seconds else None)


def compare(this: RunView, other: RunView) -> Comparison:
    keys = list(dict.fromkeys((u.agent, u.task) for u in [*this.units, *other.units]))
    rows = [
        TaskDiff(
            agent,
            task,
            _side([u for u in this.units if (u.agent, u.task) == (agent, task)]),
            _side([u for u in other.units if (u.agent, u.task) == (agent, task)]),
        )
        for agent, task in keys
    ]
    return Comparison(
        other=other,
        rows=rows,
        same_experiment=this.experiment == other.experiment,
        setup_differs=_setup(this) != _setup(other),
    )
