"""Readiness: is the computer-server behind a handle able to do real work yet?

A monotonic deadline; poll ``GET /status`` until it answers; check the server version
is one we support; then one real command and one screenshot, because a server can answer /status
while its display or shell is still broken. On timeout the error names the endpoint and the last
error seen, which is what someone debugging a stuck sandbox needs first.

How often to ask: :func:`poll_interval`, a pause in proportion to the time already waited. A unit that
answers after a second (a local sandbox) is seen within 50 ms of it, one that takes a minute to boot
(a cloud VM) is asked about once a second, and no unit is seen more than a twentieth of its boot late.
An attempt fails at once when the unit's forwarder drops the connection (the server does not listen yet):
with the client's own retries (after 0.1 s, then 0.4 s) and a pause doubling from 50 ms, a booting local
sandbox was asked at about 0, 0.1, 0.5, 0.55, 0.65, 1.05, 1.15, 1.25, 1.65 and 1.85 s, half a second apart
at worst (``bench/bench_reset.py`` runs that schedule beside this one).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from ale_iac.errors import AleIacError
from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.substrates import registry


class SandboxNotReadyError(AleIacError):
    """The sandbox did not become ready before its deadline."""


MIN_POLL_S = 0.05
MAX_POLL_S = 1.0
POLL_FRACTION = 1 / 20
"""The pause between two attempts as a fraction of the time waited so far (within the two bounds)."""


def poll_interval(waited_s: float) -> float:
    """The pause before the next attempt after ``waited_s`` of waiting: ``waited_s / 20``, 50 ms to 1 s."""
    return min(MAX_POLL_S, max(MIN_POLL_S, waited_s * POLL_FRACTION))


PollSchedule = Callable[[float], float]
"""Seconds waited so far -> the pause before the next attempt."""


@dataclass(frozen=True)
class ReadyReport:
    endpoint: str
    seconds: float
    server_version: str
    attempts: int


async def wait_ready(
    handle: SandboxHandle, timeout_s: float, *, schedule: PollSchedule = poll_interval, request_tries: int = 1
) -> ReadyReport:
    """Wait until ``handle``'s server runs a command and takes a screenshot, or raise.

    An attempt fails at its first broken connection (``request_tries``: the client's own retries, 0.5 s of
    pauses, would hide the moment the server comes up); ``schedule`` says when the next attempt starts."""
    from ale_iac.sandbox.client import ComputerServerClient
    from ale_iac.sandbox.protocol import UnsupportedServerError

    start = time.monotonic()
    deadline = start + timeout_s
    last_error = "no attempt made"
    attempts = 0
    async with ComputerServerClient(
        handle.endpoint, timeout=10.0, token=handle.token(), request_tries=request_tries
    ) as client:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            attempts += 1
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 a wait_for whose call completes as the task is
                # cancelled drops the cancel (gh-86296), and an interrupted run's unit went on probing.
                async with asyncio.timeout(min(5.0, remaining)):
                    await client.status()
                async with asyncio.timeout(min(10.0, remaining)):
                    version = await client.check_version()
                async with asyncio.timeout(min(20.0, remaining)):
                    result = await client.run_command("echo ale-ready")
                if result.exit_code != 0 or "ale-ready" not in result.stdout:
                    raise AleIacError(f"probe command failed: exit {result.exit_code}, stderr {result.stderr!r}")
                async with asyncio.timeout(min(30.0, remaining)):
                    png = await client.screenshot()
                if not png.startswith(b"\x89PNG"):
                    raise AleIacError("probe screenshot is not a PNG")
                return ReadyReport(
                    endpoint=handle.endpoint,
                    seconds=time.monotonic() - start,
                    server_version=version.package,
                    attempts=attempts,
                )
            except UnsupportedServerError:
                raise
            except (AleIacError, OSError, TimeoutError, httpx.HTTPError) as exc:
                last_error = f"{type(exc).__name__}: {exc}".strip()
            now = time.monotonic()
            await asyncio.sleep(min(schedule(now - start), max(0.0, deadline - now)))
    logs = sandbox_logs(handle)
    raise SandboxNotReadyError(
        f"sandbox {handle.stack + '/' if handle.stack else ''}{handle.unit} at {handle.endpoint} was not ready "
        f"after {timeout_s:.0f} s ({attempts} attempts); last error: {last_error}" + (f"\n{logs}" if logs else "")
    )


def sandbox_logs(handle: SandboxHandle) -> str:
    """The tails of the sandbox's own logs where this host has them (its substrate's): a not-ready sandbox
    usually says why in its server log."""
    substrate = registry.of_unit(handle)
    return substrate.log_tails(handle) if substrate is not None else ""
