"""Bridges started warm: a process that has imported the bridges once forks each ``ale-iac mcp vm|cua``.

Every bridge is a process of its own (an MCP client starts it over stdio), and most of its start is
importing the ``mcp`` SDK (1.2 CPU-seconds here, ``python -X importtime -c 'import mcp'``), once per bridge
per unit. A run that drives agents from this host starts :class:`WarmBridges`: one process imports the
bridges, listens on a Unix socket in a 0700 folder, and forks a bridge for each request. ``ale-iac mcp``
(``ale_iac.cli.main``) finds the socket in ``ALE_IAC_WARM_BRIDGES`` and becomes a forwarder: it
hands its own stdin, stdout and stderr to the warm process (``SCM_RIGHTS``) with its argv, environment and
working folder, and exits with the bridge's exit code. The MCP client sees no difference: its pipes are
the bridge's. Without the variable, or when the socket does not answer, ``ale-iac mcp`` runs the bridge
itself, as before.

* **Who may ask**: the socket is 0600 in a 0700 folder, and the peer's uid (``SO_PEERCRED``) must be the
  warm process's own; only ``mcp vm`` and ``mcp cua`` are forked.
* **Fork safety**: the warm process has one thread and has run no event loop; it only imports, accepts,
  forks. A forked bridge gets the requester's environment and folder, so it is what ``ale-iac mcp`` would
  have been, started from imported modules.
* **Lifetime**: a forked bridge ends when its forwarder does (the forwarder's end of the connection closes:
  a watcher in the bridge kills it), so killing what an MCP client started kills the bridge. The warm
  process ends when its standard input (a pipe from the run) closes; bridges it forked live on until
  their forwarders end.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ale_iac import procs
from ale_iac.procs import stop_by_closing_stdin

WARM_ENV = "ALE_IAC_WARM_BRIDGES"
"""Where ``ale-iac mcp`` finds the warm bridges' socket."""
SOCKET_NAME = "bridges.sock"
KINDS = ("vm", "cua")
START_TIMEOUT_S = 60.0
_EXIT = struct.Struct("!i")
_LENGTH = struct.Struct("!I")
MAX_REQUEST = 1 << 20
ENTRY = "ale_iac"
"""``python -m ale_iac``: what a forked bridge runs on this host (the ``ale-iac`` command, ``ale_iac.cli.main``;
its argv ``mcp vm|cua ...``)."""
ENTRY_CLI = "ale_iac.cli"
ENTRY_BRIDGES = "ale_iac.bridges"
"""``python -m ale_iac.bridges``: what a forked bridge runs inside a sandbox or an agent's container, where only the
runtime bundle is (no CLI; its argv ``vm|cua ...``)."""
ENTRIES: dict[str, tuple[str, ...]] = {
    ENTRY: ("ale_iac.bridges.vm", "ale_iac.bridges.cua", ENTRY_CLI, f"{ENTRY_CLI}.mcp"),
    ENTRY_BRIDGES: ("ale_iac.bridges.vm", "ale_iac.bridges.cua", "ale_iac.bridges.serve"),
}
"""Each entry a warm process may run, with what a bridge of it spends its start on (imported once, ahead)."""


def is_bridge_request(entry: str, argv: Sequence[str]) -> bool:
    """Whether ``argv`` starts a bridge of ``entry`` (the only thing a warm process forks)."""
    if entry == ENTRY:
        return len(argv) >= 2 and argv[0] == "mcp" and argv[1] in KINDS
    return entry == ENTRY_BRIDGES and len(argv) >= 1 and argv[0] in KINDS


FOLDER_PREFIX = "ale-iac-bridges-"


