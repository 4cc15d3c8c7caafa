"""Image recipes (``images/<name>/``) built into a content-addressed cache.

A recipe is a folder with ``recipe.toml`` (debootstrap suite, mirrors, build phases) and a
``setup.sh`` that runs inside the image's chroot once per phase. The cache key is a hash of every
file in the folder, so editing the recipe makes a new image and an unchanged recipe is reused::

    ${ALE_IAC_CACHE:-${XDG_CACHE_HOME:-~/.cache}/ale-iac}/images/<name>-<hash12>/
        rootfs/         the root filesystem (read-only base of every sandbox)
        manifest.json   name, hash, built_at, build_seconds, size, computer-server version, step times
        build.log       everything the build printed

Building a recipe is ``ale_iac.image_build``; this module is the cache: where images are, what a built one
is (:class:`ImageInfo`), their copies for the host's other users and their exports.

For the ``docker`` executor, :func:`ensure_docker_image` imports a built rootfs into the local Docker
engine as ``ale-iac/<name>:<hash12>`` (streamed as a tar, labelled, once per recipe hash); no registry
is ever asked for anything.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ale_iac import docker_engine
from ale_iac.errors import AleIacError
from ale_iac.paths import cache_root, project_root, shared_image_dirs

LogFn = Callable[[str], None]

RECIPE_FILE = "recipe.toml"
MANIFEST = "manifest.json"
ROOTFS = "rootfs"
IGNORED_NAMES = {"__pycache__", ".DS_Store"}
"""Never part of a recipe (nor of its hash)."""

if TYPE_CHECKING:
    from docker import DockerClient


DOCKER_REPOSITORY_PREFIX = "ale-iac/"
"""Images ale-iac imports into the Docker engine are ``ale-iac/<name>:<hash12>``."""
DOCKER_LABEL_PREFIX = "ale-iac."
_DOCKER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_IMPORT_CHUNK = 1 << 20


def stderr_log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class ImageBuildError(AleIacError):
    """A build step failed; the message names the step and ends with the tail of its log."""


@dataclass(frozen=True)
class ImageInfo:
    """A built image in the cache."""

    name: str
    hash: str
    """First 12 hex digits of the recipe hash (the cache key)."""
    path: Path
    """The image folder: ``rootfs/``, ``manifest.json``, ``build.log``."""
    built_at: str
    build_seconds: float
    size_bytes: int
    computer_server_version: str | None
    steps: dict[str, float] = field(default_factory=dict)
    recipe: dict[str, Any] = field(default_factory=dict)
    """The recipe's ``[image]`` table (init path, server port, ...) as it was at build time."""

    @property
    def rootfs(self) -> Path:
        return self.path / ROOTFS

    @property
    def ref(self) -> str:
        """``<name>-<hash12>``: what stack outputs and run records call the image."""
        return f"{self.name}-{self.hash}"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "hash": self.hash,
            "ref": self.ref,
            "path": str(self.path),
            "rootfs": str(self.rootfs),
            "built_at": self.built_at,
            "build_seconds": self.build_seconds,
            "size_bytes": self.size_bytes,
            "computer_server_version": self.computer_server_version,
            "steps": self.steps,
            "recipe": self.recipe,
        }

    @classmethod
    def load(cls, path: Path) -> ImageInfo:
        data = json.loads((path / MANIFEST).read_text())
        return cls(
            name=str(data["name"]),
            hash=str(data["hash"]),
            path=path,
            built_at=str(data["built_at"]),
            build_seconds=float(data["build_seconds"]),
            size_bytes=int(data["size_bytes"]),
            computer_server_version=data.get("computer_server_version"),
            steps={str(k): float(v) for k, v in dict(data.get("steps", {})).items()},
            recipe=dict(data.get("recipe", {})),
        )


# --- locations and hashing ---------------------------------------------------------------------


def recipes_dir() -> Path:
    """The repository's ``images/`` folder (next to the ``ale_iac`` package)."""
    return project_root() / "images"


def cache_dir() -> Path:
    """``${ALE_IAC_CACHE:-${XDG_CACHE_HOME:-~/.cache}/ale-iac}/images``."""
    return cache_root() / "images"


def recipe_dir(name: str) -> Path:
    if not name or "/" in name or name.startswith("."):
        raise AleIacError(f"invalid image name {name!r}")
    path = recipes_dir() / name
    if not (path / RECIPE_FILE).is_file():
        known = sorted(p.name for p in recipes_dir().glob("*") if (p / RECIPE_FILE).is_file())
        raise AleIacError(f"no image recipe '{name}' in {recipes_dir()} (recipes: {', '.join(known) or 'none'})")
    return path


