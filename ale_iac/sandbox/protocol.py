"""What the computer-server answers, as this client's types: the errors it raises (one line naming the endpoint,
the command and the server's message) and the results of its commands."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ale_iac.errors import AleIacError, squash

SUPPORTED_SERVERS: Final = "cua-computer-server 0.3.x with protocol 1 (images ship 0.3.46)"


class ComputerServerError(AleIacError):
    """The computer-server refused or failed a command. ``message`` is the server's own text, on one line."""

    def __init__(self, endpoint: str, command: str, message: str) -> None:
        self.endpoint = endpoint
        self.command = command
        self.message = squash(message)
        super().__init__(self._summary())

    def _summary(self) -> str:
        return f"computer-server {self.endpoint}: {self.command} failed: {self.message}"


class ServerUnreachableError(ComputerServerError):
    """The request did not complete at the transport level (refused, reset, timed out)."""

    def _summary(self) -> str:
        return f"computer-server {self.endpoint} unreachable during {self.command}: {self.message}"


class UnsupportedServerError(ComputerServerError):
    """The server runs a version this client was not written and tested for."""

    def __init__(self, endpoint: str, version: ServerVersion, reason: str = "") -> None:
        detail = f"version {version.package} (protocol {version.protocol}) is not supported"
        if reason:
            detail += f": {reason}"
        super().__init__(endpoint, "version", f"{detail}; supported: {SUPPORTED_SERVERS}")
        self.version = version


@dataclass(frozen=True, slots=True)
class ServerVersion:
    package: str
    protocol: int


@dataclass(frozen=True, slots=True)
class CommandResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False


@dataclass(frozen=True, slots=True)
class PtyOutput:
    data: bytes
    """Output since the previous read (at most ``max_bytes``)."""
    exited: bool
    """The process has exited and everything it wrote has been read."""
    exit_code: int | None
    dropped: int = 0
    """Bytes dropped before this read because the buffer overflowed."""
