"""Image recipes (``images/<name>/``) built into a content-addressed cache.

A recipe is a folder with ``recipe.toml`` (debootstrap suite, mirrors, build phases) and a
``setup.sh`` that runs inside the image's chroot once per phase. The cache key is a hash of every
file in the folder, so editing the recipe makes a new image and an unchanged recipe is reused::

    ${ALE_IAC_CACHE:-${XDG_CACHE_HOME:-~/.cache}/ale-iac}/images/<name>-<hash12>/
        rootfs/         the root filesystem (read-only base of every sandbox)
        manifest.json   name, hash, built_at, build_seconds, size, computer-server version, step times
        build.log       everything the build printed

Builds are safe to interrupt and to run twice at once: a build happens in a temporary folder next
to the final one and is renamed into place atomically, under a per-image lock. Every mount the
build needs (``/proc``, ``/dev`` in the chroot) is made inside a private mount namespace
(``unshare --mount --propagation private``), so none can outlive the step that made it; a
``finally`` still checks for (and lazily unmounts) anything left under the build folder before
deleting it, because deleting a tree with a bind mount of ``/dev`` in it would delete the host's.

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
from ale_iac.clock import utc_now
from ale_iac.errors import AleIacError
from ale_iac.paths import cache_root, project_root, shared_image_dirs

LogFn = Callable[[str], None]

RECIPE_FILE = "recipe.toml"
SETUP_SCRIPT = "setup.sh"
MANIFEST = "manifest.json"
ROOTFS = "rootfs"
BUILD_LOG = "build.log"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
CHROOT_RECIPE = "tmp/ale-recipe"
CHROOT_CA_BUNDLE = "tmp/ale-build-ca.pem"
CHROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Host settings passed into the chroot so that apt and pip there reach what the host reaches.
PASSTHROUGH_ENV = (
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_TRUSTED_HOST",
    "PIP_DEFAULT_TIMEOUT",
)
PASSTHROUGH_APT = (
    "Acquire::Check-Valid-Until",
    "Acquire::Check-Date",
    "Acquire::http::Proxy",
    "Acquire::https::Proxy",
)
_IGNORED_NAMES = {"__pycache__", ".DS_Store"}

if TYPE_CHECKING:
    from docker import DockerClient


DOCKER_REPOSITORY_PREFIX = "ale-iac/"
"""Images ale-iac imports into the Docker engine are ``ale-iac/<name>:<hash12>``."""
DOCKER_LABEL_PREFIX = "ale-iac."
_DOCKER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_IMPORT_CHUNK = 1 << 20


def _stderr_log(message: str) -> None:
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
        if any(part in _IGNORED_NAMES or part.endswith((".pyc", "~", ".swp")) for part in rel.parts):
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


def publish_image(name: str, log: LogFn = _stderr_log) -> Path:
    """Publish root's build of ``name`` for the host's normal users (the ``shared`` export): once per recipe."""
    image = require_image(name)
    root = shared_image_dirs()[0]
    final = root / image.ref
    if (final / PUBLISHED_ROOTFS).is_file():
        return final
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    with _locked(root / f".{image.ref}.lock", log):
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
            _remove_tree(work)
            raise
    log(f"image {image.ref} published in {time.monotonic() - started:.1f} s: {final}")
    return final


def unpack_published(published: Path, log: LogFn = _stderr_log) -> ImageInfo:
    """A copy of a published image in the caller's cache, owned by the caller (what a rootless sandbox
    runs: its owner is root inside). Setuid and setgid bits are dropped (they would be the caller's on the
    host, and mean nothing inside, where every mount is nosuid); the image folder is 0700."""
    root = cache_dir()
    final = root / published.name
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f".{published.name}.lock", log):
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
            _remove_tree(work)
            raise
    log(f"image {published.name} unpacked from {published} in {time.monotonic() - started:.1f} s: {final}")
    return ImageInfo.load(final)


# --- building ----------------------------------------------------------------------------------


def _check_host() -> None:
    if os.geteuid() != 0:
        raise AleIacError("building an image needs root (debootstrap, chroot and mount); run it as root")
    for tool, package in (("debootstrap", "debootstrap"), ("unshare", "util-linux"), ("chroot", "coreutils")):
        if shutil.which(tool) is None:
            raise AleIacError(
                f"{tool} is not installed; run: apt-get install -y {package} (see scripts/apt-packages.txt)"
            )
    if not KEYRING.is_file():
        raise AleIacError(f"{KEYRING} is missing; run: apt-get install -y debian-archive-keyring")


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


def _unmount_under(path: Path) -> None:
    for point in _mounts_under(path):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def _remove_tree(path: Path) -> None:
    """Delete a build tree, never following a mount into the host's files."""
    if not path.exists():
        return
    _unmount_under(path)
    left = _mounts_under(path)
    if left:
        raise AleIacError(f"refusing to delete {path}: still mounted: {', '.join(left)}")
    shutil.rmtree(path)


