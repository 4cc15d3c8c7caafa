"""A unit's way out under an egress policy: its own proxy process on this host, reached from inside the unit
only through the unit's endpoint.

Inside the unit, the forwarder serves ``127.0.0.1:``:data:`~ale_iac.substrates.authproxy.EGRESS_PORT` (what
``HTTP_PROXY`` and ``HTTPS_PROXY`` point at there). Each connection made to it is paired with an idle
connection this host opened to the endpoint's reserved path :data:`~ale_iac.substrates.authproxy.EGRESS_PATH`
with the unit's token: the model channel's mechanism (:class:`~ale_iac.substrates.channel.ModelChannel`) with
another path, carried to this unit's proxy (:mod:`ale_iac.substrates.egress_proxy`) instead of the gateway.
The unit itself has no route and no DNS: the proxy resolves names and connects.

:class:`UnitEgress` is one unit's: the proxy process, its folder and the channel. Its folder
(``<home>/egress/<id>/``, 0700) holds the policy, the proxy's Unix socket (0600), the attempts log and
``owner.json`` (this process and the proxy, each a pid and start time), so ``ale-iac gc`` finds a proxy whose
runner died (:func:`leftovers`, :func:`sweep`). The proxy also gets SIGKILL when its runner dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ale_iac import procs
from ale_iac.egress_policy import EgressPolicy
from ale_iac.errors import AleIacError
from ale_iac.files import unix_address
from ale_iac.paths import ale_home
from ale_iac.substrates import authproxy
from ale_iac.substrates.channel import ModelChannel
from ale_iac.substrates.relay import unix_connector

START_TIMEOUT_S: Final = 20.0
STOP_TIMEOUT_S: Final = 5.0
PROXY_MODULE: Final = "ale_iac.substrates.egress_proxy"
IN_UNIT_PROXY: Final = f"http://127.0.0.1:{authproxy.EGRESS_PORT}"
"""``HTTP_PROXY`` / ``HTTPS_PROXY`` inside a unit that has an egress policy."""
NO_PROXY: Final = "127.0.0.1,localhost"
"""Not through the proxy: the unit's loopback (its computer-server, the model channel's port)."""
PROXY_ENV: Final = {
    **{name: IN_UNIT_PROXY for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")},
    **{name: NO_PROXY for name in ("NO_PROXY", "no_proxy")},
}
"""The environment of every command the runner starts in a unit that has an egress policy
(``SandboxHandle.command_env``): tools that honour the usual variables (curl, pip, urllib, httpx, requests)
reach the unit's proxy with no flag of their own."""


class EgressError(AleIacError):
    """The unit's egress proxy did not start (or its channel was refused)."""


def egress_root() -> Path:
    return ale_home() / "egress"


@dataclass(frozen=True)
class Attempt:
    """One connection the unit tried through its proxy (a line of the proxy's log)."""

    time: float
    host: str
    port: int
    method: str
    allowed: bool
    reason: str
    address: str | None
    bytes_out: int
    bytes_in: int

    @classmethod
    def of(cls, entry: dict[str, Any]) -> Attempt:
        fields: dict[str, Any] = {name: entry.get(name) for name in cls.__dataclass_fields__}
        return cls(**fields)


def read_attempts(log: Path) -> list[Attempt]:
    """The attempts in a proxy's log; a line torn by a kill is skipped."""
    attempts: list[Attempt] = []
    if not log.exists():
        return attempts
    for line in log.read_text(encoding="utf-8").splitlines():
        try:
            attempts.append(Attempt.of(json.loads(line)))
        except (ValueError, TypeError):
            continue
    return attempts


def summarize(attempts: list[Attempt]) -> dict[str, Any]:
    """What ``run.json`` keeps of a unit's attempts: counts, bytes, the refused destinations."""
    refused = sorted({f"{a.host}:{a.port}" for a in attempts if not a.allowed})
    return {
        "attempts": len(attempts),
        "allowed": sum(a.allowed for a in attempts),
        "refused": len(attempts) - sum(a.allowed for a in attempts),
        "bytes_out": sum(a.bytes_out for a in attempts),
        "bytes_in": sum(a.bytes_in for a in attempts),
        "refused_destinations": refused,
    }


