"""Agent CLIs (Claude Code, Codex) installed from npm on this host, pinned, lazily, once per version.

``ensure_cli(name)`` installs ``<package>@<pin>`` (pins in ``versions.env``) with the host's ``npm``
into ``<cache>/agent-clis/<name>-<version>``: into a temporary folder first, renamed into place once
it is complete and checked, under a file lock (pytest-xdist workers and concurrent runs race for it),
so a crash never leaves a half install (the next try removes its leftovers). Once there it is a
directory lookup.

What a deployer runs is the CLI's **native executable** (``CliInstall.entry``), not npm's Node
launcher: no Node is needed where the agent runs, in a sandbox or a container. ``CliInstall.files``
lists exactly the files a copy elsewhere needs (the executable and what it uses beside it), and
``archive(install)`` packs them once per version into a ``.tar.gz`` that executors carry into
sandboxes (which have no network, so nothing can be installed there). The same files serve every
substrate, which is why the install happens here, on the host, and nowhere else.

    python -m ale_iac.agent_sdk.clis ensure claude-code codex     # pre-install (scripts, CI)
    python -m ale_iac.agent_sdk.clis archive claude-code          # ... and pack
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from ale_iac.agent_sdk.executor import CliInstall
from ale_iac.errors import AleIacError
from ale_iac.paths import cache_root
from ale_iac.toolchain import parse_versions, versions_file

LOCK_TIMEOUT_S = 900.0
"""How long to wait for another process's install of the same CLI (one takes ~6 s, 40 s on a slow link)."""
NPM_TIMEOUT_S = 900.0
MIN_NATIVE_BYTES = 10 * 1024 * 1024
"""The native executables are 300-400 MB; anything under this is a launcher or a placeholder."""
ELF_MAGIC = b"\x7fELF"
ARCHIVE_SUFFIX = ".tar.gz"
LOG_TAIL_LINES = 15

Log = Callable[[str], None]

_ARCH = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}
_RUST_ARCH = {"x64": "x86_64", "arm64": "aarch64"}


@dataclass(frozen=True)
class CliSpec:
    """An agent CLI on npm: its package, the ``versions.env`` key of its pin, and where its files are."""

    name: str
    package: str
    pin_key: str
    layout: Callable[[str], tuple[str, tuple[str, ...]]]
    """arch (``x64``/``arm64``) -> (entry, files), paths relative to the npm prefix."""
    hint: str
    """What usually went wrong when the native executable is missing."""


def _claude_code_layout(arch: str) -> tuple[str, tuple[str, ...]]:
    # The wrapper package ships a 500-byte placeholder at bin/claude.exe; its postinstall hard-links
    # the native Bun-built executable of @anthropic-ai/claude-code-linux-<arch> over it. That one file
    # is all it needs (ripgrep and the rest are inside).
    entry = "node_modules/@anthropic-ai/claude-code/bin/claude.exe"
    return entry, (entry,)


def _codex_layout(arch: str) -> tuple[str, tuple[str, ...]]:
    # @openai/codex-linux-<arch> (an alias of @openai/codex@<v>-linux-<arch>) holds a static musl
    # package: bin/codex (the CLI), codex-package.json (its layout manifest, which the CLI reads),
    # codex-path/rg (put on the shell tool's PATH, for searches) and codex-resources/bwrap (used by its
    # own command sandbox when one is on). Left out: codex-code-mode-host (70 MB, only with
    # features.code_mode_host) and codex-resources/voice (the realtime voice host).
    base = f"node_modules/@openai/codex-linux-{arch}/vendor/{_RUST_ARCH[arch]}-unknown-linux-musl"
    entry = f"{base}/bin/codex"
    return entry, (
        entry,
        f"{base}/codex-package.json",
        f"{base}/codex-path/rg",
        f"{base}/codex-resources/bwrap",
    )


