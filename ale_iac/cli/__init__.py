"""The ``ale-iac`` command line. Each area registers its commands from its own module."""

from __future__ import annotations

import sys

import typer

from ale_iac.errors import AleIacError

app = typer.Typer(
    name="ale-iac",
    help="Sandboxes for computer-use agents as declarative infrastructure on Pulumi.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _register() -> None:
    # Imported here, not at module top, so each area's heavy imports stay in its own commands.
    from ale_iac.cli import doctor, env, evaluate, images, mcp, models, plan, report, sandbox

    for area in (doctor, env, images, sandbox, evaluate, report, mcp, models, plan):
        area.register(app)


def main() -> None:
    _register()
    try:
        app()
    except AleIacError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        sys.exit(2)
