"""``ale-iac doctor``: the toolchain, the backend, and which substrates this host can run."""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.table import Table

from ale_iac import hostcheck
from ale_iac.errors import AleIacError
from ale_iac.substrates.local.runtime import host_checks as local_host_checks


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
    """(check, ok mark, detail) of every substrate, one row per fact; what `local` cannot run without is
    added to ``problems``."""
    from ale_iac.images import find_image, find_published

    rows = []
    for check in local_host_checks():  # the very list the local runtime enforces (limits: what it records)
        mark = "yes" if check.ok else "[red]no[/red]" if check.required else "[yellow]no[/yellow]"
        detail = check.detail if check.ok or check.required else f"{check.detail} (not applied; to change: {check.fix})"
        rows.append((f"local: {check.name}", mark, detail))
        if check.required and not check.ok:
            problems.append(f"local sandboxes need {check.name}: {check.detail} ({check.fix})")
    # The docker and qemu substrates' own rows below say more of their engine and tools than these would.
    rows += [(c.name, "yes" if c.ok else "no", c.detail) for c in hostcheck.other_substrate_checks()]
    rows += [(name, "yes" if ok else "no", detail) for name, ok, detail in (*_docker_rows(), *_qemu_rows())]
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


def _qemu_rows() -> list[tuple[str, bool, str]]:
    """The ``qemu`` profile's needs: QEMU, the accelerator it will use (KVM when usable, else TCG), the
    desktop image's qcow2 export."""
    from ale_iac.substrates.qemu import runtime as qemu_runtime

    rows = qemu_runtime.host_checks()
    try:
        from ale_iac.images import require_image
        from ale_iac.substrates.qemu.disk import find_export

        export = find_export(require_image("desktop").path)
        detail = str(export.disk) if export else "not exported yet (ale-iac images build desktop --export qcow2)"
        rows.append(("qemu: disk", export is not None, detail))
    except AleIacError as exc:
        rows.append(("qemu: disk", False, str(exc)))
    return rows


def _docker_rows() -> list[tuple[str, bool, str]]:
    """The ``docker`` profile's needs: an engine that answers, the host firewall its units rely on, and the
    desktop image exported into the engine (made on first use if missing). Not needed by `local`."""
    from ale_iac.substrates.docker import runtime as docker_runtime

    try:
        client = docker_runtime.client(timeout=10)
    except AleIacError as exc:
        return [("docker: engine", False, str(exc))]
    try:
        version = client.version()
        info = client.info()
        rows = [
            (
                "docker: engine",
                True,
                f"server {version.get('Version')}, {info.get('Driver')}, cgroup v{info.get('CgroupVersion')}, "
                f"{len(docker_runtime.list_sandboxes(client))} unit container(s) of this home",
            )
        ]
        ok, detail = docker_runtime.firewall_status()
        rows.append(("docker: unit firewall", ok, detail if ok else f"{detail} (added on the first unit create)"))
        try:
            from ale_iac.images import _docker_has, docker_image_tag, require_image

            tag = docker_image_tag(require_image("desktop"))
            present = _docker_has(client, tag)
            rows.append(("docker: image", present, tag if present else f"{tag} not exported yet (made on first use)"))
        except AleIacError as exc:
            rows.append(("docker: image", False, str(exc)))
        return rows
    finally:
        client.close()


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
