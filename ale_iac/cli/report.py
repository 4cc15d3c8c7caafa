"""``ale-iac report``: a run record as an HTML report to open from disk or serve on 127.0.0.1."""

from __future__ import annotations

import webbrowser
from pathlib import Path

import typer

from ale_iac.errors import AleIacError


def report(
    run_dir: Path = typer.Argument(..., help="The run's folder, e.g. runs/demo-20261201-040226-16498."),
    out: Path = typer.Option(None, "--out", help="Where to write the report (default: RUN_DIR/report)."),
    compare: Path = typer.Option(None, "--compare", help="Another run of the same experiment to compare with."),
    open_: bool = typer.Option(False, "--open", help="Open the report in the default web browser."),
    serve: bool = typer.Option(False, "--serve", help="Serve the report on 127.0.0.1 until interrupted."),
    port: int = typer.Option(0, "--port", help="The port for --serve (default: any free one)."),
) -> None:
    """Write an HTML report of a run (finished or still running): summary, plots, each unit's trajectory."""
    from ale_iac.report import load_run, write_report
    from ale_iac.report.serve import serve as serve_folder

    try:
        run = load_run(run_dir)
        other = load_run(compare) if compare is not None else None
    except FileNotFoundError as exc:
        raise AleIacError(str(exc)) from None
    if other is not None and other.experiment != run.experiment:
        typer.secho(
            f"warning: comparing runs of different experiments ({run.experiment}, {other.experiment})",
            fg=typer.colors.YELLOW,
            err=True,
        )
    target = out or run_dir / "report"
    index = write_report(run, target, other)
    state = "in progress" if run.in_progress else "finished"
    typer.echo(f"report of {run.run_id} ({len(run.units)} units, {state}): {index}")
    if serve:

        def ready(url: str) -> None:
            typer.echo(f"serving {target} at {url} (Ctrl-C stops)")
            if open_:
                webbrowser.open(url)

        serve_folder(target, port, ready)
    elif open_:
        webbrowser.open(index.resolve().as_uri())


def register(app: typer.Typer) -> None:
    app.command("report")(report)