CLIS: dict[str, CliSpec] = {
    "claude-code": CliSpec(
        name="claude-code",
        package="@anthropic-ai/claude-code",
        pin_key="CLAUDE_CODE_VERSION",
        layout=_claude_code_layout,
        hint="its postinstall (node install.cjs) must run and its optional dependency "
        "@anthropic-ai/claude-code-linux-<arch> must be installed: check that npm's ignore-scripts and "
        "omit=optional are not set (npm config get ignore-scripts omit)",
    ),
    "codex": CliSpec(
        name="codex",
        package="@openai/codex",
        pin_key="CODEX_VERSION",
        layout=_codex_layout,
        hint="its optional dependency @openai/codex-linux-<arch> must be installed: check that npm's "
        "omit=optional is not set (npm config get omit)",
    ),
}
"""The agent CLIs ale-iac can install, by name (what ``BaseAgentDeployer.clis`` lists)."""


class CliInstallError(AleIacError):
    """An agent CLI could not be installed or is not usable."""


def _spec(name: str) -> CliSpec:
    if name not in CLIS:
        raise CliInstallError(f"unknown agent CLI {name!r} (known: {', '.join(CLIS)})")
    return CLIS[name]


def host_arch() -> str:
    machine = platform.machine().lower()
    if sys.platform != "linux" or machine not in _ARCH:
        raise CliInstallError(
            f"agent CLIs are installed for Linux x86_64 or aarch64 only, not {sys.platform} {machine}"
        )
    return _ARCH[machine]


def pinned_version(name: str) -> str:
    """The version of CLI ``name`` that ``versions.env`` pins."""
    spec = _spec(name)
    path = versions_file()
    try:
        values = parse_versions(path.read_text(encoding="utf-8"), str(path))
    except OSError as exc:
        raise CliInstallError(f"cannot read {path} ({exc.strerror}): ale-iac runs from its checkout") from exc
    version = values.get(spec.pin_key)
    if not version:
        raise CliInstallError(f"{path} sets no {spec.pin_key} (the pinned {spec.package} version)")
    return version


def clis_dir() -> Path:
    """Where agent CLIs are installed: ``<cache>/agent-clis``."""
    return cache_root() / "agent-clis"


def _install_dir(name: str, version: str) -> Path:
    return clis_dir() / f"{name}-{version}"


def _lock(name: str, version: str) -> FileLock:
    clis_dir().mkdir(parents=True, exist_ok=True)
    return FileLock(clis_dir() / f"{name}-{version}.lock", timeout=LOCK_TIMEOUT_S)


def _described(name: str, version: str, root: Path) -> CliInstall:
    entry, files = _spec(name).layout(host_arch())
    return CliInstall(name=name, version=version, root=root, entry=entry, files=files)


def check_install(install: CliInstall) -> None:
    """Raise a :class:`CliInstallError` unless every file is there and the entry is a native executable."""
    spec = _spec(install.name)
    where = f"{spec.package}@{install.version} in {install.root}"
    missing = [rel for rel in install.files if not (install.root / rel).is_file()]
    if missing:
        raise CliInstallError(f"{where} lacks {', '.join(missing)}: {spec.hint}")
    entry = install.root / install.entry
    size = entry.stat().st_size
    with entry.open("rb") as handle:
        magic = handle.read(4)
    if magic != ELF_MAGIC or size < MIN_NATIVE_BYTES:
        raise CliInstallError(
            f"{where}: {install.entry} is not the native executable ({size} bytes, "
            f"{'an ELF file' if magic == ELF_MAGIC else 'not an ELF file'}; a placeholder?): {spec.hint}"
        )
    if not os.access(entry, os.X_OK):
        raise CliInstallError(f"{where}: {install.entry} is not executable")


def find_cli(name: str, version: str | None = None) -> CliInstall | None:
    """CLI ``name`` (at its pinned version) if it is installed and complete, else None."""
    version = version or pinned_version(name)
    root = _install_dir(name, version)
    if not root.is_dir():
        return None
    install = _described(name, version, root)
    try:
        check_install(install)
    except (CliInstallError, OSError):
        return None
    return install


def ensure_cli(name: str, log: Log | None = None, version: str | None = None) -> CliInstall:
    """CLI ``name`` at its pinned version, installed from npm first if it is not there yet.

    Idempotent and safe to call concurrently (from threads, processes, xdist workers): one installs,
    the others wait for it and find it done."""
    version = version or pinned_version(name)
    found = find_cli(name, version)
    if found is not None:
        return found
    root = _install_dir(name, version)
    try:
        with _lock(name, version):
            found = find_cli(name, version)
            if found is not None:
                return found
            if root.exists():  # there but broken (files removed by hand): install afresh
                shutil.rmtree(root)
            return _install(name, version, root, log or (lambda _line: None))
    except Timeout:
        raise CliInstallError(
            f"another process has been installing {name} {version} for over {LOCK_TIMEOUT_S:.0f} s "
            f"(lock {clis_dir() / f'{name}-{version}.lock'})"
        ) from None


