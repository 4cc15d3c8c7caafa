"""A normal user of this host, for the rootless tests: made with ``useradd``, driven with ``runuser``,
removed at teardown with everything it made (processes, home, files under /tmp), pass or fail.

The user needs to read what root set up: the checkout and its venv, the Python the venv runs on, the
Pulumi toolchain, the published image. On CI these may sit under ``/root`` (0700). Nothing of the
host's permissions is changed for that: each command runs in a private mount namespace (``unshare
--mount``) where root lays a 0755 tmpfs over every folder the user cannot traverse and binds back
only the paths it needs, then drops to the user with ``runuser``. The namespace goes with the command
(and the sandboxes it started, which inherit it).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from ale_iac.paths import cache_root, project_root

# Run by root's python in the private mount namespace: expose the paths, then become the user.
_ENTER = r"""
import json, os, subprocess, sys, tempfile
spec = json.loads(sys.argv[1])

def run(*argv):
    subprocess.run(argv, check=True, capture_output=True)

def blocked_ancestor(path):
    # the topmost folder on the way to `path` that others cannot traverse
    parts = path.strip("/").split("/")
    for i in range(1, len(parts) + 1):
        folder = "/" + "/".join(parts[:i])
        if i < len(parts) or os.path.isdir(folder):
            if not os.stat(folder).st_mode & 0o001:
                return folder
    return None

groups = {}
for path in spec["expose"]:
    top = blocked_ancestor(path)
    if top is not None:
        groups.setdefault(top, []).append(path)
