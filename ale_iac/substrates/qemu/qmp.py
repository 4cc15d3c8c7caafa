"""A minimal QMP client (QEMU's JSON control protocol) over a unix socket, and the guest agent channel.

QMP: one greeting, ``qmp_capabilities``, then one JSON reply per command; asynchronous events may arrive
between them and are skipped. The agent channel (``agent.sock``, a virtio-serial port in the guest) carries
JSON lines: ``ale-guest-agent`` (``guest/``) writes ``waiting``/``ready``/``error`` events, the host writes
the unit's identity.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from ale_iac.errors import AleIacError


class QmpError(AleIacError):
    """QEMU refused a command, or its control socket went away."""


class _Lines:
    """JSON lines over a connected unix socket, with a deadline per read."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pending = b""

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(message).encode() + b"\n")

    def read(self, deadline: float, what: str) -> dict[str, Any]:
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {what} before the deadline")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                raise TimeoutError(f"no {what} before the deadline") from None
            if not chunk:
                raise QmpError(f"the connection closed while waiting for {what}")
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        message: dict[str, Any] = json.loads(line)
        return message

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


LISTEN_PATIENCE_S = 10.0
"""How long a refused connection is retried: QEMU makes a chardev's socket file at ``bind()`` and accepts only
after ``listen()``, so a caller that saw the file appear can still be refused for a moment (on a loaded host,
long enough to matter: it failed a CI run)."""


def _connect(path: Path, patience: float = LISTEN_PATIENCE_S) -> socket.socket:
    """A connection to the unix socket at ``path``, retried while it is refused for ``patience`` seconds (the
    window between QEMU's ``bind()`` and its ``listen()``). Any other error, or a refusal past that, raises."""
    deadline = time.monotonic() + patience
    while True:
        try:
            return _connect_once(path)
        except ConnectionRefusedError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.02)


def _connect_once(path: Path) -> socket.socket:
    """Connect through ``/proc/self/fd/N/<name>``: a unix socket path is limited to 107 bytes, and a unit
    folder under a deep ``ALE_IAC_HOME`` is longer than that."""
    folder = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(f"/proc/self/fd/{folder}/{path.name}")
    except OSError:
        sock.close()
        raise
    finally:
        os.close(folder)
    return sock


class Qmp:
    """One QMP session: ``with Qmp(path) as qmp: qmp.execute("query-status")``."""

    def __init__(self, path: Path, timeout: float = 30.0, patience: float = LISTEN_PATIENCE_S) -> None:
        self.timeout = timeout
        try:
            self.lines = _Lines(_connect(path, patience))
        except OSError as exc:
            raise QmpError(f"cannot reach QMP at {path}: {exc}") from None
        self.lines.read(time.monotonic() + timeout, "QMP greeting")
        self.execute("qmp_capabilities")

    def execute(self, command: str, **arguments: Any) -> Any:
        return self._execute(command, None, arguments)

    def execute_with_fd(self, command: str, fd: int, **arguments: Any) -> Any:
        """A command that takes a file descriptor (``getfd``), passed with it over the socket (SCM_RIGHTS)."""
        return self._execute(command, fd, arguments)

    def _execute(self, command: str, fd: int | None, arguments: dict[str, Any]) -> Any:
        message: dict[str, Any] = {"execute": command}
        if arguments:
            message["arguments"] = arguments
        if fd is None:
            self.lines.send(message)
        else:
            socket.send_fds(self.lines.sock, [json.dumps(message).encode() + b"\n"], [fd])
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self.lines.read(deadline, f"a reply to {command}")
            if "event" in reply:
                continue
            if "error" in reply:
                raise QmpError(f"QMP {command}: {reply['error'].get('desc', reply['error'])}")
            return reply.get("return")

    def close(self) -> None:
        self.lines.close()

    def __enter__(self) -> Qmp:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class AgentChannel:
    """The host end of the guest agent's virtio-serial port."""

    def __init__(self, path: Path, patience: float = LISTEN_PATIENCE_S) -> None:
        try:
            self.lines = _Lines(_connect(path, patience))
        except OSError as exc:
            raise QmpError(f"cannot reach the guest agent channel at {path}: {exc}") from None

    def send(self, message: dict[str, Any]) -> None:
        self.lines.send(message)

    def wait_for(self, event: str, deadline: float) -> dict[str, Any]:
        """The next ``event`` the agent writes (others skipped); an ``error`` event raises."""
        while True:
            message = self.lines.read(deadline, f"the guest agent's '{event}'")
            if message.get("event") == "error":
                raise QmpError(f"the guest agent failed: {message.get('detail')}")
            if message.get("event") == event:
                return message

    def close(self) -> None:
        self.lines.close()