def _tree_size(root: Path) -> int:
    """Allocated bytes of a tree (like ``du -s``), counting hard-linked files once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    stack = [str(root)]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                key = (st.st_dev, st.st_ino)
                if key in seen:
                    continue
                seen.add(key)
                total += st.st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
    return total


def _server_version(rootfs: Path) -> str | None:
    for metadata in rootfs.glob("opt/cua/lib/python3*/site-packages/cua_computer_server-*.dist-info/METADATA"):
        for line in metadata.read_text(errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return None


def _host_apt_overrides() -> str:
    """The host's apt Acquire settings that decide whether the mirror is reachable and accepted."""
    if shutil.which("apt-config") is None:
        return ""
    lines = []
    for key in PASSTHROUGH_APT:
        result = subprocess.run(["apt-config", "dump", key], capture_output=True, text=True, check=False)
        for line in result.stdout.splitlines():
            if line.split(" ", 1)[0] == key:
                lines.append(line)
    return "\n".join(lines) + ("\n" if lines else "")


def _host_ca_bundle() -> Path | None:
    for candidate in (
        os.environ.get("PIP_CERT"),
        os.environ.get("SSL_CERT_FILE"),
        os.environ.get("REQUESTS_CA_BUNDLE"),
        "/etc/ssl/certs/ca-certificates.crt",
    ):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


@contextmanager
def _locked(lock_path: Path, log: LogFn) -> Iterator[int]:
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


