"""What one user of a sandbox leaves that the next must not find: files, a process, the clipboard.

Used where a sandbox is handed from one user to the next: a checkpointed pool unit's reset
(``tests/substrates/local/test_checkpoint.py``) and units restored from one template slot one after another
(``test_templates.py``).
"""

from __future__ import annotations

import asyncio

from ale_iac.substrates.local.sandboxes import LocalSandboxState
from tests.support.sandbox import Endpoint, run

LEASE_MARKS = ("/root/lease-mark", "/tmp/lease-mark", "/var/tmp/lease-mark")
"""Files in the layer and in memory-backed folders."""


async def _clipboard(target: LocalSandboxState, text: str | None = None) -> str:
    async with Endpoint.of(target).client() as client:
        if text is not None:
            await client.set_clipboard(text)
        return await client.get_clipboard()


def leave_a_lease_behind(target: LocalSandboxState) -> None:
    """Files in the layer and in memory-backed folders, a process, the clipboard."""
    writes = " && ".join(f"echo lease > {mark}" for mark in LEASE_MARKS)
    assert run(target, f"{writes} && (setsid sleep 600 >/dev/null 2>&1 &) && echo ok")["stdout"] == "ok\n"
    assert asyncio.run(_clipboard(target, "lease-clipboard")) == "lease-clipboard"


def lease_traces(target: LocalSandboxState) -> list[str]:
    """Which of what ``leave_a_lease_behind`` leaves ``target`` has."""
    found = [mark for mark in LEASE_MARKS if run(target, f"test -e {mark} && echo here")["stdout"] == "here\n"]
    if run(target, "pgrep -x sleep >/dev/null && echo here")["stdout"] == "here\n":
        found.append("process")
    if asyncio.run(_clipboard(target)) == "lease-clipboard":
        found.append("clipboard")
    return found
