"""Image recipes and the image cache (``ale_iac.images``) and ``ale-iac images``.

The builder tests run the real builder (chroot phases in private mount namespaces, the lock, the
atomic rename, the manifest) on a tiny recipe whose debootstrap step is replaced by copying a
minimal rootfs (dash, env, mkdir and their libraries), so they need neither network nor minutes.
Building needs root (``needs_root``). The ``desktop`` image itself, which scripts/setup.sh builds, is
checked by the ``image``-marked test.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from ale_iac import image_build, images
from ale_iac.cli import images as images_cli
from ale_iac.errors import AleIacError
from ale_iac.image_build import build_image
from ale_iac.images import ImageBuildError, ImageInfo, find_image, list_images, require_image

TINY_SETUP = """#!/bin/sh
set -eu
case "$1" in
one)
    mkdir -p /opt/cua/lib/python3.13/site-packages/cua_computer_server-9.9.9.dist-info
    printf 'Name: cua-computer-server\\nVersion: 9.9.9\\n' \\
        >/opt/cua/lib/python3.13/site-packages/cua_computer_server-9.9.9.dist-info/METADATA
    test -e /proc/self/status  # /proc is mounted in the chroot
    test -c /dev/null          # and so is /dev
    echo "phase one ran with ALE_SUITE=$ALE_SUITE"
    ;;
two)
    mkdir -p /root/.ale
    ;;
fail)
    echo "this phase fails" >&2
    exit 3
    ;;
esac
"""


def tiny_rootfs(root: Path) -> None:
    """A rootfs that can run ``/usr/bin/env -i ... /bin/sh setup.sh`` in a chroot (merged /usr)."""
    for folder in ("usr/bin", "usr/lib", "usr/lib64", "proc", "dev", "tmp", "etc", "root"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    for link, points_to in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/bin")):
        (root / link).symlink_to(points_to)
    binaries = ["/usr/bin/sh", "/usr/bin/dash", "/usr/bin/env", "/usr/bin/mkdir"]
    needed = set(binaries)
    for binary in binaries:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
        needed.update(re.findall(r"(/\S+) \(0x", out))
    for path in needed:
        relative = re.sub(r"^/(bin|lib|lib64|sbin)/", r"usr/\1/", path).lstrip("/").replace("usr/sbin/", "usr/bin/")
        target = root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(path), target)


@pytest.fixture
def tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """A recipe ``tiny`` in a private recipes dir and cache; debootstrap replaced by ``tiny_rootfs``."""
    recipes = tmp_path / "recipes"
    recipe = recipes / "tiny"
    recipe.mkdir(parents=True)
    (recipe / "recipe.toml").write_text(
        '[debootstrap]\nsuite = "trixie"\n\n[image]\ninit = "/usr/local/sbin/ale-init"\n\n'
        '[build]\nphases = ["one", "two"]\n'
    )
    (recipe / "setup.sh").write_text(TINY_SETUP)
    (recipe / "setup.sh").chmod(0o755)
    cache = tmp_path / "cache"
    monkeypatch.setattr(images, "recipes_dir", lambda: recipes)
    monkeypatch.setenv("ALE_IAC_CACHE", str(cache))
    calls: list[str] = []
    lock = threading.Lock()

    def fake_debootstrap(self: image_build._Builder) -> None:
        with lock:
            calls.append(str(self.work))
        self.log("[debootstrap (tiny rootfs)] ...")
        tiny_rootfs(self.rootfs)
        self.steps["debootstrap"] = 0.0

    monkeypatch.setattr(image_build._Builder, "debootstrap", fake_debootstrap)
    return {"recipe": recipe, "cache": cache / "images", "debootstraps": calls}


def mounts_under(path: Path) -> list[str]:
    """Mount points under ``path`` in any process's mount namespace."""
    hits = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                text = Path(f"/proc/{entry}/mountinfo").read_text()
            except OSError:
                continue
            hits += [line for line in text.splitlines() if str(path) in line]
    return hits


# --- hashing and lookups -------------------------------------------------------------------------


def test_recipe_hash_tracks_content_and_mode_only(tiny: dict[str, object]) -> None:
    recipe = tiny["recipe"]
    assert isinstance(recipe, Path)
    first = images.recipe_hash("tiny")
    assert re.fullmatch(r"[0-9a-f]{64}", first)
    (recipe / "__pycache__").mkdir()
    (recipe / "__pycache__" / "x.pyc").write_bytes(b"junk")
    assert images.recipe_hash("tiny") == first
    (recipe / "setup.sh").chmod(0o644)
    assert images.recipe_hash("tiny") != first
    (recipe / "setup.sh").chmod(0o755)
    assert images.recipe_hash("tiny") == first
    (recipe / "setup.sh").write_text(TINY_SETUP + "# edited\n")
    assert images.recipe_hash("tiny") != first


