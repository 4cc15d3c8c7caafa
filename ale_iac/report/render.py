"""The report on disk: ``index.html`` and ``assets/`` (one page per unit, plots, screenshots, CSS).

Pages are rendered by jinja2 with autoescaping on for everything (agent output, tool arguments and
task text are untrusted), carry no script, and declare a Content-Security-Policy that allows only
their own files: a page opened from disk or served on 127.0.0.1 fetches nothing else. Screenshots
are hard-linked (copied across file systems) into ``assets/shots/`` and shown with
``loading="lazy"`` and their size, so a page with thousands of them loads only what is on screen.

A report is built in a temporary folder next to the target and swapped in, so rebuilding the report
of a running run never leaves a half-written one; an existing folder is replaced only if it is a
report (it holds :data:`MARKER`).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup, escape
from PIL import Image, UnidentifiedImageError

from ale_iac.errors import AleIacError
from ale_iac.report import plots
from ale_iac.report.atif import Screenshot
from ale_iac.report.compare import Comparison, compare
from ale_iac.report.model import RunView, UnitView, parse_time

MARKER = ".ale-iac-report"
NONE = "\u2013"
"""What a page shows for no value (an en dash)."""
MAX_EVENTS = 2000
"""Events listed on a unit's page; the rest are counted (the record has them all)."""
LONG_TEXT = 3000
"""Text longer than this is folded (a <details> element)."""


@dataclass
class Shot:
    href: str
    label: str
    width: int | None
    height: int | None


def duration(seconds: float | None) -> str:
    if seconds is None:
        return NONE
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} m {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} m"


def score(value: float | None) -> str:
    return NONE if value is None else f"{value:.2f}"


def signed(value: float | None, unit: str = "") -> str:
    return NONE if value is None else f"{value:+.2f}{unit}"


def size(count: int) -> str:
    value, unit = float(count), "B"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            break
        value /= 1024
    return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"


def tokens(values: dict[str, float]) -> str:
    parts = [f"{int(values[k]):,} {k.removesuffix('_tokens')}" for k in values if k.endswith("_tokens")]
    if "cost_usd" in values:
        parts.append(f"${values['cost_usd']:.4f}")
    return ", ".join(parts) if parts else NONE


def compact(data: Any) -> str:
    """A record's fields on one line, as JSON (escaped by the template like everything else)."""
    return json.dumps(data, ensure_ascii=False, default=str) if data else ""


