"""The report's plots, drawn by matplotlib as SVG text (no pyplot: no global state, no GUI backend).

Text stays text in the SVG (``svg.fonttype: none``: small files, selectable labels; matplotlib
escapes it), and ids are salted with a constant so the same run gives the same bytes.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import matplotlib as mpl
from matplotlib.figure import Figure

from ale_iac.report.model import UnitView

PHASE_ORDER = ("provision", "ready", "setup", "agent", "evaluate", "cleanup")
LABEL_MAX = 48
_STYLE: dict[Any, Any] = {  # matplotlib types rc keys as a Literal of every name
    "svg.fonttype": "none",
    "svg.hashsalt": "ale-iac-report",
    "font.size": 9,
    "font.family": "sans-serif",
    "axes.spines.top": False,
    "axes.spines.right": False,
}


def phase_names(units: Sequence[UnitView]) -> list[str]:
    """The lifecycle's phases in order, then any other phase a record has, in order of appearance."""
    seen = dict.fromkeys(p.name for u in units for p in u.phases)
    return [p for p in PHASE_ORDER if p in seen] + [p for p in seen if p not in PHASE_ORDER]


def _colors(names: Sequence[str]) -> dict[str, str]:
    cycle = mpl.color_sequences["tab10"]
    return {name: mpl.colors.to_hex(cycle[i % len(cycle)]) for i, name in enumerate(names)}


def _label(text: str) -> str:
    return text if len(text) <= LABEL_MAX else text[: LABEL_MAX - 1] + "…"


def _svg(fig: Figure, tight: bool = True) -> str:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None}, bbox_inches="tight" if tight else None)
    return buffer.getvalue()


def phase_bars(units: Sequence[UnitView]) -> str | None:
    """One horizontal bar per unit, stacked by phase: where each unit's time went."""
    units = [u for u in units if u.phases]
    names = phase_names(units)
    if not names:
        return None
    colors = _colors(PHASE_ORDER + tuple(n for n in names if n not in PHASE_ORDER))
    with mpl.rc_context(_STYLE):
        fig = Figure(figsize=(9, 1.4 + 0.24 * len(units)), layout="constrained")
        ax = fig.add_subplot()
        rows = list(range(len(units)))[::-1]
        left = [0.0] * len(units)
        for name in names:
            widths = [u.phase_seconds().get(name, 0.0) for u in units]
            ax.barh(rows, widths, left=left, color=colors[name], label=name, height=0.7)
            left = [a + b for a, b in zip(left, widths, strict=True)]
        ax.set_yticks(rows, [_label(u.unit_id) for u in units])
        ax.set_xlabel("seconds")
        ax.set_ylim(-0.6, len(units) - 0.4)
        ax.legend(ncols=min(len(names), 7), loc="lower left", bbox_to_anchor=(0, 1.0), frameon=False)
        return _svg(fig)


def phase_spread(units: Sequence[UnitView]) -> str | None:
    """Per phase, the time it took in each unit: a box per phase with every unit as a point."""
    names = phase_names(units)
    series = [[u.phase_seconds()[n] for u in units if n in u.phase_seconds()] for n in names]
    if not any(series):
        return None
    colors = _colors(PHASE_ORDER + tuple(n for n in names if n not in PHASE_ORDER))
    with mpl.rc_context(_STYLE):
        fig = Figure(figsize=(9, 3.2), layout="constrained")
        ax = fig.add_subplot()
        positions = list(range(1, len(names) + 1))
        ax.boxplot(series, positions=positions, widths=0.5, showfliers=False)
        for x, name, values in zip(positions, names, series, strict=True):
            # Spread the points across the box's width, in a fixed order: the same run, the same plot.
            n = len(values)
            xs = [x - 0.18 + 0.36 * (i + 0.5) / n for i in range(n)]
            ax.scatter(xs, values, s=10, color=colors[name], alpha=0.8, zorder=3)
        ax.set_xticks(positions, names)
        ax.set_ylabel("seconds")
        return _svg(fig)


def timeline(unit: UnitView, elapsed_s: float | None = None) -> str | None:
    """One unit's phases on its own clock: when each started and how long it took. A phase still
    running (hatched, as is a failed one) reaches ``elapsed_s``, the unit's time so far."""
    phases = [p for p in unit.phases if p.offset_s is not None]
    if not phases:
        return None
    colors = _colors(PHASE_ORDER + tuple(p.name for p in phases if p.name not in PHASE_ORDER))
    label = max(len(_label(p.name)) for p in phases)
    width, height = 9.0, 0.7 + 0.3 * len(phases)
    with mpl.rc_context(_STYLE):
        # Margins fixed in inches, not found by a layout engine: one of these per unit, and the
        # engine's extra drawing passes made them three times slower (bench/bench_report.py).
        fig = Figure(figsize=(width, height))
        left = min(0.2 + 0.075 * label, width / 2)
        fig.subplots_adjust(left=left / width, right=1 - 0.2 / width, bottom=0.5 / height, top=1 - 0.1 / height)
        ax = fig.add_subplot()
        for row, phase in enumerate(reversed(phases)):
            start = phase.offset_s or 0.0
            width = phase.seconds if phase.seconds is not None else max((elapsed_s or start) - start, 0.0)
            bar = [(start, max(width, 0.01))]
            ax.broken_barh(bar, (row - 0.35, 0.7), color=colors[phase.name])
            if phase.seconds is None or phase.ok is False:
                ax.broken_barh(bar, (row - 0.35, 0.7), facecolor="none", edgecolor="black", hatch="//")
        ax.set_yticks(range(len(phases)), [p.name for p in reversed(phases)])
        ax.set_xlabel("seconds since the unit started")
        return _svg(fig, tight=False)
