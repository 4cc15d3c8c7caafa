"""``ale-iac sandbox create|env|ls|destroy``: single sandboxes by hand, one ephemeral stack each."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from ale_iac.errors import AleIacError

if TYPE_CHECKING:
    from ale_iac.engine import Engine

sandbox_app = typer.Typer(help="Create, list and destroy single sandboxes (one stack each).", no_args_is_help=True)


@sandbox_app.command("create")
def create(
    profile: str = typer.Option("local", help="Profile name (stacks/Pulumi.<name>.yaml) or path."),
    snapshot: str = typer.Option(None, help="Logical snapshot; default: the profile's default."),
    as_json: bool = typer.Option(False, "--json", help="Print the handle as JSON."),
) -> None:
    """Bring one unit up, wait until it is ready, print its handle. Failure leaves nothing behind."""
    from ale_iac.contract import UnitSpec
    from ale_iac.engine import Engine
    from ale_iac.profile import resolve_profile
    from ale_iac.provision import UNIT_NAME, destroy_stack, ensure_images, new_stack_name, up_unit
    from ale_iac.sandbox.readiness import wait_ready

    err = Console(stderr=True)
    loaded = resolve_profile(profile)
    loaded.profile.route(snapshot)  # a bad snapshot fails here, before anything is created
    ensure_images(loaded.profile, log=lambda line: err.print(f"[dim]{line}[/dim]"))
    engine = Engine()
    stack = new_stack_name("sbx", loaded.profile.name)
    err.print(f"creating stack {stack} ...")
    handle = up_unit(engine, loaded.profile, stack, UnitSpec(name=UNIT_NAME, snapshot=snapshot))
    try:
        report = asyncio.run(wait_ready(handle, loaded.profile.ready_timeout_s))
    except BaseException:
        err.print(f"sandbox did not become ready; destroying {stack}")
        destroy_stack(engine, stack)
        raise
    err.print(f"ready in {report.seconds:.1f} s (computer-server {report.server_version})")
    sys.stdout.write(handle_text(handle.summary(), as_json))
    err.print(f'use it with: eval "$(ale-iac sandbox env {stack})"   (the endpoint and its token)')
    err.print(f"destroy it with: ale-iac sandbox destroy {stack}")


def handle_text(summary: dict[str, Any], as_json: bool) -> str:
    """A handle for stdout: plain JSON with ``--json`` (for scripts), else one ``key: value`` a line."""
    if as_json:
        return json.dumps(summary, indent=2) + "\n"
    width = max((len(k) for k in summary), default=0)
    lines = []
    for key, value in summary.items():
        shown = value if isinstance(value, str) else json.dumps(value)
        lines.append(f"{key + ':':<{width + 1}} {shown}")
    return "\n".join(lines) + "\n"


@sandbox_app.command("env")
def env(
    stack: str = typer.Argument(..., help="Stack of the sandbox (as printed by `sandbox create`)."),
    unit: str = typer.Option(None, help="Unit of the stack (default: its only unit)."),
) -> None:
    """Print shell lines that export the sandbox's endpoint and its token, for `eval "$(...)"`.

    Sandboxes ale-iac starts answer only requests that carry their token; ``ale-iac mcp vm|cua``
    and the client read it from ALE_IAC_ENDPOINT_TOKEN.
    """
    import shlex

    from ale_iac.contract import ENDPOINT_TOKEN_ENV
    from ale_iac.engine import read_unit_handle

    handle = read_unit_handle(stack, unit)
    typer.echo(f"export ALE_IAC_ENDPOINT={shlex.quote(handle.endpoint)}")
    token = handle.token()
    if token:
        typer.echo(f"export {ENDPOINT_TOKEN_ENV}={shlex.quote(token)}")
    else:
        typer.echo(f"unset {ENDPOINT_TOKEN_ENV}")


@sandbox_app.command("ls")
def ls(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the ale-iac stacks in the backend and the units each exports.

    A state file that a kill tore (which fails ``pulumi stack ls`` as a whole) does not fail the listing:
    its stack is listed as damaged, and each damaged file is named on stderr with what ``ale-iac gc``
    does about it.
    """
    from ale_iac.engine import Engine

    engine = Engine()
    found = engine.scan_state()
    damage = found.damage if found is not None else []
    rows: list[dict[str, Any]] = []
    for info in engine.list_stacks():
        rows += _stack_rows(engine, info.name, info.locked)
    listed = {row["stack"] for row in rows}
    for stack in sorted({d.stack for d in damage if d.stack is not None} - listed):
        problem = next(d.problem for d in damage if d.stack == stack)
        rows.append(_row(stack, endpoint=f"(damaged state: {problem})", locked=engine.is_locked(stack)))
    for bad in damage:
        typer.echo(f"damaged state file {bad.path}: {bad.problem} (ale-iac gc will {bad.remedy})", err=True)
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    console = Console()
    console.print(ls_table(rows, console.width))


