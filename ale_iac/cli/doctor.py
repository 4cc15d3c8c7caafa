"""``ale-iac doctor``: the toolchain, the backend, and which substrates this host can run."""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.table import Table

from ale_iac import hostcheck
from ale_iac.errors import AleIacError
from ale_iac.substrates import registry


def doctor() -> None:
    """Print the Pulumi toolchain, the state backend and the substrates; exit 1 if `local` cannot run."""
    console = Console(width=None if sys.stdout.isatty() else 160)
    problems: list[str] = []

    table = Table(title="Pulumi toolchain", show_header=False)
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")
    try:
        from ale_iac.engine import Engine

        engine = Engine()
        tc = engine.toolchain
        table.add_row("pulumi", f"{tc.pulumi} ({tc.version})")
        table.add_row("language host", str(tc.language_host or "missing (plain `pulumi up` on Pulumi.yaml won't run)"))
        table.add_row("dynamic-provider launcher", str(tc.dynamic_launcher or "missing"))
        table.add_row("backend", engine.backend_url)
        table.add_row("state home", str(engine.home))
        if tc.dynamic_launcher is None:
            problems.append("pulumi-resource-pulumi-python is missing: local sandboxes cannot be declared")
    except AleIacError as exc:
        table.add_row("pulumi", f"[red]{exc}[/red]")
        problems.append(str(exc))
    console.print(table)

    subs = Table(title="Substrates")
    subs.add_column("check")
    subs.add_column("ok")
    subs.add_column("detail")
    for name, mark, detail in substrate_rows(problems):
        subs.add_row(name, mark, detail)
    console.print(subs)

    kube = Table(title="Kubernetes (the kubernetes provider kind: docs/kubernetes.md; optional)")
    kube.add_column("check")
    kube.add_column("ok")
    kube.add_column("detail", overflow="fold")
    from ale_iac.runner.kube_gc import cluster_rows

    for name, ok, detail in cluster_rows():
        kube.add_row(name, "yes" if ok else "[yellow]no[/yellow]", detail)
    console.print(kube)

    clis = Table(title="Agent CLIs (for the claude_code and codex agents; installed on first use)")
    clis.add_column("CLI")
    clis.add_column("installed")
    clis.add_column("detail", overflow="fold")
    for name, ok, detail in agent_cli_rows():
        clis.add_row(name, "yes" if ok else "no", detail)
    console.print(clis)

    if problems:
        for problem in problems:
            console.print(f"[red]✗[/red] {problem}")
        console.print("the `local` profile cannot run here")
        raise typer.Exit(1)
    console.print("[green]✓[/green] the `local` profile can run here")


def substrate_rows(problems: list[str]) -> list[tuple[str, str, str]]:
    """(check, ok mark, detail) of every substrate, one row per fact (``Substrate.host_checks``); what a
    substrate cannot run without is added to ``problems``."""
    from ale_iac.images import find_image, find_published

    rows = []
    for substrate in registry.all_substrates():
        for check in substrate.host_checks():
            mark = "yes" if check.ok else "[red]no[/red]" if check.required else "[yellow]no[/yellow]"
            rows.append((f"{substrate.name}: {check.name}", mark, check.detail))
            if check.required and not check.ok:
                problems.append(f"{substrate.name} sandboxes need {check.name}: {check.detail}")
    rows += [(c.name, "yes" if c.ok else "no", c.detail) for c in hostcheck.other_substrate_checks()]
    image = find_image("desktop")
    published = find_published("desktop") if image is None else None
    rows.append(
        (
            "image desktop",
            "yes" if image or published else "no",
            str(image.path)
            if image
            else f"published at {published} (unpacked into your cache on first use)"
            if published
            else "not built (ale-iac images build desktop; as root, --export shared publishes it for normal users)",
        )
    )
    return rows


def agent_cli_rows() -> list[tuple[str, bool, str]]:
    """(CLI, installed, detail) of each agent CLI ale-iac installs: its pinned version, and where it is, or how
    it will be installed (from npm, the first time an agent needs it)."""
    import shutil

    from ale_iac.agent_sdk.clis import CLIS, find_cli, pinned_version

    npm = shutil.which("npm")
    rows = []
    for name, spec in CLIS.items():
        try:
            version = pinned_version(name)
            install = find_cli(name, version)
        except AleIacError as exc:
            rows.append((name, False, str(exc)))
            continue
        pinned = f"{spec.package}@{version}"
        if install is not None:
            rows.append((name, True, f"{pinned}: {install.root / install.entry}"))
        elif npm:
            rows.append((name, False, f"{pinned}: installed with {npm} the first time an agent needs it"))
        else:
            rows.append((name, False, f"{pinned}: npm is not on PATH to install it (apt-get install npm)"))
    return rows


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
