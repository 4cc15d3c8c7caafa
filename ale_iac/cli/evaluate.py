"""``ale-iac evaluate`` and ``ale-iac gc``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from ale_iac.profile import CleanupMode

if TYPE_CHECKING:
    from ale_iac.runner.gc import GcReport


def evaluate(
    experiment: Path = typer.Argument(..., help="Experiment YAML file."),
    profile: str = typer.Option(None, "--profile", help="Override the environment profile."),
    pool: str = typer.Option(None, "--pool", help="Lease units from this pool stack instead of creating stacks."),
    cleanup: CleanupMode = typer.Option(None, "--cleanup", help="destroy | retain | retain-on-failure."),
    retain_below: float = typer.Option(
        None, "--retain-below", help="Also retain the sandbox of any unit that scored below this (0..1)."
    ),
    jobs: int = typer.Option(None, "-j", "--jobs", help="Units run at once."),
    shared_stack: bool = typer.Option(
        None,
        "--shared-stack/--stack-per-unit",
        help="One stack for the run (a sandbox per -j slot, made fresh between units, destroyed at the end) instead "
        "of one per unit: three CLI calls for the whole run, not three per unit, where the substrate resets units; "
        "a shared targeted update per change where the engine does (clouds, kubernetes; docs/experiments.md).",
    ),
    out: Path = typer.Option(None, "--out", help="Output root for run records."),
    resume: bool = typer.Option(False, "--resume", help="Continue the latest run of this experiment."),
    model_plan: Path = typer.Option(
        None,
        "--model-plan",
        help="Dry run: a scripted model server follows this plan in place of every agent's model; no API key "
        "needed (docs/models.md).",
    ),
) -> None:
    """Run agents on tasks in ephemeral sandboxes, grade them, record everything, clean up.

    Exit code: 0 if every unit run succeeded (its agent completed and it was graded, whatever the
    score), 1 if any did not, 2 if it stopped with an error instead (a bad flag; an experiment, preset,
    task or profile that is not valid: every problem printed, each with its file and field), 130 if
    interrupted.
    """
    from ale_iac.runner.evaluation import exit_code, print_summary, run_experiment
    from ale_iac.runner.experiment import load_experiment

    overrides = {
        "profile": profile,
        "pool": pool,
        "cleanup": cleanup.value if cleanup else None,
        "retain_below": retain_below,
        "concurrency": jobs,
        "shared_stack": shared_stack,
        "output_root": str(out.resolve()) if out else None,
        "model_plan": str(model_plan.resolve()) if model_plan else None,
    }
    loaded = load_experiment(experiment, overrides)
    # Logs and CI get full-width tables instead of rich's 80-column default for non-terminals.
    console = Console() if sys.stdout.isatty() else Console(width=200)
    summary = run_experiment(loaded, resume=resume, console=console)
    print_summary(summary, console)
    raise typer.Exit(exit_code(summary))


def gc(
    dry_run: bool = typer.Option(False, "--dry-run", help="Only list what would be destroyed."),
    sandboxes: bool = typer.Option(False, "--sandboxes", help="Also destroy stacks made by `sandbox create`."),
    expired: bool = typer.Option(False, "--expired", help="Also destroy stacks whose units' expiry has passed."),
    stack: str = typer.Option(None, "--stack", help="Recover just this stack (stale lock, then destroy)."),
) -> None:
    """Destroy stacks and local sandboxes left behind by crashed runs."""
    from ale_iac.engine import Engine
    from ale_iac.runner.gc import collect

    report = collect(Engine(), dry_run=dry_run, sandboxes=sandboxes, expired=expired, only_stack=stack)
    for damage in report.state_repairs:
        typer.echo(f"{'would repair' if dry_run else 'repaired'} damaged state file {damage.describe()}")
    verb = "would destroy" if dry_run else "destroyed"
    for name in report.destroyed:
        typer.echo(f"{verb} stack {name}")
    for sandbox in report.sandboxes_stopped:
        typer.echo(f"{'would stop' if dry_run else 'stopped'} orphaned sandbox {sandbox}")
    for container in report.containers_removed:
        typer.echo(f"{'would remove' if dry_run else 'removed'} leftover agent container {container}")
    for pid in report.providers_killed:
        typer.echo(f"killed orphaned dynamic-provider process {pid}")
    for pid in report.port_forwards_killed:
        typer.echo(f"{'would kill' if dry_run else 'killed'} the orphaned port-forward of a killed run {pid}")
    _echo_folders(report, dry_run)
    for folder in report.warm_bridges_removed:
        typer.echo(f"{'would remove' if dry_run else 'removed'} the folder of a killed run's warm bridges {folder}")
    for name in report.expired:
        typer.echo(
            f"expired: stack {name} (its units' expiry has passed{'' if expired else '; --expired destroys it'})"
        )
    for name, why in sorted(report.kept.items()):
        typer.echo(f"kept {name}: {why}")
    for problem in report.errors:
        typer.secho(f"error: {problem}", fg=typer.colors.RED, err=True)
    if not _collected_anything(report):
        typer.echo("nothing to collect")
    raise typer.Exit(1 if report.errors else 0)


def _echo_folders(report: GcReport, dry_run: bool) -> None:
    for folder in report.private_dirs_removed:
        typer.echo(f"{'would remove' if dry_run else 'removed'} a killed process's private folder {folder}")
    for folder in report.egress_proxies_stopped:
        typer.echo(f"{'would stop' if dry_run else 'stopped'} the egress proxy of a killed run {folder}")


def _collected_anything(report: GcReport) -> bool:
    return bool(
        report.state_repairs
        or report.destroyed
        or report.sandboxes_stopped
        or report.expired
        or report.containers_removed
        or report.warm_bridges_removed
        or report.private_dirs_removed
        or report.egress_proxies_stopped
    )


def register(app: typer.Typer) -> None:
    app.command("evaluate")(evaluate)
    app.command("gc")(gc)
