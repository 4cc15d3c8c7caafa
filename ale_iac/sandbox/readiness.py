"""Readiness: is the computer-server behind a handle able to do real work yet?

A monotonic deadline; poll ``GET /status`` until it answers; check the server version
is one we support; then one real command and one screenshot, because a server can answer /status
while its display or shell is still broken. On timeout the error names the endpoint and the last
error seen, which is what someone debugging a stuck sandbox needs first.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx

from ale_iac.errors import AleIacError
from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.substrates import registry


class SandboxNotReadyError(AleIacError):
    """The sandbox did not become ready before its deadline."""


@dataclass(frozen=True)
class ReadyReport:
    endpoint: str
    seconds: float
    server_version: str
    attempts: int


async def wait_ready(handle: SandboxHandle, timeout_s: float, *, min_poll_s: float = 0.05) -> ReadyReport:
    """Wait until ``handle``'s server runs a command and takes a screenshot, or raise."""
    from ale_iac.sandbox.client import ComputerServerClient
    from ale_iac.sandbox.protocol import UnsupportedServerError

    start = time.monotonic()
    deadline = start + timeout_s
    last_error = "no attempt made"
    attempts = 0
    poll = min_poll_s
    async with ComputerServerClient(handle.endpoint, timeout=10.0, token=handle.token()) as client:
        while True:
            attempts += 1
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                await asyncio.wait_for(client.status(), timeout=min(5.0, remaining))
                version = await asyncio.wait_for(client.check_version(), timeout=min(10.0, remaining))
                result = await asyncio.wait_for(client.run_command("echo ale-ready"), timeout=min(20.0, remaining))
                if result.exit_code != 0 or "ale-ready" not in result.stdout:
                    raise AleIacError(f"probe command failed: exit {result.exit_code}, stderr {result.stderr!r}")
                png = await asyncio.wait_for(client.screenshot(), timeout=min(30.0, remaining))
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
            await asyncio.sleep(min(poll, max(0.0, deadline - time.monotonic())))
            poll = min(poll * 2, 1.0)
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