for top, paths in groups.items():
    staging = tempfile.mkdtemp(prefix="ale-iac-expose-")
    run("mount", "--bind", top, staging)
    run("mount", "-t", "tmpfs", "-o", "mode=0755,size=1m", "tmpfs", top)
    for path in paths:
        rel = os.path.relpath(path, top)
        source = os.path.join(staging, rel)
        target = os.path.join(top, rel)
        if os.path.isdir(source):
            os.makedirs(target, mode=0o755, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
            open(target, "a").close()
        run("mount", "--bind", source, target)
    run("umount", "-l", staging)
    os.rmdir(staging)
os.chdir(spec["cwd"])
env = ["env", "-i"] + [f"{k}={v}" for k, v in spec["env"].items()]
os.execvp("runuser", ["runuser", "-u", spec["user"], "--"] + env + spec["argv"])
"""


@dataclass
class HostUser:
    """A throwaway normal user; ``run`` executes a command as it, with what it needs exposed."""

    name: str
    uid: int
    gid: int
    home: Path
    expose: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def ale_home(self) -> Path:
        return self.home / ".ale-iac"

    def command_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        venv_bin = str(Path(sys.executable).parent)
        env = {
            "HOME": str(self.home),
            "USER": self.name,
            "LOGNAME": self.name,
            "PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "LANG": "C.UTF-8",
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        env.update(self.env)
        env.update(extra or {})
        return env

    def argv(self, argv: Sequence[str], env: dict[str, str] | None = None, cwd: str | None = None) -> list[str]:
        spec = {
            "user": self.name,
            "expose": self.expose,
            "env": self.command_env(env),
            "argv": list(argv),
            "cwd": cwd or str(project_root()),
        }
        return ["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-c", _ENTER, json.dumps(spec)]

    def run(
        self, argv: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 300, cwd: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(argv, env, cwd), capture_output=True, text=True, timeout=timeout, check=False)

    def python(self, code: str, *, env: dict[str, str] | None = None, timeout: float = 300) -> str:
        """Run ``code`` with the venv's python as the user; returns its stdout, raises with its stderr."""
        done = self.run([sys.executable, "-c", code], env=env, timeout=timeout)
        if done.returncode != 0:
            raise AssertionError(f"as {self.name}: exit {done.returncode}\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def processes(self) -> list[psutil.Process]:
        """The user's live processes (a zombie runs nothing: a detached supervisor's parent is the host's
        init, which reaps it in its own time)."""
        found = []
        for process in psutil.process_iter(["uids", "status"]):
            uids = process.info["uids"]
            if process.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if uids is not None and self.uid in (uids.real, uids.effective):
                found.append(process)
        return found


def default_expose() -> list[str]:
    """What a user needs of root's setup: the checkout (and its venv), the Python the venv runs on,
    the Pulumi toolchain root built."""
    paths = {str(project_root()), os.path.realpath(sys.base_prefix)}
    toolchain = cache_root() / "toolchain"
    if toolchain.is_dir():
        paths.add(str(toolchain.resolve()))
    return sorted(paths)


USER_DB_WAIT_S = 180.0
"""How long ``useradd``/``userdel`` wait for the user database another process holds (another session's
tests, or this session's other worker, adding or removing its own user at the same moment)."""


def user_command(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``useradd``/``userdel``, run again while the user database is locked by another process: shadow's
    tools wait some seconds for its lock (``lckpwdf``), then give up with "cannot lock ...; try again later"
    (seen with both workers' and other sessions' users made and removed at once on a loaded host)."""
    deadline = time.monotonic() + USER_DB_WAIT_S
    while True:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if "cannot lock" not in done.stderr or time.monotonic() > deadline:
            return done
        time.sleep(0.5)  # the holder is another process: nothing to wait on but the lock itself


def make_user(expose: Sequence[str] = ()) -> HostUser:
    name = f"aletest{secrets.token_hex(3)}"
    added = user_command(["useradd", "--create-home", "--user-group", "--shell", "/bin/sh", name])
    if added.returncode != 0:
        raise AssertionError(f"useradd {name}: exit {added.returncode}: {added.stderr.strip()}")
    entry = pwd.getpwnam(name)
    return HostUser(
        name=name,
        uid=entry.pw_uid,
        gid=entry.pw_gid,
        home=Path(entry.pw_dir),
        expose=sorted({*default_expose(), *expose}),
    )


def remove_user(user: HostUser) -> list[str]:
    """Kill what the user runs (by pid), delete the user, its home and its files under /tmp and /dev/shm.
    Returns what could not be removed (empty when all went)."""
    problems: list[str] = []
    for _ in range(3):
        alive = user.processes()
        if not alive:
            break
        for process in alive:
            try:
                process.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                continue
        psutil.wait_procs(alive, timeout=10)
    else:
        problems.append(f"processes of {user.name} do not die: {[p.pid for p in user.processes()]}")
    for top in ("/tmp", "/dev/shm", "/var/tmp"):
        for entry in Path(top).iterdir():
            try:
                if entry.lstat().st_uid == user.uid:
                    shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
            except OSError as exc:
                problems.append(f"{entry}: {exc}")
    done = user_command(["userdel", "--remove", user.name])
    # userdel warns (exit 12) when the user had no mail spool: not a failure here.
    if done.returncode not in (0, 12):
        problems.append(f"userdel {user.name}: {done.stderr.strip()}")
    deadline = time.monotonic() + 5
    while user.home.exists() and time.monotonic() < deadline:
        shutil.rmtree(user.home, ignore_errors=True)
    if user.home.exists():
        problems.append(f"{user.home} is left")
    return problems


@contextlib.contextmanager
def normal_user(expose: Sequence[str] = ()) -> Iterator[HostUser]:
    """A throwaway user, removed on the way out (also on failure)."""
    user = make_user(expose)
    try:
        yield user
    finally:
        problems = remove_user(user)
        if problems:
            raise AssertionError("the test user's teardown left: " + "; ".join(problems))


def publish_for_users(folder: Path) -> Path:
    """Root's build of the desktop image, published into ``folder`` (what ``ale-iac images build desktop
    --export shared`` does into /var/lib/ale-iac/images)."""
    from ale_iac.images import publish_image

    before = os.environ.get("ALE_IAC_IMAGE_PATH")
    os.environ["ALE_IAC_IMAGE_PATH"] = str(folder)
    try:
        return publish_image("desktop", log=lambda _line: None)
    finally:
        if before is None:
            del os.environ["ALE_IAC_IMAGE_PATH"]
        else:
            os.environ["ALE_IAC_IMAGE_PATH"] = before


@pytest.fixture(scope="session")
def rootless_user() -> Iterator[HostUser]:
    """A normal user that has unpacked the desktop image root published (into a folder of the session's),
    removed at the end of the session with everything it made. A plugin of ``tests/conftest.py``, so one
    user per worker session for every module (importing the fixture into a module would make one per module);
    the tests using it run one at a time in a worker, and each leaves the user nothing running."""
    shared = Path(tempfile.mkdtemp(prefix="ale-iac-images-"))
    try:
        os.chmod(shared, 0o755)
        publish_for_users(shared)
        with normal_user(expose=[str(shared)]) as user:
            user.env["ALE_IAC_IMAGE_PATH"] = str(shared)
            user.python("from ale_iac.images import require_image; require_image('desktop')")
            yield user
    finally:
        shutil.rmtree(shared, ignore_errors=True)