class _Builder:
    def __init__(self, name: str, full_hash: str, work: Path, lock_fd: int, log: LogFn, verbose: bool) -> None:
        self.name = name
        self.hash = full_hash
        self.work = work
        self.rootfs = work / ROOTFS
        self.log_path = work / BUILD_LOG
        self.lock_fd = lock_fd
        self.log = log
        self.verbose = verbose
        self.steps: dict[str, float] = {}
        self.recipe = load_recipe(name)

    def run(self, step: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.log(f"[{step}] ...")
        start = time.monotonic()
        with open(self.log_path, "ab") as logf:
            logf.write(f"\n=== {step}: {' '.join(argv)}\n".encode())
            logf.flush()
            # The lock fd is passed down so that the lock stays held until every process of the
            # step has exited, even if this builder is killed first.
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                pass_fds=(self.lock_fd,),
            )
            try:
                self._pump(proc.stdout, logf)
                code = proc.wait()
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                _unmount_under(self.work)
        elapsed = time.monotonic() - start
        self.steps[step] = round(elapsed, 2)
        if code != 0:
            raise ImageBuildError(
                f"image '{self.name}': step '{step}' failed with exit code {code} after {elapsed:.1f} s\n"
                f"--- last lines of the build log ---\n{self._tail()}"
            )
        self.log(f"[{step}] done in {elapsed:.1f} s")

    def _pump(self, stream: IO[bytes] | None, logf: IO[bytes]) -> None:
        assert stream is not None
        for line in stream:
            logf.write(line)
            if self.verbose:
                self.log("    " + line.decode(errors="replace").rstrip())

    def _tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def chroot_env(self) -> dict[str, str]:
        boot = self.recipe.get("debootstrap", {})
        env = {
            "PATH": CHROOT_PATH,
            "HOME": "/root",
            "LANG": "C.UTF-8",
            "ALE_SUITE": str(boot.get("suite", "trixie")),
            "ALE_MIRROR": str(boot.get("mirror", "http://deb.debian.org/debian")),
            "ALE_SECURITY_MIRROR": str(boot.get("security_mirror", "http://deb.debian.org/debian-security")),
        }
        env.update({k: v for k, v in os.environ.items() if k in PASSTHROUGH_ENV})
        if (self.rootfs / CHROOT_CA_BUNDLE).is_file():
            env["PIP_CERT"] = f"/{CHROOT_CA_BUNDLE}"
        return env

    def debootstrap(self) -> None:
        boot = self.recipe.get("debootstrap", {})
        suite = str(boot.get("suite", "trixie"))
        variant = str(boot.get("variant", "minbase"))
        mirror = str(boot.get("mirror", "http://deb.debian.org/debian"))
        self.run(
            f"debootstrap {suite} ({variant})",
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "--",
                "debootstrap",
                f"--variant={variant}",
                f"--keyring={KEYRING}",
                suite,
                str(self.rootfs),
                mirror,
            ],
        )

    def phase(self, phase: str) -> None:
        # /proc and /dev exist in the chroot only inside this private mount namespace.
        script = (
            'root="$1"; shift; '
            'mount -t proc proc "$root/proc"; '
            'mount --rbind /dev "$root/dev"; '
            'exec chroot "$root" "$@"'
        )
        env_args = [f"{k}={v}" for k, v in self.chroot_env().items()]
        self.run(
            phase,
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "--",
                "/bin/sh",
                "-ec",
                script,
                "ale-chroot",
                str(self.rootfs),
                "/usr/bin/env",
                "-i",
                *env_args,
                "/bin/sh",
                f"/{CHROOT_RECIPE}/{SETUP_SCRIPT}",
                phase,
            ],
        )

    def prepare_chroot(self, recipe: Path) -> None:
        target = self.rootfs / CHROOT_RECIPE
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(recipe, target, ignore=shutil.ignore_patterns(*_IGNORED_NAMES, "*.pyc"))
        shutil.copyfile("/etc/resolv.conf", self.rootfs / "etc/resolv.conf")
        # pip in the chroot trusts what the host's pip trusts (a TLS-intercepting egress proxy's
        # CA, for one). Only for the build: the file is deleted before the image is finished.
        bundle = _host_ca_bundle()
        if bundle is not None:
            shutil.copyfile(bundle, self.rootfs / CHROOT_CA_BUNDLE)
        overrides = _host_apt_overrides()
        if overrides:
            conf = self.rootfs / "etc/apt/apt.conf.d/99ale-build"
            conf.parent.mkdir(parents=True, exist_ok=True)
            conf.write_text(overrides)

    def finish_chroot(self) -> None:
        shutil.rmtree(self.rootfs / CHROOT_RECIPE, ignore_errors=True)
        (self.rootfs / CHROOT_CA_BUNDLE).unlink(missing_ok=True)
        (self.rootfs / "etc/apt/apt.conf.d/99ale-build").unlink(missing_ok=True)

    def write_manifest(self, seconds: float) -> dict[str, Any]:
        manifest = {
            "name": self.name,
            "hash": self.hash[:12],
            "recipe_hash": self.hash,
            "built_at": utc_now("seconds"),
            "build_seconds": round(seconds, 1),
            "size_bytes": _tree_size(self.rootfs),
            "computer_server_version": _server_version(self.rootfs),
            "steps": self.steps,
            "recipe": self.recipe.get("image", {}),
            "debootstrap": self.recipe.get("debootstrap", {}),
        }
        (self.work / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        return manifest


def build_image(
    name: str,
    *,
    force: bool = False,
    log: LogFn = _stderr_log,
    verbose: bool = False,
    users_of: Callable[[Path], list[str]] = lambda _rootfs: [],
) -> ImageInfo:
    """Build ``images/<name>/`` into the cache, or return the cached build of the same recipe.

    ``force`` rebuilds even when a build of the current recipe exists (refused while a running
    sandbox uses it: ``users_of`` names the live units whose root is a rootfs). ``log`` receives one line
    per step with its time; ``verbose`` also sends every line the build prints.
    """
    recipe = recipe_dir(name)
    full_hash = recipe_hash(name)
    ref = f"{name}-{full_hash[:12]}"
    root = cache_dir()
    final = root / ref
    if not force and (existing := find_image(name)) is not None:
        log(f"image {ref} is already built: {existing.path}")
        return existing
    _check_host()
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f".{ref}.lock", log) as lock_fd:
        if not force and (existing := find_image(name)) is not None:
            log(f"image {ref} was built meanwhile: {existing.path}")
            return existing
        if force and final.exists():
            users = users_of(final / ROOTFS)
            if users:
                raise AleIacError(
                    f"image {ref} is in use by running sandboxes ({', '.join(users)}); "
                    "stop them before a forced rebuild"
                )
        # Left by a build that was killed: under the lock nobody else can be using them.
        for stale in root.glob(f".build-{ref}-*"):
            log(f"removing the leftover of an interrupted build: {stale}")
            _remove_tree(stale)
        for stale in root.glob(f".old-{ref}-*"):
            _remove_tree(stale)

        work = root / f".build-{ref}-{os.getpid()}"
        work.mkdir()
        failed_log = root / f"{ref}.failed.log"
        log(f"building image {ref} from {recipe}")
        started = time.monotonic()
        builder = _Builder(name, full_hash, work, lock_fd, log, verbose)
        try:
            builder.debootstrap()
            builder.prepare_chroot(recipe)
            for phase in builder.recipe.get("build", {}).get("phases", []):
                builder.phase(str(phase))
            builder.finish_chroot()
            builder.write_manifest(time.monotonic() - started)
            if final.exists():
                old = root / f".old-{ref}-{os.getpid()}"
                final.rename(old)
                work.rename(final)
                _remove_tree(old)
            else:
                work.rename(final)
        except BaseException:
            if builder.log_path.exists():
                shutil.copyfile(builder.log_path, failed_log)
                log(f"build failed; its log is kept at {failed_log}")
            _remove_tree(work)
            raise
        failed_log.unlink(missing_ok=True)
    image = ImageInfo.load(final)
    log(f"image {image.ref} built in {image.build_seconds:.1f} s ({image.size_bytes / 2**20:.0f} MiB): {image.path}")
    return image


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


