"""``ale-iac plan``: render what a stack declares, offline, as stable text for code review."""

from __future__ import annotations

from pathlib import Path

import typer


def plan(
    profile: str = typer.Option(..., "--profile", "-p", help="Stack name (stacks/Pulumi.<name>.yaml) or file."),
    units: int | None = typer.Option(
        None, "--units", "-n", min=1, help="Units to declare (pool: default its size; else 1 per snapshot)."
    ),
    out: Path | None = typer.Option(None, "--out", "-o", help="Write the plan here instead of stdout."),
) -> None:
    """Render the resource graph a profile's program declares, under Pulumi mocks.

    Needs no cloud account, no Pulumi CLI and no provider plugin. Commit the output of shipped
    stacks under stacks/plans/ so every infrastructure change shows up as a diff in review.
    """
    from ale_iac.infra.plan import render_profile

    result = render_profile(profile, units)
    if out is None:
        typer.echo(result.text, nl=False)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(result.text)
        typer.echo(
            f"wrote {out}: {result.unit_count} unit(s), {result.resource_count} resource(s), "
            f"{result.violations} policy violation(s)",
            err=True,
        )
    if result.violations:
        raise typer.Exit(code=1)


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)