def test_unknown_recipe_is_named(tiny: dict[str, object]) -> None:
    with pytest.raises(AleIacError, match=r"no image recipe 'nope' in .* \(recipes: tiny\)"):
        images.recipe_hash("nope")


def test_require_image_says_how_to_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALE_IAC_CACHE", str(tmp_path / "cache"))
    assert find_image("desktop") is None
    with pytest.raises(AleIacError) as info:
        require_image("desktop")
    assert str(info.value) == (
        "image 'desktop' is not built; run: ale-iac images build desktop (as root, then "
        "ale-iac images build desktop --export shared for the normal users of this host)"
    )


def test_cache_location_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ALE_IAC_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert images.cache_dir() == tmp_path / "xdg" / "ale-iac" / "images"
    monkeypatch.setenv("ALE_IAC_CACHE", str(tmp_path / "own"))
    assert images.cache_dir() == tmp_path / "own" / "images"


def test_recipes_are_found_next_to_the_package() -> None:
    assert (images.recipes_dir() / "desktop" / "recipe.toml").is_file()


@pytest.mark.needs_root
def test_missing_debootstrap_is_named(tiny: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "debootstrap" else "/usr/bin/" + tool)
    with pytest.raises(AleIacError, match=r"debootstrap is not installed; run: apt-get install -y debootstrap"):
        build_image("tiny")


# --- the builder ---------------------------------------------------------------------------------


@pytest.mark.needs_root
def test_build_caches_by_recipe_hash(tiny: dict[str, object]) -> None:
    cache = tiny["cache"]
    assert isinstance(cache, Path)
    lines: list[str] = []
    image = build_image("tiny", log=lines.append)
    assert image.path == cache / f"tiny-{images.recipe_hash('tiny')[:12]}"
    assert image.ref == image.path.name
    assert image.computer_server_version == "9.9.9"
    assert set(image.steps) == {"debootstrap", "one", "two"}
    assert image.size_bytes > 0
    assert image.recipe == {"init": "/usr/local/sbin/ale-init"}
    manifest = json.loads((image.path / "manifest.json").read_text())
    assert manifest["name"] == "tiny" and manifest["hash"] == image.hash
    assert "phase one ran with ALE_SUITE=trixie" in (image.path / "build.log").read_text()
    assert any(line.startswith("[one] done in") for line in lines)
    # Build-only files are gone from the rootfs; nothing else is left in the cache.
    assert not (image.rootfs / "tmp" / "ale-recipe").exists()
    assert not (image.rootfs / "tmp" / "ale-build-ca.pem").exists()
    assert not (image.rootfs / "etc/apt/apt.conf.d/99ale-build").exists()
    assert (image.rootfs / "root" / ".ale").is_dir()
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) == [image.path.name]
    assert not mounts_under(cache)

    assert find_image("tiny") == image
    assert [i.ref for i in list_images()] == [image.ref]
    again: list[str] = []
    assert build_image("tiny", log=again.append) == image
    assert again == [f"image {image.ref} is already built: {image.path}"]
    assert len(tiny["debootstraps"]) == 1  # type: ignore[arg-type]


@pytest.mark.needs_root
def test_failed_build_leaves_nothing_behind(tiny: dict[str, object]) -> None:
    recipe, cache = tiny["recipe"], tiny["cache"]
    assert isinstance(recipe, Path) and isinstance(cache, Path)
    (recipe / "recipe.toml").write_text('[build]\nphases = ["one", "fail", "two"]\n')
    with pytest.raises(ImageBuildError) as info:
        build_image("tiny", log=lambda _line: None)
    message = str(info.value)
    assert "step 'fail' failed with exit code 3" in message
    assert "this phase fails" in message
    ref = f"tiny-{images.recipe_hash('tiny')[:12]}"
    left = sorted(p.name for p in cache.iterdir())
    assert left == [f".{ref}.lock", f"{ref}.failed.log"], left
    assert find_image("tiny") is None
    assert not mounts_under(cache)


@pytest.mark.needs_root
def test_interrupted_build_leftovers_are_removed(tiny: dict[str, object]) -> None:
    cache = tiny["cache"]
    assert isinstance(cache, Path)
    ref = f"tiny-{images.recipe_hash('tiny')[:12]}"
    stale = cache / f".build-{ref}-99999999" / "rootfs" / "etc"
    stale.mkdir(parents=True)
    image = build_image("tiny", log=lambda _line: None)
    assert not stale.parent.parent.exists()
    assert image.rootfs.is_dir()


