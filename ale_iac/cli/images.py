"""``ale-iac images``: build and list the image recipes of ``images/``."""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer

images_app = typer.Typer(
    name="images",
    help="Build and list sandbox images (recipes in images/, built into the ale-iac cache).",
    no_args_is_help=True,
)


def _size(num: int) -> str:
    return f"{num / 2**20:.0f} MiB"


@images_app.command("build")
def build(
    name: Annotated[str, typer.Argument(help="Recipe name, a folder under images/ (e.g. desktop).")],
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if this recipe is already built.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Print everything the build prints.")] = False,
    export: Annotated[
        list[str] | None,
        typer.Option(
            "--export",
            help="Also export the built rootfs: 'docker' imports it into the local engine as "
            "ale-iac/<name>:<hash12> (once per recipe hash; nothing is pulled). Prints the tag. 'qcow2' makes "
            "a bootable QEMU guest disk with Debian's kernel and initramfs (once per recipe hash). 'gce', 'ec2', "
            "'ecs' make the cloud disk (GRUB, DHCP, the token from instance metadata: docs/clouds.md) as a GCE "
            "disk.raw .tar.gz, an EC2 stream-optimized VMDK, an ECS qcow2. 'oci' packs it as an OCI archive for "
            "Kubernetes nodes or a registry (docs/kubernetes.md). Prints its path.",
        ),
    ] = None,
) -> None:
    """Build an image (debootstrap + its setup phases), or reuse the cached build of the same recipe."""
    from ale_iac.image_build import build_image
    from ale_iac.substrates import registry

    started = time.monotonic()

    def log(line: str) -> None:
        typer.echo(f"{time.monotonic() - started:7.1f}s  {line}", err=True)

    targets = registry.export_targets()
    unknown = sorted(set(export or []) - set(targets))
    if unknown:
        raise typer.BadParameter(f"unknown export target(s) {unknown} (known: {', '.join(targets)})")
    image = build_image(name, force=force, log=log, verbose=verbose, users_of=registry.units_on_image)
    typer.echo(str(image.path))
    for target in export or []:
        typer.echo(registry.export_image(name, target, log=log))


@images_app.command("ls")
def ls(
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list.")] = False,
) -> None:
    """List built images: name, hash, built_at, size, path (and whether it matches the recipe)."""
    from ale_iac.images import list_images, recipe_hash

    images = list_images()
    current: dict[str, str | None] = {}
    for image in images:
        if image.name not in current:
            try:
                current[image.name] = recipe_hash(image.name)[:12]
            except Exception:  # the recipe was removed or renamed
                current[image.name] = None
    if as_json:
        rows = [{**image.to_json(), "current": current[image.name] == image.hash} for image in images]
        typer.echo(json.dumps(rows, indent=2))
        return
    if not images:
        typer.echo("no images built; run: ale-iac images build desktop")
        return
    header = ("NAME", "HASH", "BUILT_AT", "SIZE", "CURRENT", "PATH")
    rows_text = [
        (
            image.name,
            image.hash,
            image.built_at,
            _size(image.size_bytes),
            "yes" if current[image.name] == image.hash else "no",
            str(image.path),
        )
        for image in images
    ]
    widths = [max(len(row[i]) for row in [header, *rows_text]) for i in range(len(header))]
    for row in [header, *rows_text]:
        typer.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def register(app: typer.Typer) -> None:
    app.add_typer(images_app, name="images")
