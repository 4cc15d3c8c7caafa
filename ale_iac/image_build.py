"""Building an image recipe into the cache (``ale-iac images build``): debootstrap, then the recipe's phases in its
chroot, each step logged and timed; and what an export of a built image into another form needs of the build.

Builds are safe to interrupt and to run twice at once: a build happens in a temporary folder next
to the final one and is renamed into place atomically, under a per-image lock. Every mount the
build needs (``/proc``, ``/dev`` in the chroot) is made inside a private mount namespace
(``unshare --mount --propagation private``), so none can outlive the step that made it; a
``finally`` still checks for (and lazily unmounts) anything left under the build folder before
deleting it, because deleting a tree with a bind mount of ``/dev`` in it would delete the host's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ale_iac.clock import utc_now
from ale_iac.errors import AleIacError
from ale_iac.images import (
    IGNORED_NAMES,
    MANIFEST,
    ROOTFS,
    ImageBuildError,
    ImageInfo,
    LogFn,
    cache_dir,
    find_image,
    load_recipe,
    locked,
    recipe_dir,
    recipe_hash,
    remove_tree,
    require_image,
    stderr_log,
    unmount_under,
)

SETUP_SCRIPT = "setup.sh"


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
                unmount_under(self.work)
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
        shutil.copytree(recipe, target, ignore=shutil.ignore_patterns(*IGNORED_NAMES, "*.pyc"))
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


def _remove_leftovers(root: Path, ref: str, log: LogFn) -> None:
    """What a killed build of ``ref`` left; under the image's lock nobody else can be using it."""
    for stale in root.glob(f".build-{ref}-*"):
        log(f"removing the leftover of an interrupted build: {stale}")
        remove_tree(stale)
    for stale in root.glob(f".old-{ref}-*"):
        remove_tree(stale)


def _run_build(builder: _Builder, recipe: Path) -> None:
    """Every step of the build, in its folder: debootstrap, the recipe's phases in the chroot, the manifest."""
    started = time.monotonic()
    builder.debootstrap()
    builder.prepare_chroot(recipe)
    for phase in builder.recipe.get("build", {}).get("phases", []):
        builder.phase(str(phase))
    builder.finish_chroot()
    builder.write_manifest(time.monotonic() - started)


def _replace(final: Path, work: Path, old: Path) -> None:
    """``work`` renamed into place as ``final``; a build there before is moved aside first, then removed."""
    if final.exists():
        final.rename(old)
        work.rename(final)
        remove_tree(old)
    else:
        work.rename(final)


def build_image(
    name: str,
    *,
    force: bool = False,
    log: LogFn = stderr_log,
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
    with locked(root / f".{ref}.lock", log) as lock_fd:
        if not force and (existing := find_image(name)) is not None:
            log(f"image {ref} was built meanwhile: {existing.path}")
            return existing
        if force and final.exists() and (users := users_of(final / ROOTFS)):
            raise AleIacError(
                f"image {ref} is in use by running sandboxes ({', '.join(users)}); stop them before a forced rebuild"
            )
        _remove_leftovers(root, ref, log)
        work = root / f".build-{ref}-{os.getpid()}"
        work.mkdir()
        failed_log = root / f"{ref}.failed.log"
        log(f"building image {ref} from {recipe}")
        builder = _Builder(name, full_hash, work, lock_fd, log, verbose)
        try:
            _run_build(builder, recipe)
            _replace(final, work, root / f".old-{ref}-{os.getpid()}")
        except BaseException:
            if builder.log_path.exists():
                shutil.copyfile(builder.log_path, failed_log)
                log(f"build failed; its log is kept at {failed_log}")
            remove_tree(work)
            raise
        failed_log.unlink(missing_ok=True)
    image = ImageInfo.load(final)
    log(f"image {image.ref} built in {image.build_seconds:.1f} s ({image.size_bytes / 2**20:.0f} MiB): {image.path}")
    return image


# --- what exports of a built image need ----------------------------------------------------------


@dataclass(frozen=True)
class ExportContext:
    """What an export of a built image into another form (a guest disk, a cloud image) needs of the build:
    the image, the environment its chroot steps run with, the host's apt settings and CA bundle."""

    image: ImageInfo
    env: dict[str, str]
    apt_conf: str
    ca_bundle: Path | None


def export_context(name: str, log: LogFn = stderr_log) -> ExportContext:
    """The :class:`ExportContext` of the built image ``name``."""
    image = require_image(name)
    builder = _Builder(name, recipe_hash(name), image.path, -1, log, verbose=False)
    return ExportContext(image, builder.chroot_env(), _host_apt_overrides(), _host_ca_bundle())