class WarmBridges:
    """The run's warm bridge process: :meth:`start` it, put :attr:`env` in the agents' environment, :meth:`close`."""

    def __init__(
        self, entry: str = ENTRY, python: Sequence[str] = (sys.executable,), env: dict[str, str] | None = None
    ) -> None:
        """``entry``: what the forked bridges run (:data:`ENTRIES`); ``python`` and ``env``: the interpreter and
        environment the bridges themselves would be started with (default: this one's)."""
        if entry not in ENTRIES:
            raise ValueError(f"no warm entry {entry!r} (one of {', '.join(ENTRIES)})")
        self.entry = entry
        self._python = list(python)
        self._env = env
        # 0700, named with the owner's pid: gc must not take the folder of a run that is still starting its
        # warm process (no socket yet) for one that a SIGKILL left behind.
        self._folder = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-"))
        self.socket_path = self._folder / SOCKET_NAME
        self._proc: subprocess.Popen[bytes] | None = None
        self._ready = False

    @property
    def env(self) -> dict[str, str]:
        return {WARM_ENV: str(self.socket_path)}

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, wait: bool = True) -> None:
        """Start the warm process; with ``wait``, return once it has imported the bridges. Without, at once:
        its socket listens before it imports, so a bridge asked for meanwhile is forked when the imports are
        done (sooner than a bridge that imports for itself beside them)."""
        self._proc = subprocess.Popen(
            [*self._python, "-m", __name__, "--entry", self.entry, str(self.socket_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
            env=self._env,
        )
        if wait and not self.wait_ready(START_TIMEOUT_S):
            self.close()
            raise RuntimeError(f"the warm bridge process did not import the bridges within {START_TIMEOUT_S:.0f} s")

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait at most ``timeout_s`` for the warm process to have imported the bridges: True once it has (also
        on every later call), False while it is still importing (a bridge asked for meanwhile waits for it). A
        process that ends without importing is stopped, and its socket removed, and raises: then each bridge
        imports for itself."""
        if self._ready:
            return True
        assert self._proc is not None and self._proc.stdout is not None
        readable, _, _ = select.select([self._proc.stdout], [], [], timeout_s)
        if not readable:
            return False
        line = self._proc.stdout.readline()
        if line.strip() != b"ready":
            self.close()
            raise RuntimeError(f"the warm bridge process did not start (it printed {line!r})")
        self._ready = True
        return True

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_by_closing_stdin(proc, timeout=10)
        _remove_folder(self.socket_path)

    def __enter__(self) -> WarmBridges:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- the forwarder (``ale-iac mcp`` with ALE_IAC_WARM_BRIDGES set) ----------------------------------------


def forward(socket_path: str, argv: Sequence[str], entry: str = ENTRY) -> int | None:
    """Have the warm process run ``python -m <entry> <argv>`` on this process's stdio; its exit code, or None
    when there is no warm process to ask (the caller then runs the bridge itself)."""
    if not is_bridge_request(entry, argv):
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(socket_path)
        payload = json.dumps({"argv": list(argv), "env": dict(os.environ), "cwd": os.getcwd()}).encode()
        socket.send_fds(conn, [_LENGTH.pack(len(payload)) + payload], [0, 1, 2])
    except OSError:
        conn.close()
        return None
    with conn:
        reply = b""
        while len(reply) < _EXIT.size:
            chunk = conn.recv(_EXIT.size - len(reply))
            if not chunk:
                return 1  # the bridge was killed, or the warm process refused
            reply += chunk
    return int(_EXIT.unpack(reply)[0])


# --- the warm process ----------------------------------------------------------------------------------


def serve(socket_path: str, entry: str = ENTRY) -> None:
    """Listen, import the bridges, then fork one per request until standard input closes. One thread
    throughout. The socket listens first: a request made while the imports run waits in its backlog."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)  # the run's ^C is for the run; it closes our stdin
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # forked bridges are reaped by the kernel

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        listener.bind(socket_path)
    finally:
        os.umask(old_umask)
    listener.listen(64)
    # What a bridge spends its start on, imported once here. The command line (``ale_iac.cli``) is loaded
    # by name, as ``python -m ale_iac`` loads it: this process is that command, started ahead of time.
    for module in ENTRIES[entry]:
        importlib.import_module(module)
    os.write(1, b"ready\n")
    try:
        while True:
            readable, _, _ = select.select([listener.fileno(), 0], [], [])
            if 0 in readable and not os.read(0, 4096):
                return  # the run closed our stdin, or is gone
            if listener.fileno() in readable:
                conn, _ = listener.accept()
                with conn:
                    _fork_bridge(listener, conn, entry)
    finally:
        _remove_folder(Path(socket_path))  # also when the run died without closing us


def _remove_folder(socket_path: Path) -> None:
    with contextlib.suppress(OSError):
        socket_path.unlink()
    with contextlib.suppress(OSError):
        socket_path.parent.rmdir()


def sweep_stale(root: Path | None = None, *, dry_run: bool = False) -> list[Path]:
    """Remove warm-bridge folders left by a run that was killed with its warm process: the run that made the
    folder (its pid is in the name) is gone and nothing answers on the socket; returns them. A live run's
    folder is never taken, also while its warm process is still starting (no socket yet): that run removes it
    itself. ``ale-iac gc`` calls it."""
    removed: list[Path] = []
    for folder in sorted(Path(root or tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*-*")):
        owner = folder.name[len(FOLDER_PREFIX) :].split("-", 1)[0]
        with contextlib.suppress(OSError):
            if not owner.isdigit() or procs.alive(int(owner)):
                continue
            if not folder.is_dir() or folder.is_symlink() or folder.lstat().st_uid != os.getuid():
                continue
            path = folder / SOCKET_NAME
            if _answers(path):
                continue
            if not dry_run:
                _remove_folder(path)  # the socket, then the folder (also one that never got its socket)
            removed.append(folder)
    return removed


def _answers(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def _peer_uid(conn: socket.socket) -> int:
    _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return int(uid)


def _fork_bridge(listener: socket.socket, conn: socket.socket, entry: str) -> None:
    if _peer_uid(conn) != os.getuid():
        return
    try:
        message, fds, _flags, _address = socket.recv_fds(conn, MAX_REQUEST, 3)
        (length,) = _LENGTH.unpack_from(message)
        if length > MAX_REQUEST:
            raise ValueError("request too large")
        payload = message[_LENGTH.size :]
        while len(payload) < length:
            chunk = conn.recv(length - len(payload))
            if not chunk:
                raise ValueError("request cut short")
            payload += chunk
        request = json.loads(payload)
        argv = [str(a) for a in request["argv"]]
        if len(fds) != 3 or not is_bridge_request(entry, argv):
            raise ValueError("not a bridge request")
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return
    try:
        pid = os.fork()
    except OSError:
        pid = -1
    if pid == 0:
        listener.close()
        _run_bridge(conn, fds, argv, request, entry)  # never returns
    for fd in fds:
        os.close(fd)


def _run_bridge(conn: socket.socket, fds: list[int], argv: list[str], request: dict[str, Any], entry: str) -> None:
    """In the forked child: become ``python -m <entry> <argv>`` on the requester's stdio; report its exit
    code."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in dict(request["env"]).items()})
        os.environ.pop(WARM_ENV, None)
        with contextlib.suppress(OSError):
            os.chdir(str(request["cwd"]))
        threading.Thread(target=_die_with_forwarder, args=(conn,), daemon=True).start()
        sys.argv = ["ale-iac" if entry == ENTRY else f"python -m {entry}", *argv]
        try:
            runpy.run_module(entry, run_name="__main__", alter_sys=True)  # ``python -m <entry>``
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # whatever happens, the forwarder hears an exit code
        code = 1
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
        with contextlib.suppress(OSError):
            conn.sendall(_EXIT.pack(code))
        os._exit(code)


def _die_with_forwarder(conn: socket.socket) -> None:
    """The forwarder sends nothing after its request: a read returns only when it is gone."""
    with contextlib.suppress(OSError):
        while conn.recv(1):
            pass
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":  # python -m ale_iac.bridges.warm --entry ENTRY SOCKET
    serve(sys.argv[3], sys.argv[2])