@pytest.mark.needs_root
def test_concurrent_builds_of_one_recipe_build_once(tiny: dict[str, object]) -> None:
    results: list[ImageInfo] = []
    errors: list[BaseException] = []

    def build() -> None:
        try:
            results.append(build_image("tiny", log=lambda _line: None))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert len(results) == 3 and len({r.path for r in results}) == 1
    assert len(tiny["debootstraps"]) == 1  # type: ignore[arg-type]


@pytest.mark.needs_root
def test_forced_rebuild_replaces_the_image(tiny: dict[str, object]) -> None:
    first = build_image("tiny", log=lambda _line: None)
    marker = first.rootfs / "old-build"
    marker.write_text("x")
    second = build_image("tiny", force=True, log=lambda _line: None)
    assert second.path == first.path
    assert not marker.exists()
    assert len(tiny["debootstraps"]) == 2  # type: ignore[arg-type]
    cache = tiny["cache"]
    assert isinstance(cache, Path)
    assert not [p for p in cache.iterdir() if p.name.startswith((".build-", ".old-"))]


# --- the CLI -------------------------------------------------------------------------------------


def cli() -> typer.Typer:
    app = typer.Typer()
    images_cli.register(app)

    @app.callback()
    def _root() -> None:
        """Test root."""

    return app


@pytest.mark.needs_root
def test_cli_build_and_ls(tiny: dict[str, object]) -> None:
    runner = CliRunner()
    built = runner.invoke(cli(), ["images", "build", "tiny"])
    assert built.exit_code == 0, built.output
    image = find_image("tiny")
    assert image is not None
    assert built.stdout.strip().splitlines()[-1] == str(image.path)
    assert "[two] done in" in built.stderr

    listed = runner.invoke(cli(), ["images", "ls", "--json"])
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)
    assert [(r["name"], r["hash"], r["path"], r["current"]) for r in rows] == [
        ("tiny", image.hash, str(image.path), True)
    ]
    assert {"built_at", "size_bytes", "computer_server_version"} <= set(rows[0])

    table = runner.invoke(cli(), ["images", "ls"])
    assert table.exit_code == 0
    header, row = table.stdout.strip().splitlines()
    assert header.split() == ["NAME", "HASH", "BUILT_AT", "SIZE", "CURRENT", "PATH"]
    assert row.split()[0:2] == ["tiny", image.hash] and row.endswith(str(image.path))


# --- the real desktop image ----------------------------------------------------------------------


@pytest.mark.image
def test_desktop_image_contents(desktop_image: ImageInfo) -> None:
    root = desktop_image.rootfs
    assert desktop_image.computer_server_version == "0.3.46"
    assert desktop_image == find_image("desktop")
    assert os.access(root / "usr/local/sbin/ale-init", os.X_OK)
    assert "XTerm*allowSendEvents: true" in (root / "etc/ale/Xresources").read_text()
    for folder in ("root/.ale", "data/tasks", "var/log/ale"):
        assert (root / folder).is_dir(), folder
    for tool in (
        "usr/bin/python3",
        "usr/bin/Xvfb",
        "usr/bin/openbox",
        "usr/bin/xterm",
        "usr/bin/xrandr",
        "usr/bin/xclip",
        "usr/bin/xdotool",
        "opt/cua/bin/python",
    ):
        assert (root / tool).exists(), tool
    assert "trixie" in (root / "etc/os-release").read_text()
    assert not list((root / "var/lib/apt/lists").glob("*_Packages*"))
    assert not list((root / "var/cache/apt/archives").glob("*.deb"))
    assert (root / "etc/resolv.conf").read_text() == ""
    assert not (root / "usr/bin/gcc").exists()  # build-only packages are purged
    assert not (root / "usr/bin/ld").exists()
    # uvloop would let run_command's children inherit the reply sockets (see setup.sh)
    assert not list(root.glob("opt/cua/lib/python3*/site-packages/uvloop"))
    assert not (root / "tmp/ale-recipe").exists()


@pytest.mark.image
def test_the_image_s_font_folders_keep_their_times_in_a_tar_export(desktop_image: ImageInfo) -> None:
    """A fontconfig cache holds its folder's mtime to the nanosecond; an image exported as a tar layer (docker,
    a cluster's OCI archive) keeps whole seconds. A folder with a fraction of a second would make its cache stale
    in every container, and each desktop client there rescan it."""
    fractional = [
        str(folder.relative_to(desktop_image.rootfs))
        for folder in [desktop_image.rootfs / "usr/share/fonts", *(desktop_image.rootfs / "usr/share/fonts").rglob("*")]
        if folder.is_dir() and folder.stat().st_mtime_ns % 1_000_000_000
    ]
    assert fractional == []