def _install(name: str, version: str, root: Path, log: Log) -> CliInstall:
    spec = _spec(name)
    npm = shutil.which("npm")
    if npm is None:
        raise CliInstallError(
            f"npm is not on PATH: it installs the agent CLI {spec.package}@{version} "
            "(install Node.js and npm: apt-get install npm)"
        )
    tmp = root.with_name(root.name + ".tmp")
    if tmp.exists():  # a crashed install's leftovers
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    argv = [npm, "install", "--prefix", str(tmp), "--no-audit", "--no-fund", f"{spec.package}@{version}"]
    log(f"installing {spec.package}@{version} from npm into {root}")
    started = time.monotonic()
    env = {**os.environ, "npm_config_update_notifier": "false"}
    try:
        try:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                env=env,
                timeout=NPM_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise CliInstallError(f"npm install {spec.package}@{version} took over {NPM_TIMEOUT_S:.0f} s") from None
        if done.returncode != 0:
            raise CliInstallError(
                f"npm install {spec.package}@{version} failed (exit {done.returncode}):\n"
                + _tail(done.stdout + done.stderr)
            )
        install = _described(name, version, tmp)
        check_install(install)
        _check_runs(install)
        os.replace(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"installed {spec.package}@{version} in {time.monotonic() - started:.1f} s")
    return _described(name, version, root)


def _check_runs(install: CliInstall) -> None:
    """``<entry> --version`` prints the pinned version (state dirs in a throwaway folder)."""
    with tempfile.TemporaryDirectory(prefix="ale-cli-check-") as scratch:
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": scratch,
            "CLAUDE_CONFIG_DIR": scratch,
            "CODEX_HOME": scratch,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }
        try:
            done = subprocess.run(
                [str(install.root / install.entry), "--version"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                env=env,
                cwd=scratch,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CliInstallError(
                f"{install.name} {install.version}: {install.entry} --version failed: {exc}"
            ) from None
    if done.returncode != 0 or install.version not in done.stdout:
        raise CliInstallError(
            f"{install.name} {install.version}: {install.entry} --version exited {done.returncode} "
            f"without printing {install.version}:\n" + _tail(done.stdout + done.stderr)
        )


def _tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    kept = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(kept[-lines:]) or "(no output)"


def archive_path(install: CliInstall) -> Path:
    return clis_dir() / f"{install.name}-{install.version}{ARCHIVE_SUFFIX}"


def archive(install: CliInstall) -> Path:
    """A ``.tar.gz`` of ``install.files`` (paths relative to the install root), made once per version.

    gzip level 1: the desktop image has gzip but no zstd, and level 1 packs 400 MB in seconds. Made
    through a temporary file and a rename, under the install's lock."""
    target = archive_path(install)
    if target.is_file():
        return target
    try:
        with _lock(install.name, install.version):
            if target.is_file():
                return target
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            try:
                with tarfile.open(tmp, "w:gz", compresslevel=1) as tar:
                    for rel in install.files:
                        tar.add(install.root / rel, arcname=rel, recursive=False, filter=_anonymous)
                os.replace(tmp, target)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
    except Timeout:
        raise CliInstallError(f"another process has been packing {target} for over {LOCK_TIMEOUT_S:.0f} s") from None
    return target


def _anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ale_iac.agent_sdk.clis", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["ensure", "archive", "find"])
    parser.add_argument("names", nargs="+", metavar="NAME", help=f"one of: {', '.join(CLIS)}")
    args = parser.parse_args(argv)
    try:
        for name in args.names:
            if args.action == "find":
                found = find_cli(name)
                print(f"{name}: {found.root / found.entry if found else 'not installed'}")
                continue
            install = ensure_cli(name, log=lambda line: print(line, file=sys.stderr))
            path = archive(install) if args.action == "archive" else install.root / install.entry
            print(f"{name} {install.version}: {path}")
    except AleIacError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
