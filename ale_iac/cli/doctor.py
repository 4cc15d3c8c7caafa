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
    for check in local_host_checks():  # the very list the local runtime enforces (limits: what it records)
        mark = "yes" if check.ok else "[red]no[/red]" if check.required else "[yellow]no[/yellow]"
        detail = check.detail if check.ok or check.required else f"{check.detail} (not applied; to change: {check.fix})"
        subs.add_row(f"local: {check.name}", mark, detail)
        if check.required and not check.ok:
            problems.append(f"local sandboxes need {check.name}: {check.detail} ({check.fix})")
    for check in hostcheck.other_substrate_checks():
        if check.name.startswith("qemu"):
            continue  # the qemu substrate's own rows below
        subs.add_row(check.name, "yes" if check.ok else "no", check.detail)
    from ale_iac.images import find_image, find_published

    for name, ok, detail in _docker_rows():
        subs.add_row(name, "yes" if ok else "no", detail)
    for name, ok, detail in _qemu_rows():
        subs.add_row(name, "yes" if ok else "no", detail)
    image = find_image("desktop")
    published = find_published("desktop") if image is None else None
    subs.add_row(
        "image desktop",
        "yes" if image or published else "no",
        str(image.path)
        if image
        else f"published at {published} (unpacked into your cache on first use)"
        if published
        else "not built (ale-iac images build desktop; as root, --export shared publishes it for normal users)",
    )
    console.print(subs)

    if problems:
        for problem in problems:
            console.print(f"[red]✗[/red] {problem}")
        console.print("the `local` profile cannot run here")
        raise typer.Exit(1)
    console.print("[green]✓[/green] the `local` profile can run here")


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
