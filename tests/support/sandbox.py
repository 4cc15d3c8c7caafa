"""Talking to a real computer-server from a test: the endpoint, readiness, ``/cmd`` and ``run_command``.

The fixtures that start the sandboxes these helpers talk to are in ``tests/support/fixtures.py``.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ale_iac import procs
from ale_iac.contract import ENDPOINT_TOKEN_ENV, LINUX_DESKTOP_PATHS, HostChannel
from ale_iac.sandbox.client import ComputerServerClient
from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.substrates.local import sandboxes as local_sandboxes
from ale_iac.substrates.local.sandboxes import LocalSandboxState

READY_TIMEOUT_S = 90.0
POLL_INTERVAL_S = 0.05
"""Pause between two /status probes: keeps the loop from spinning on the 2 cores the server needs."""


class SandboxNotReadyError(AssertionError):
    pass


@dataclass(frozen=True)
class Endpoint:
    """A computer-server URL and the bearer token it requires (None for one that needs none)."""

    url: str
    token: str | None = None

    @classmethod
    def of(cls, state: LocalSandboxState) -> Endpoint:
        return cls(state.endpoint, local_sandboxes.auth_token(state))

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def client(self, **kwargs: Any) -> ComputerServerClient:
        return ComputerServerClient(self.url, token=self.token, **kwargs)

    def bridge_env(self) -> dict[str, str]:
        """What a bridge process needs in its environment to reach this endpoint."""
        return {ENDPOINT_TOKEN_ENV: self.token} if self.token else {}


Target = Endpoint | LocalSandboxState


def endpoint_of(target: Target) -> Endpoint:
    return target if isinstance(target, Endpoint) else Endpoint.of(target)


def wait_for_status(target: Target, timeout: float = READY_TIMEOUT_S) -> float:
    """Poll ``GET /status`` until it answers 200; returns the seconds waited.

    Raises with the endpoint, the last error seen and the sandbox's own log tails once the
    monotonic deadline passes.
    """
    endpoint = endpoint_of(target)
    started = time.monotonic()
    deadline = started + timeout
    last_error = "no attempt"
    with httpx.Client(timeout=httpx.Timeout(2.0), headers=endpoint.headers) as client:
        while True:
            try:
                response = client.get(f"{endpoint.url}/status")
                if response.status_code == 200:
                    return time.monotonic() - started
                last_error = f"HTTP {response.status_code}: {response.text[:200]}"
            except httpx.HTTPError as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            if time.monotonic() >= deadline:
                tails = local_sandboxes.log_tails(target) if isinstance(target, LocalSandboxState) else ""
                raise SandboxNotReadyError(
                    f"{endpoint.url}/status did not answer within {timeout:.0f} s; last error: {last_error}\n{tails}"
                )
            time.sleep(POLL_INTERVAL_S)


def cmd(
    target: Target, name: str, params: dict[str, Any] | None = None, *, http_timeout: float = 60.0
) -> dict[str, Any]:
    """One ``POST /cmd``; returns the decoded ``data: {json}`` reply."""
    endpoint = endpoint_of(target)
    response = httpx.post(
        f"{endpoint.url}/cmd",
        json={"command": name, "params": params or {}},
        timeout=http_timeout,
        headers=endpoint.headers,
    )
    response.raise_for_status()
    body = response.text.strip()
    assert body.startswith("data: "), f"unexpected reply framing: {body[:200]!r}"
    reply: dict[str, Any] = json.loads(body[len("data: ") :])
    return reply


def run(target: Target, command: str, *, http_timeout: float = 60.0) -> dict[str, Any]:
    """``run_command`` in the sandbox; returns stdout, stderr, return_code."""
    reply = cmd(target, "run_command", {"command": command}, http_timeout=http_timeout)
    assert "return_code" in reply, reply
    return reply


def sandbox_home(state: LocalSandboxState) -> Path:
    """The ale-iac home a sandbox was started in (its state dir is ``<home>/sandboxes/<id>``)."""
    return Path(state.state_dir).parent.parent


def new_sandbox_id(prefix: str = "test") -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


SandboxFactory = Callable[..., LocalSandboxState]
"""What the ``sandbox_factory`` fixture yields: ``make(wait=True, **spec_fields)``."""


def handle_of(state: LocalSandboxState) -> SandboxHandle:
    """The handle a stack would export for this local sandbox (the model channel included)."""
    channel = HostChannel(sandbox_url=state.gateway_url) if state.gateway_url else None
    return SandboxHandle(
        stack="-",
        unit=state.sandbox_id,
        provider="local",
        endpoint=state.endpoint,
        endpoint_token=local_sandboxes.auth_token(state),
        gateway_channel=channel,
        snapshot="desktop",
        image="desktop",
        resource_id=state.sandbox_id,
        paths=LINUX_DESKTOP_PATHS,
    )


# --- what a stopped local sandbox must not leave -----------------------------------------------------


def listening_addresses(port: int) -> list[str]:
    """Local addresses of LISTEN sockets on ``port`` in the host's network namespace."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, port_hex = fields[1].rsplit(":", 1)
            if int(port_hex, 16) == port and fields[3] == "0A":
                found.append(address)
    return found


def mounts_mentioning(text: str) -> list[str]:
    """Mount entries naming ``text`` in any process's mount namespace."""
    hits = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            mountinfo = Path(f"/proc/{entry}/mountinfo").read_text()
        except OSError:
            continue
        hits += [f"{entry}: {line}" for line in mountinfo.splitlines() if text in line]
    return hits


def processes_mentioning(text: str) -> list[str]:
    hits = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            hits.append(f"{entry}: {cmdline}")
    return hits


def assert_nothing_left(state: LocalSandboxState, pids: list[int]) -> None:
    alive = [pid for pid in pids if procs.start_time(pid) is not None]
    assert not alive, f"processes still running: {alive}"
    assert not processes_mentioning(state.sandbox_id)
    assert not mounts_mentioning(state.sandbox_id)
    assert not mounts_mentioning(state.state_dir)
    assert not Path(state.state_dir).exists()
    assert not listening_addresses(state.host_port), f"port {state.host_port} still forwarded"
    for cgroup in state.cgroups:
        assert not Path(cgroup).exists(), cgroup
    assert local_sandboxes.load_state(state.sandbox_id, home=sandbox_home(state)) is None