def detail(value: Any) -> str:
    """A grader's detail: text as it is, anything else as JSON (``0`` and ``false`` shown, not blank)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def breakable(unit_id: str) -> Markup:
    """A unit id (``agent__task__rN``) that a narrow column may wrap after each ``__`` (escaped, with ``<wbr>``)."""
    return Markup("__<wbr>").join(escape(part) for part in unit_id.split("__"))


def offset(timestamp: str | None, start: dt.datetime | None) -> str:
    """A step's time as ``+N s`` on the unit's clock (its time of day if the unit's start is unknown)."""
    when = parse_time(timestamp)
    if when is None:
        return ""
    return f"+{duration((when - start).total_seconds())}" if start else when.strftime("%H:%M:%S")


def epoch(seconds: float | None) -> str:
    """A UTC epoch time (an egress attempt's) as its time of day, to the millisecond."""
    if not isinstance(seconds, int | float):
        return "-"
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%H:%M:%S.%f")[:-3]


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("ale_iac.report", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        duration=duration,
        score=score,
        signed=signed,
        size=size,
        tokens=tokens,
        compact=compact,
        detail=detail,
        breakable=breakable,
        epoch=epoch,
    )
    env.globals.update(LONG_TEXT=LONG_TEXT, MAX_EVENTS=MAX_EVENTS, offset=offset)
    return env


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")[:80] or "unit"


def _link(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


class _Assets:
    """Writes ``assets/`` and hands out the hrefs pages use, relative to the page's folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        for sub in ("units", "plots", "shots"):
            (root / sub).mkdir(parents=True)

    def plot(self, name: str, svg: str | None) -> str | None:
        if svg is None:
            return None
        (self.root / "plots" / name).write_text(svg, encoding="utf-8")
        return f"plots/{name}"

    def shots(self, index: int, unit: UnitView) -> dict[Path, Shot]:
        """Each screenshot of ``unit`` into ``assets/shots/<index>/``, once, by its resolved path."""
        out: dict[Path, Shot] = {}
        folder = self.root / "shots" / f"{index:04d}"
        shots: list[Screenshot] = (
            [s for step in unit.trajectory.steps for s in step.all_screenshots] if unit.trajectory else []
        )
        for shot in shots:
            if shot.path in out:
                continue
            folder.mkdir(exist_ok=True)
            name = f"{len(out) + 1:05d}{shot.path.suffix.lower()}"
            _link(shot.path, folder / name)
            width: int | None
            height: int | None
            try:
                with Image.open(shot.path) as image:
                    width, height = image.size
            except (OSError, UnidentifiedImageError):
                width = height = None  # the browser shows what it can; no placeholder size
            out[shot.path] = Shot(f"../shots/{folder.name}/{name}", shot.label, width, height)
        return out


def _matrix(run: RunView) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (agent, task): its units, how many finished and succeeded, and the mean score."""
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    for unit in run.units:
        cell = cells.setdefault((unit.agent, unit.task), {"units": 0, "finished": 0, "succeeded": 0, "scores": []})
        cell["units"] += 1
        cell["finished"] += unit.finished
        cell["succeeded"] += unit.status == "succeeded"
        if unit.score is not None:
            cell["scores"].append(unit.score)
    for cell in cells.values():
        cell["score"] = sum(cell["scores"]) / len(cell["scores"]) if cell["scores"] else None
    return cells


def _prepare(out_dir: Path, run: RunView) -> Path:
    if out_dir.resolve() == run.folder.resolve() or run.folder.resolve().is_relative_to(out_dir.resolve()):
        raise AleIacError(f"{out_dir}: the report cannot be written over the run folder itself")
    if out_dir.exists() and not (out_dir / MARKER).is_file():
        raise AleIacError(f"{out_dir} exists and is not an ale-iac report; choose another --out")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.with_name(f".{out_dir.name}.{os.getpid()}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    return staging


def _swap(staging: Path, out_dir: Path) -> None:
    old = out_dir.with_name(f".{out_dir.name}.{os.getpid()}.old")
    if out_dir.exists():
        out_dir.rename(old)
    staging.rename(out_dir)
    shutil.rmtree(old, ignore_errors=True)


def write_report(run: RunView, out_dir: Path, other: RunView | None = None) -> Path:
    """Write the report of ``run`` (compared with ``other``, if given) to ``out_dir``; returns its index.html."""
    env = _environment()
    staging = _prepare(out_dir, run)
    try:
        assets = _Assets(staging / "assets")
        shutil.copyfile(Path(__file__).with_name("templates") / "style.css", staging / "assets" / "style.css")
        pages = {u.unit_id: f"units/{i:04d}-{_slug(u.unit_id)}.html" for i, u in enumerate(run.units, start=1)}
        unit_page = env.get_template("unit.html")
        hrefs = [f"../{pages[u.unit_id]}" for u in run.units]
        for index, unit in enumerate(run.units, start=1):
            elapsed = unit.elapsed_s(run.generated_at)
            html = unit_page.render(
                run=run,
                unit=unit,
                previous=hrefs[index - 2] if index > 1 else None,
                next=hrefs[index] if index < len(hrefs) else None,
                elapsed=elapsed,
                shots=assets.shots(index, unit),
                timeline=assets.plot(f"unit-{index:04d}.svg", plots.timeline(unit, elapsed)),
                root="../",
            )
            (assets.root / pages[unit.unit_id]).write_text(html, encoding="utf-8")
        comparison: Comparison | None = compare(run, other) if other is not None else None
        index_html = env.get_template("index.html").render(
            run=run,
            pages=pages,
            matrix=_matrix(run),
            phases=plots.phase_names(run.units),
            bars=assets.plot("phases-per-unit.svg", plots.phase_bars(run.units)),
            spread=assets.plot("phase-spread.svg", plots.phase_spread(run.units)),
            comparison=comparison,
            root="assets/",
        )
        (staging / "index.html").write_text(index_html, encoding="utf-8")
        (staging / MARKER).write_text(f"report of {run.folder}\n", encoding="utf-8")
        _swap(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir / "index.html"