def ls_table(rows: list[dict[str, Any]], width: int) -> Table:
    """The table ``sandbox ls`` prints on a terminal ``width`` columns wide: long values (stack and run names,
    endpoints, errors) fold onto more lines instead of squeezing the other columns to nothing, and the stack
    name, which ``sandbox destroy`` takes, is always there whole."""
    longest = max((len(str(row["stack"])) for row in rows), default=5)
    # What the four folding columns share (the width less six columns' borders and padding, provider and
    # locked): the stack takes what it needs of it, up to all but 10 for each other one, at least half.
    room = width - (7 + 2 * 6) - len("provider") - len("locked")
    table = Table()
    table.add_column("unit", overflow="fold")
    table.add_column("provider", no_wrap=True)
    table.add_column("endpoint", overflow="fold")
    table.add_column("run", overflow="fold")
    table.add_column("locked", no_wrap=True)
    table.add_column("stack", overflow="fold", width=max(5, min(longest, max(room // 2, room - 30))))
    for row in rows:
        cells = (str(row[k]) for k in ("unit", "provider", "endpoint", "run"))
        table.add_row(*cells, "yes" if row["locked"] else "", str(row["stack"]))
    return table


def _stack_rows(engine: Engine, stack: str, locked: bool) -> list[dict[str, Any]]:
    """One row per unit of the stack; one row saying why when it exports none or cannot be read."""
    try:
        units = engine.units(stack)
    except AleIacError as exc:
        return [_row(stack, endpoint=f"({exc})", locked=locked)]
    rows = [
        _row(
            stack,
            unit=name,
            run=unit.labels.get("run", "-"),
            endpoint=unit.endpoint,
            provider=unit.provider,
            locked=locked,
        )
        for name, unit in units.items()
    ]
    return rows or [_row(stack, locked=locked)]


def _row(
    stack: str, *, unit: str = "-", run: str = "-", endpoint: str = "-", provider: str = "-", locked: bool
) -> dict[str, Any]:
    return {"stack": stack, "unit": unit, "run": run, "endpoint": endpoint, "provider": provider, "locked": locked}


@sandbox_app.command("destroy")
def destroy(
    stack: str = typer.Argument(None, help="Stack of the sandbox (as printed by `sandbox create`)."),
    all_: bool = typer.Option(
        False, "--all", help="Destroy every sandbox `sandbox create` made from this ale-iac home (ALE_IAC_HOME)."
    ),
    run: str = typer.Option(None, "--run", help="Destroy every stack this run (a run id) retained."),
) -> None:
    """Destroy a sandbox's stack and remove it. Pools and runs are left alone by --all."""
    from ale_iac.engine import Engine
    from ale_iac.provision import destroy_stack, made_here

    if sum((bool(stack), all_, bool(run))) != 1:
        raise typer.BadParameter("give one of STACK, --all or --run RUN_ID")
    engine = Engine()
    if run:
        from ale_iac.runner.gc import destroy_retained

        destroyed = destroy_retained(engine, run)
        for name in destroyed:
            typer.echo(f"destroyed {name}")
        if not destroyed:
            typer.echo(f"run {run} retained nothing that is left")
        return
    targets = [i.name for i in engine.list_stacks() if made_here(i.name, "sbx")] if all_ else [stack]
    for name in targets:
        if destroy_stack(engine, name):
            typer.echo(f"destroyed {name}")
        else:
            raise AleIacError(f"no stack named '{name}'")
    if all_ and not targets:
        typer.echo("no sandboxes to destroy")


def register(app: typer.Typer) -> None:
    app.add_typer(sandbox_app, name="sandbox")