class UnitEgress:
    """One unit's egress: ``await start()``, then ``await stop()`` (which returns its attempts)."""

    def __init__(self, endpoint: str, token: str, policy: EgressPolicy, *, root: Path | None = None) -> None:
        self.endpoint = endpoint
        self._token = token
        self.policy = policy
        self.folder = (root or egress_root()) / secrets.token_hex(6)
        self.socket = self.folder / "proxy.sock"
        self.log = self.folder / "attempts.jsonl"
        self.proc: subprocess.Popen[bytes] | None = None
        self.channel: ModelChannel | None = None
        self.channel_bytes = (0, 0)
        """Bytes the unit sent and received through its egress channel, all connections (a CONNECT tunnel's
        included, which the proxy's log counts only one way); set by :meth:`stop`."""

    async def start(self) -> None:
        """Start the proxy (ready when its socket answers), then open the channel; on failure nothing is left."""
        try:
            self._start_proxy()  # in this thread: the proxy's death signal follows the thread that forked it
            await asyncio.to_thread(self._wait_ready)
            self.channel = ModelChannel(
                self.endpoint, self._token, unix_connector(str(self.socket)), path=authproxy.EGRESS_PATH
            )
            await self.channel.open()
        except BaseException:
            await self.stop()
            raise

    def _start_proxy(self) -> None:
        self.folder.mkdir(parents=True, mode=0o700)
        (self.folder / "policy.json").write_text(self.policy.model_dump_json())
        argv = [sys.executable, "-m", PROXY_MODULE, "--policy", str(self.folder / "policy.json")]
        argv += ["--socket", str(self.socket), "--log", str(self.log)]
        errors = open(self.folder / "proxy.err", "wb")  # noqa: SIM115  # the child keeps it
        with errors:
            self.proc = subprocess.Popen(
                procs.die_with_parent_argv(argv, os.getpid()),
                stdin=subprocess.DEVNULL,
                stdout=errors,
                stderr=errors,
                start_new_session=True,  # its own process group: proxy.py's acceptor is stopped with it
            )
        owner = {
            "runner": [os.getpid(), procs.start_time(os.getpid())],
            "proxy": [self.proc.pid, procs.start_time(self.proc.pid)],
        }
        (self.folder / "owner.json").write_text(json.dumps(owner))

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = (self.folder / "proxy.err").read_text(errors="replace")[-2000:]
                raise EgressError(f"the egress proxy exited with {self.proc.returncode}: {tail.strip()}")
            if self.socket.exists() and _answers(self.socket):
                return
            time.sleep(0.05)  # polling the socket's readiness: proxy.py signals nothing itself
        raise EgressError(f"the egress proxy did not listen within {START_TIMEOUT_S:.0f} s")

    async def stop(self) -> list[Attempt]:
        """Close the channel, stop the proxy (its whole group), read its log and remove its folder."""
        if self.channel is not None:
            await self.channel.aclose("the unit's egress ended")
            self.channel_bytes = (self.channel.bytes_up, self.channel.bytes_down)
        if self.proc is not None:
            _kill_group(self.proc.pid, procs.start_time(self.proc.pid))
            self.proc.wait()
        attempts = read_attempts(self.log)
        shutil.rmtree(self.folder, ignore_errors=True)
        return attempts

    def attempts(self) -> list[Attempt]:
        return read_attempts(self.log)


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as probe, unix_address(str(path)) as address:
        try:
            probe.connect(address)
        except OSError:
            return False
    return True


def _kill_group(pid: int, started: float | None) -> None:
    """Stop the proxy (pid ``pid`` started at ``started``: SIGTERM, then SIGKILL) and what is left of its
    process group (proxy.py's acceptor, which outlives a proxy killed first)."""
    if started is not None and procs.is_running(pid, started):
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            if procs.wait_gone(pid, started, STOP_TIMEOUT_S):
                break
    for member in _group_members(pid):
        started_member = procs.start_time(member)
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)
        procs.wait_gone(member, started_member, STOP_TIMEOUT_S)


def _group_members(pgid: int) -> list[int]:
    """Processes of the group ``pgid`` that run the egress proxy (a group's id outlives its leader while it
    has members; the command line guards against a reused id all the same)."""
    found = []
    for pid in procs.all_pids():
        with contextlib.suppress(OSError):
            if procs.group(pid) == pgid and PROXY_MODULE in procs.argv(pid):
                found.append(pid)
    return found


def leftovers(root: Path | None = None) -> list[Path]:
    """Egress folders whose runner is gone (what ``ale-iac gc`` sweeps)."""
    found = []
    base = root or egress_root()
    for folder in sorted(base.glob("*")) if base.is_dir() else []:
        try:
            owner = json.loads((folder / "owner.json").read_text())
        except (OSError, ValueError):
            found.append(folder)
            continue
        runner_pid, runner_started = owner["runner"]
        if not procs.is_running(runner_pid, runner_started):
            found.append(folder)
    return found


def sweep(folder: Path) -> None:
    """Stop a leftover egress proxy (by its recorded pid and start time) and remove its folder."""
    try:
        pid, started = json.loads((folder / "owner.json").read_text())["proxy"]
    except (OSError, ValueError, KeyError):
        pid, started = None, None
    if pid is not None:
        _kill_group(int(pid), started)
    shutil.rmtree(folder, ignore_errors=True)