def ensure_docker_image(name: str = "desktop", log: LogFn = _stderr_log) -> str:
    """The built image ``name`` in the Docker engine as ``ale-iac/<name>:<hash12>`` (labelled
    ``ale-iac.image``, ``ale-iac.image-hash``): imported from the cached rootfs if the engine does not
    have it yet (once, under the image's lock), else reused. Returns the tag. Nothing is pulled."""
    image = require_image(name)
    tag = docker_image_tag(image)
    client = docker_engine.client()
    try:
        if docker_has(client, tag):
            return tag
        with _locked(cache_dir() / f".docker-{image.ref}.lock", log):
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


# --- what exports of a built image need ----------------------------------------------------------


@dataclass(frozen=True)
class ExportContext:
    """What an export of a built image into another form (a guest disk, a cloud image) needs of the build:
    the image, the environment its chroot steps run with, the host's apt settings and CA bundle."""

    image: ImageInfo
    env: dict[str, str]
    apt_conf: str
    ca_bundle: Path | None


def export_context(name: str, log: LogFn = _stderr_log) -> ExportContext:
    """The :class:`ExportContext` of the built image ``name``."""
    image = require_image(name)
    builder = _Builder(name, recipe_hash(name), image.path, -1, log, verbose=False)
    return ExportContext(image, builder.chroot_env(), _host_apt_overrides(), _host_ca_bundle())


EXPORT_TARGETS = ("docker", "shared")
"""Exports of a built rootfs this module makes: into the Docker engine, and for the host's other users. The
substrates add their own (``ale_iac.substrates.registry.export_targets``: one recipe, one cache, several
exports)."""


def export_image(name: str, target: str, log: LogFn = _stderr_log) -> str:
    """Export the built image ``name`` to ``target`` (one of :data:`EXPORT_TARGETS`); returns what it is called
    there (for ``docker``, the engine tag ``ale-iac/<name>:<hash12>``; for ``shared``, the folder)."""
    if target not in EXPORT_TARGETS:
        raise AleIacError(f"unknown image export target {target!r} (known: {', '.join(EXPORT_TARGETS)})")
    if target == "shared":
        return str(publish_image(name, log=log))
    return ensure_docker_image(name, log=log)
