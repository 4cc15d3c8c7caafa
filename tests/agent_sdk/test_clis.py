"""Agent CLIs installed from npm (ale_iac/agent_sdk/clis.py).

Most tests run a fake ``npm`` (a script first on PATH) that lays out a package the way the real one
does, with a real ELF executable (a copy of bash) as the native binary, in a cache of their own
(``ALE_IAC_CACHE``): the install's locking, atomicity, checks and errors, without the network. The
last ones install the real CLIs from the npm registry (``agent_clis``), into the shared cache.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from filelock import FileLock

from ale_iac.agent_sdk import CliInstall, clis
from ale_iac.agent_sdk.clis import CLIS, CliInstallError, archive, ensure_cli, find_cli

BASH = shutil.which("bash") or "/bin/bash"
BASH_VERSION = re.search(
    r"version (\d+\.\d+\.\d+)", subprocess.run([BASH, "--version"], capture_output=True, text=True, check=True).stdout
)
FAKE_VERSION = BASH_VERSION[1] if BASH_VERSION else "0.0.0"
"""The fake native binary is bash, so the version it prints (checked after install) is bash's."""

FAKE_NPM = """#!{python}
import json, os, shutil, sys
from pathlib import Path

from ale_iac.agent_sdk.clis import CLIS, host_arch

args = sys.argv[1:]
with open(os.environ["FAKE_NPM_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
mode = os.environ.get("FAKE_NPM_MODE", "ok")
if mode == "fail":
    print("npm http fetch GET 404 https://registry.npmjs.org/nope 52ms")
    print("npm error code E404", file=sys.stderr)
    print("npm error 404 Not Found - GET https://registry.npmjs.org/nope", file=sys.stderr)
    sys.exit(1)
prefix = Path(args[args.index("--prefix") + 1])
package = args[-1].rpartition("@")[0]
spec = next(s for s in CLIS.values() if s.package == package)
entry, files = spec.layout(host_arch())
for rel in files:
    path = prefix / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if rel == entry and mode == "placeholder":
        path.write_text("#!/bin/sh\\necho 'Error: claude native binary not installed.' >&2\\nexit 1\\n" + "#" * 400)
        path.chmod(0o755)
    elif rel == entry:
        shutil.copy2({bash!r}, path)
    else:
        path.write_text(rel + "\\n")
(prefix / "package.json").write_text("{{}}")
"""