def _recipe_files(folder: Path) -> Iterator[Path]:
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if any(part in IGNORED_NAMES or part.endswith((".pyc", "~", ".swp")) for part in rel.parts):
            continue
        if path.is_file():
            yield path


def recipe_hash(name: str) -> str:
    """SHA-256 over every recipe file's relative path, executable bit and content."""
    folder = recipe_dir(name)
    digest = hashlib.sha256()
    for path in _recipe_files(folder):
        rel = path.relative_to(folder).as_posix()
        mode = "x" if os.access(path, os.X_OK) else "-"
        digest.update(f"{rel}\0{mode}\0".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def load_recipe(name: str) -> dict[str, Any]:
    path = recipe_dir(name) / RECIPE_FILE
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise AleIacError(f"{path}: not valid TOML: {exc}") from None


# --- queries -----------------------------------------------------------------------------------


def find_image(name: str) -> ImageInfo | None:
    """The built image of the *current* recipe of ``name``, or None."""
    path = cache_dir() / f"{name}-{recipe_hash(name)[:12]}"
    if not (path / MANIFEST).is_file() or not (path / ROOTFS).is_dir():
        return None
    return ImageInfo.load(path)


def list_images() -> list[ImageInfo]:
    """Every built image in the cache, including those of older recipe versions."""
    root = cache_dir()
    if not root.is_dir():
        return []
    images: list[ImageInfo] = []
    for path in sorted(root.iterdir()):
        if path.name.startswith(".") or not (path / MANIFEST).is_file():
            continue
        try:
            images.append(ImageInfo.load(path))
        except (ValueError, KeyError, OSError):
            continue
    return images


def require_image(name: str) -> ImageInfo:
    """The built image of the current recipe, or an error saying how to build it.

    A normal user with no build of its own gets a copy of the one root published (``find_published``),
    unpacked into its cache on first use.
    """
    image = find_image(name)
    if image is None and os.geteuid() != 0 and (published := find_published(name)) is not None:
        image = unpack_published(published)
    if image is None:
        raise AleIacError(
            f"image '{name}' is not built; run: ale-iac images build {name} (as root, then "
            f"ale-iac images build {name} --export shared for the normal users of this host)"
        )
    return image


# --- images root published for normal users -----------------------------------------------------

PUBLISHED_ROOTFS = "rootfs.tar"
"""A published image: ``<shared dir>/<name>-<hash12>/`` with ``manifest.json`` and the rootfs as a tar
(0644, numeric owners, no device nodes), so that a user can read files the image keeps root's alone."""


def find_published(name: str) -> Path | None:
    """The published image of the current recipe of ``name`` in ``paths.shared_image_dirs()``, or None."""
    ref = f"{name}-{recipe_hash(name)[:12]}"
    for folder in shared_image_dirs():
        candidate = folder / ref
        if (candidate / MANIFEST).is_file() and (candidate / PUBLISHED_ROOTFS).is_file():
            return candidate
    return None


def publish_image(name: str, log: LogFn = stderr_log) -> Path:
    """Publish root's build of ``name`` for the host's normal users (the ``shared`` export): once per recipe."""
    image = require_image(name)
    root = shared_image_dirs()[0]
    final = root / image.ref
    if (final / PUBLISHED_ROOTFS).is_file():
        return final
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    with locked(root / f".{image.ref}.lock", log):
        if (final / PUBLISHED_ROOTFS).is_file():
            return final
        work = root / f".publish-{image.ref}-{os.getpid()}"
        work.mkdir(mode=0o755)
        try:
            started = time.monotonic()
            archive = work / PUBLISHED_ROOTFS
            tar = ["tar", "--numeric-owner", "--exclude=./dev/*", "-C", str(image.rootfs), "-cf", str(archive), "."]
            subprocess.run(tar, check=True, capture_output=True)
            shutil.copyfile(image.path / MANIFEST, work / MANIFEST)
            for path in (archive, work / MANIFEST):
                os.chmod(path, 0o644)
            work.rename(final)
        except BaseException:
            remove_tree(work)
            raise
    log(f"image {image.ref} published in {time.monotonic() - started:.1f} s: {final}")
    return final


def unpack_published(published: Path, log: LogFn = stderr_log) -> ImageInfo:
    """A copy of a published image in the caller's cache, owned by the caller (what a rootless sandbox
    runs: its owner is root inside). Setuid and setgid bits are dropped (they would be the caller's on the
    host, and mean nothing inside, where every mount is nosuid); the image folder is 0700."""
    root = cache_dir()
    final = root / published.name
    root.mkdir(parents=True, exist_ok=True)
    with locked(root / f".{published.name}.lock", log):
        if (final / MANIFEST).is_file() and (final / ROOTFS).is_dir():
            return ImageInfo.load(final)
        started = time.monotonic()
        work = root / f".unpack-{published.name}-{os.getpid()}"
        (work / ROOTFS).mkdir(mode=0o700, parents=True)
        try:
            tar = ["tar", "-xpf", str(published / PUBLISHED_ROOTFS), "-C", str(work / ROOTFS), "--no-same-owner"]
            subprocess.run(tar, check=True, capture_output=True)
            for folder, _dirs, files in os.walk(work / ROOTFS):
                for entry in (folder, *(os.path.join(folder, f) for f in files)):
                    mode = os.lstat(entry).st_mode
                    if stat.S_ISLNK(mode):
                        continue
                    wanted = (mode & ~(stat.S_ISUID | stat.S_ISGID)) | (stat.S_IWUSR if stat.S_ISDIR(mode) else 0)
                    if wanted != mode:
                        os.chmod(entry, stat.S_IMODE(wanted))
            shutil.copyfile(published / MANIFEST, work / MANIFEST)
            os.chmod(work, 0o700)
            work.rename(final)
        except BaseException:
            remove_tree(work)
            raise
    log(f"image {published.name} unpacked from {published} in {time.monotonic() - started:.1f} s: {final}")
    return ImageInfo.load(final)


# --- locks and removal (a build folder may hold mounts) ------------------------------------------


def _mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path`` in this process's mount namespace (deepest first)."""
    prefix = str(path.resolve())
    found: list[str] = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            point = line.split()[4].replace("\\040", " ")
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return sorted(found, key=len, reverse=True)


def unmount_under(path: Path) -> None:
    for point in _mounts_under(path):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def remove_tree(path: Path) -> None:
    """Delete a build tree, never following a mount into the host's files."""
    if not path.exists():
        return
    unmount_under(path)
    left = _mounts_under(path)
    if left:
        raise AleIacError(f"refusing to delete {path}: still mounted: {', '.join(left)}")
    shutil.rmtree(path)


@contextmanager
def locked(lock_path: Path, log: LogFn) -> Iterator[int]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another build of the same image (lock {lock_path})")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)


# --- the image in the Docker engine ------------------------------------------------------------


def docker_image_tag(image: ImageInfo) -> str:
    """``ale-iac/<name>:<hash12>``: the image's content id is its recipe hash, as in the cache."""
    return f"{DOCKER_REPOSITORY_PREFIX}{image.name}:{image.hash}"


def docker_has(client: DockerClient, tag: str) -> bool:
    from docker.errors import ImageNotFound

    try:
        client.images.get(tag)
    except ImageNotFound:
        return False
    return True


def _tar_chunks(stream: IO[bytes]) -> Iterator[bytes]:
    while chunk := stream.read(_IMPORT_CHUNK):
        yield chunk


def _docker_import(image: ImageInfo, tag: str) -> None:
    """``tar -C rootfs -c . | docker import`` through the Engine API: the tar is streamed, never stored."""
    from docker.errors import DockerException

    repository, version = tag.rsplit(":", 1)
    labels = {
        "image": image.name,
        "image-hash": image.hash,
        "image-built-at": image.built_at,
    }
    init = str(image.recipe.get("init", "/usr/local/sbin/ale-init"))
    port = int(image.recipe.get("server_port", 8000))
    changes = [
        "LABEL " + " ".join(f"{DOCKER_LABEL_PREFIX}{key}={value}" for key, value in labels.items()),
        f"ENV PATH={_DOCKER_PATH}",
        "ENV LANG=C.UTF-8",
        f"CMD {json.dumps([init, '--port', str(port)])}",
    ]
    tar = subprocess.Popen(
        ["tar", "-C", str(image.rootfs), "--numeric-owner", "-cf", "-", "."],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert tar.stdout is not None and tar.stderr is not None
    client = docker_engine.client(timeout=1800.0)  # the engine answers once the whole layer is written
    try:
        try:
            answer = client.api.import_image(
                src=_tar_chunks(tar.stdout), repository=repository, tag=version, changes=changes, stream_src=True
            )
        except DockerException as exc:
            raise AleIacError(f"docker import of {image.ref} failed: {exc}") from None
        finally:
            if tar.poll() is None:
                tar.kill()
            code = tar.wait()
            errors = tar.stderr.read().decode(errors="replace").strip()
            tar.stdout.close()
            tar.stderr.close()
        if code != 0 or '"error' in str(answer):
            # A tar that failed half-way may still have made a (truncated) image: never keep it.
            with contextlib.suppress(DockerException):
                client.images.remove(tag, force=True)
            raise AleIacError(
                f"docker import of {image.ref} failed: tar exited {code} ({errors or 'no message'}); engine: {answer}"
            )
    finally:
        client.close()


def ensure_docker_image(name: str = "desktop", log: LogFn = stderr_log) -> str:
    """The built image ``name`` in the Docker engine as ``ale-iac/<name>:<hash12>`` (labelled
    ``ale-iac.image``, ``ale-iac.image-hash``): imported from the cached rootfs if the engine does not
    have it yet (once, under the image's lock), else reused. Returns the tag. Nothing is pulled."""
    image = require_image(name)
    tag = docker_image_tag(image)
    client = docker_engine.client()
    try:
        if docker_has(client, tag):
            return tag
        with locked(cache_dir() / f".docker-{image.ref}.lock", log):
            if docker_has(client, tag):
                log(f"image {tag} was imported meanwhile")
                return tag
            log(f"importing image {image.ref} into the Docker engine as {tag}")
            started = time.monotonic()
            _docker_import(image, tag)
            log(f"image {tag} imported in {time.monotonic() - started:.1f} s")
    finally:
        client.close()
    return tag


# --- the image as an OCI archive (Kubernetes nodes, registries) -----------------------------------

OCI_ARCHIVE = "oci.tar"
OCI_LOCAL_PREFIX = "ale-iac.local"
"""The name of an image imported into a node's containerd, never pulled: ``ale-iac.local/<name>:<hash12>``."""


def oci_image_name(name: str, hash12: str, registry: str | None = None) -> str:
    """What a pod's ``image`` is: ``<registry>/ale-iac/<name>:<hash12>`` once pushed to ``registry``, else the
    local import's ``ale-iac.local/<name>:<hash12>``. The recipe hash names the image, as in the cache."""
    if registry:
        return f"{registry.rstrip('/')}/ale-iac/{name}:{hash12}"
    return f"{OCI_LOCAL_PREFIX}/{name}:{hash12}"


def ensure_oci_archive(name: str = "desktop", log: LogFn = stderr_log) -> Path:
    """The built image ``name`` as an OCI archive (``<image folder>/oci.tar``, one uncompressed layer, named
    :func:`oci_image_name`), written once per recipe hash under the image's lock; returns its path. Import it into
    a node's containerd with ``ctr -n k8s.io images import`` or push it (docs/kubernetes.md)."""
    from ale_iac.oci_archive import ImageConfig, write_archive

    image = require_image(name)
    target = image.path / OCI_ARCHIVE
    if target.is_file():
        return target
    with locked(cache_dir() / f".oci-{image.ref}.lock", log):
        if target.is_file():
            return target
        log(f"packing image {image.ref} as an OCI archive ({target})")
        started = time.monotonic()
        init = str(image.recipe.get("init", "/usr/local/sbin/ale-init"))
        port = int(image.recipe.get("server_port", 8000))
        config = ImageConfig(
            cmd=[init, "--port", str(port)],
            labels={f"{DOCKER_LABEL_PREFIX}image": image.name, f"{DOCKER_LABEL_PREFIX}image-hash": image.hash},
        )
        write_archive(image.rootfs, target, oci_image_name(image.name, image.hash), config)
        log(
            f"OCI archive of {image.ref} written in {time.monotonic() - started:.1f} s "
            f"({target.stat().st_size >> 20} MiB)"
        )
    return target


EXPORT_TARGETS = ("docker", "shared", "oci")
"""Exports of a built rootfs this module makes: into the Docker engine, for the host's other users, and as an
OCI archive (Kubernetes). The
substrates add their own (``ale_iac.substrates.registry.export_targets``: one recipe, one cache, several
exports)."""


def export_image(name: str, target: str, log: LogFn = stderr_log) -> str:
    """Export the built image ``name`` to ``target`` (one of :data:`EXPORT_TARGETS`); returns what it is called
    there (for ``docker``, the engine tag ``ale-iac/<name>:<hash12>``; for ``shared``, the folder)."""
    if target not in EXPORT_TARGETS:
        raise AleIacError(f"unknown image export target {target!r} (known: {', '.join(EXPORT_TARGETS)})")
    if target == "shared":
        return str(publish_image(name, log=log))
    if target == "oci":
        return str(ensure_oci_archive(name, log=log))
    return ensure_docker_image(name, log=log)
