"""The ``ale-iac`` command line. Each area registers its commands from its own module."""

from __future__ import annotations

import os
import sys

import typer

from ale_iac.bridges.warm import WARM_ENV, forward
from ale_iac.errors import AleIacError, ConfigError

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
    # ``ale-iac mcp vm|cua`` in a run that keeps warm bridges: the warm process forks the bridge on this
    # process's stdio (ale_iac/bridges/warm.py), instead of this one importing the MCP SDK anew.
    if os.environ.get(WARM_ENV) and (code := forward(os.environ[WARM_ENV], sys.argv[1:])) is not None:
        sys.exit(code)
    _register()
    try:
        app()
    except AleIacError as exc:
        # A configuration error may hold several problems: one line each, so each names its file and field.
        lines = [str(p) for p in exc.problems] if isinstance(exc, ConfigError) else [str(exc)]
        for line in lines:
            typer.secho(f"error: {line}", fg=typer.colors.RED, err=True)
        sys.exit(2)