@pytest.fixture
def fake_npm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fake npm first on PATH, a cache of the test's own; yields the npm call log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    npm = bin_dir / "npm"
    npm.write_text(FAKE_NPM.format(python=sys.executable, bash=BASH))
    npm.chmod(0o755)
    log = tmp_path / "npm-calls.jsonl"
    log.touch()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NPM_LOG", str(log))
    monkeypatch.setenv("ALE_IAC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(clis, "MIN_NATIVE_BYTES", 1024)  # bash is ~1 MB, the real binaries ~400 MB
    yield log


def npm_calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_install_is_atomic_idempotent_and_checked(fake_npm: Path) -> None:
    assert find_cli("codex", FAKE_VERSION) is None
    lines: list[str] = []
    install = ensure_cli("codex", log=lines.append, version=FAKE_VERSION)
    root = clis.clis_dir() / f"codex-{FAKE_VERSION}"
    assert install.root == root and install.version == FAKE_VERSION
    assert install.entry.endswith("/bin/codex") and install.entry in install.files
    assert all((root / rel).is_file() for rel in install.files)
    assert (root / install.entry).read_bytes()[:4] == b"\x7fELF"
    assert not root.with_name(root.name + ".tmp").exists()
    assert any("installing @openai/codex" in line for line in lines)
    [call] = npm_calls(fake_npm)
    assert call[:2] == ["install", "--prefix"] and call[2] == f"{root}.tmp"
    assert call[3:] == ["--no-audit", "--no-fund", f"@openai/codex@{FAKE_VERSION}"]

    # Again: found, not installed again.
    assert ensure_cli("codex", version=FAKE_VERSION) == install
    assert find_cli("codex", FAKE_VERSION) == install
    assert len(npm_calls(fake_npm)) == 1

    # A file of it gone: no longer found; installed afresh.
    (root / install.files[-1]).unlink()
    assert find_cli("codex", FAKE_VERSION) is None
    assert ensure_cli("codex", version=FAKE_VERSION) == install
    assert len(npm_calls(fake_npm)) == 2


def test_a_crashed_install_leaves_nothing_and_its_leftovers_go(fake_npm: Path) -> None:
    root = clis.clis_dir() / f"claude-code-{FAKE_VERSION}"
    leftover = root.with_name(root.name + ".tmp") / "node_modules" / "half-written"
    leftover.parent.mkdir(parents=True)
    leftover.write_text("from a crashed install")
    install = ensure_cli("claude-code", version=FAKE_VERSION)
    assert not leftover.exists()
    assert install.files == (install.entry,)
    assert not root.with_name(root.name + ".tmp").exists()


def test_concurrent_installs_run_npm_once(fake_npm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every caller has found nothing before any takes the lock: only one of them installs."""
    callers = 4
    reached: list[threading.Event] = [threading.Event() for _ in range(callers)]
    slots = iter(reached)
    real_lock = clis._lock

    def lock(name: str, version: str) -> FileLock:
        next(slots).set()  # this caller found no install and is about to wait for the lock
        return real_lock(name, version)

    monkeypatch.setattr(clis, "_lock", lock)
    results: list[CliInstall | BaseException] = []

    def call() -> None:
        try:
            results.append(ensure_cli("codex", version=FAKE_VERSION))
        except BaseException as exc:
            results.append(exc)

    held = real_lock("codex", FAKE_VERSION)
    with held:
        threads = [threading.Thread(target=call) for _ in range(callers)]
        for thread in threads:
            thread.start()
        for event in reached:
            assert event.wait(60), "a caller never reached the lock"
        assert npm_calls(fake_npm) == []  # all of them wait on the lock we hold
    for thread in threads:
        thread.join(120)
    assert len(results) == callers
    assert all(isinstance(r, CliInstall) for r in results), results
    assert len({r.root for r in results if isinstance(r, CliInstall)}) == 1
    assert len(npm_calls(fake_npm)) == 1


def test_the_claude_code_placeholder_is_refused(fake_npm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """npm without install scripts leaves Claude Code's 500-byte shell placeholder: a clear error, no install."""
    monkeypatch.setenv("FAKE_NPM_MODE", "placeholder")
    with pytest.raises(CliInstallError) as info:
        ensure_cli("claude-code", version=FAKE_VERSION)
    message = str(info.value)
    assert "bin/claude.exe is not the native executable" in message
    assert "not an ELF file" in message
    assert "ignore-scripts" in message and "postinstall" in message
    assert list(clis.clis_dir().glob("claude-code-*/")) == []


def test_check_install_refuses_a_placeholder_at_any_size(tmp_path: Path) -> None:
    entry = "node_modules/@anthropic-ai/claude-code/bin/claude.exe"
    path = tmp_path / entry
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x7fELF" + b"\0" * 496)  # an ELF header, but no 400 MB binary
    path.chmod(0o755)
    install = CliInstall(name="claude-code", version="9.9.9", root=tmp_path, entry=entry, files=(entry,))
    with pytest.raises(CliInstallError, match=r"not the native executable \(500 bytes, an ELF file"):
        clis.check_install(install)


def test_npm_failing_or_missing_says_why(fake_npm: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FAKE_NPM_MODE", "fail")
    with pytest.raises(CliInstallError) as info:
        ensure_cli("codex", version=FAKE_VERSION)
    assert f"npm install @openai/codex@{FAKE_VERSION} failed (exit 1)" in str(info.value)
    assert "npm error 404 Not Found" in str(info.value)  # npm's own last lines
    assert list(clis.clis_dir().glob("codex-*/")) == []

    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(CliInstallError, match="npm is not on PATH"):
        ensure_cli("codex", version=FAKE_VERSION)


def test_unknown_cli_and_missing_pin() -> None:
    with pytest.raises(CliInstallError, match=r"unknown agent CLI 'aider' \(known: claude-code, codex\)"):
        ensure_cli("aider")
    assert set(CLIS) == {"claude-code", "codex"}
    for name in CLIS:
        assert re.fullmatch(r"\d+\.\d+\.\d+", clis.pinned_version(name))


def test_archive_holds_exactly_the_files(fake_npm: Path, tmp_path: Path) -> None:
    install = ensure_cli("codex", version=FAKE_VERSION)
    path = archive(install)
    assert path.name == f"codex-{FAKE_VERSION}.tar.gz"
    with tarfile.open(path) as tar:
        members = tar.getmembers()
        assert sorted(m.name for m in members) == sorted(install.files)
        assert all(m.isfile() and (m.uid, m.gid, m.uname, m.gname) == (0, 0, "", "") for m in members)
        tar.extractall(tmp_path / "unpacked", filter="data")
    unpacked = tmp_path / "unpacked" / install.entry
    assert os.access(unpacked, os.X_OK)
    ran = subprocess.run([str(unpacked), "--version"], capture_output=True, text=True, check=True)
    assert FAKE_VERSION in ran.stdout
    # Made once per version: a second call does not rewrite it.
    stamp = path.stat().st_mtime_ns, path.stat().st_ino
    assert archive(install) == path
    assert (path.stat().st_mtime_ns, path.stat().st_ino) == stamp
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_module_entry_point(
    fake_npm: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(clis, "pinned_version", lambda name: FAKE_VERSION)
    assert clis.main(["ensure", "codex"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith(f"codex {FAKE_VERSION}: ") and out.out.strip().endswith("/bin/codex")
    assert clis.main(["find", "claude-code"]) == 0
    assert capsys.readouterr().out.strip() == "claude-code: not installed"
    monkeypatch.setenv("FAKE_NPM_MODE", "fail")
    assert clis.main(["ensure", "claude-code"]) == 1
    assert "npm error 404" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------------
# The real CLIs, from the npm registry
# ------------------------------------------------------------------------------------------------------


@pytest.mark.agent_clis
@pytest.mark.parametrize("name", sorted(CLIS))
def test_the_real_cli_installs_its_native_binary(name: str, tmp_path: Path) -> None:
    install = ensure_cli(name)  # the pinned version, into the shared cache (~6 s the first time)
    assert install.version == clis.pinned_version(name)
    entry = install.root / install.entry
    assert entry.read_bytes()[:4] == b"\x7fELF"
    assert entry.stat().st_size > clis.MIN_NATIVE_BYTES
    assert all((install.root / rel).is_file() for rel in install.files)
    assert find_cli(name) == install
    # A copy of `files` alone runs, with no Node on PATH (hard links: the binaries are ~400 MB).
    copy = tmp_path / "copy"
    for rel in install.files:
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        os.link(install.root / rel, copy / rel)
    home = tmp_path / "home"
    home.mkdir()
    ran = subprocess.run(
        [str(copy / install.entry), "--version"],
        capture_output=True,
        text=True,
        env={"PATH": "/nonexistent", "HOME": str(home), "CODEX_HOME": str(home), "CLAUDE_CONFIG_DIR": str(home)},
        check=False,
    )
    assert ran.returncode == 0 and install.version in ran.stdout, ran.stdout + ran.stderr
