"""``ale-iac model-server``: the scripted model API on 127.0.0.1, to dry-run a deployer without a vendor."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from ale_iac.llm.scripted import ScriptedModelServer, ServedRequest


def _describe(record: ServedRequest) -> str:
    where = f"script {record.script} turn {record.turn}" if record.script is not None else "no script"
    if record.served == "tool":
        what = f"tool {record.tool} {record.arguments}"
    elif record.served == "plan_error":
        what = f"PLAN ERROR: {record.error}"
    elif record.api is None or record.served in {"head", "refused", "not_found", "bad_request", "method_not_allowed"}:
        return f"{record.method} {record.path} -> {record.status} {record.served}"
    else:
        what = record.served
    tokens = f"{record.input_tokens}/{record.output_tokens} tokens"
    return f"{record.method} {record.path} ({record.api}, {record.model}) {where}: {what} [{tokens}]"


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def model_server(
    plan: Path = typer.Option(..., "--plan", help="The plan: YAML with the scripts to follow (docs/models.md)."),
    port: int = typer.Option(0, "--port", help="Port on 127.0.0.1 (default: any free one)."),
    api_key: str | None = typer.Option(
        None,
        "--api-key-env",
        help="Name of an environment variable holding the key clients must send (default: accept any).",
    ),
    until_stdin_closes: bool = typer.Option(
        False,
        "--until-stdin-closes",
        help="Serve until standard input closes, ignoring SIGINT and SIGTERM; totals on stderr "
        "(how `evaluate --model-plan` runs it).",
    ),
) -> None:
    """Serve a scripted model API (Anthropic Messages and OpenAI Responses) on 127.0.0.1 until interrupted.

    Point an agent CLI at it (Claude Code: ANTHROPIC_BASE_URL=URL; Codex: base_url = URL/v1,
    wire_api = "responses"), or run a whole experiment against it: `ale-iac evaluate EXP --model-plan PLAN`.
    Prints one line per request; exits 1 if the plan could not be followed.
    """
    from ale_iac.llm.plan import load_plan
    from ale_iac.llm.scripted import ScriptedModelServer

    scripted = load_plan(plan)
    server = ScriptedModelServer(
        scripted, port=port, api_key=_api_key(api_key), on_request=lambda r: typer.echo(_describe(r), err=True)
    )
    if until_stdin_closes:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)  # a run's ^C is for the run; it closes our stdin
    else:
        signal.signal(signal.SIGTERM, _interrupt)
    with server:
        typer.echo(f"scripted model server on {server.base_url} ({plan}: {len(scripted.scripts)} script(s))")
        typer.echo(f"  Anthropic Messages (Claude Code): ANTHROPIC_BASE_URL={server.base_url}")
        typer.echo(f"  OpenAI Responses (Codex): base_url = {server.base_url}/v1, wire_api = responses")
        sys.stdout.flush()
        if until_stdin_closes:
            sys.stdin.buffer.read()  # returns at end of file: the run closed the pipe, or died
        else:
            typer.echo("Ctrl-C to stop", err=True)
            with contextlib.suppress(KeyboardInterrupt):
                threading.Event().wait()
    _print_totals(server, err=until_stdin_closes)  # with the request lines, in the run's log
    if server.plan_errors:
        raise typer.Exit(code=1)


def _api_key(variable: str | None) -> str | None:
    """The key clients must send, read from the environment variable ``--api-key-env`` names (None: any)."""
    import os

    from ale_iac.errors import AleIacError

    if variable is None:
        return None
    key = os.environ.get(variable)
    if not key:
        raise AleIacError(f"--api-key-env {variable}: that environment variable is not set")
    return key


def _print_totals(server: ScriptedModelServer, err: bool) -> None:
    served = server.usage_served()
    typer.echo(
        f"served {served['requests']} request(s), {served['input_tokens']} input and "
        f"{served['output_tokens']} output tokens; {len(server.plan_errors)} plan error(s)",
        err=err,
    )


def register(app: typer.Typer) -> None:
    app.command("model-server")(model_server)
