"""Bulk transport: staging a host folder into a unit and pulling one back, by the fastest way the unit offers.

A handle says which transport its unit offers (``UnitOutputs.transport``):

* ``http``, every endpoint: the computer-server's file commands, one base64 request per file
  (``ale_iac.runner.tasks.upload_dir`` / ``download_dir``, passed in as ``fallback``);
* ``docker``, a unit container on the local engine: one streamed tar through the engine's archive API
  (``put_archive`` / ``get_archive`` on ``container_id``), for paths on the unit's volumes
  (``ale_iac.substrates.docker.runtime.archive_reaches``); any other path falls back to ``http``.

Both give the same result: files byte-exact, root-owned, parents made; only regular files come back, never
written outside the host folder.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from ale_iac.contract import UnitOutputs
from ale_iac.sandbox.client import ComputerServerClient

UploadFn = Callable[[ComputerServerClient, Path, str], Awaitable[int]]
DownloadFn = Callable[[ComputerServerClient, str, Path], Awaitable[int]]


def transport_for(handle: UnitOutputs, remote: str) -> str:
    """The transport that moves files to or from ``remote`` of ``handle``'s unit: ``docker`` or ``http``."""
    if handle.transport == "docker" and handle.container_id:
        from ale_iac.substrates.docker.runtime import archive_reaches

        if archive_reaches(remote):
            return "docker"
    return "http"


async def upload_dir(
    handle: UnitOutputs, client: ComputerServerClient, local: Path, remote: str, fallback: UploadFn
) -> int:
    """Copy a host folder into ``remote`` of the unit; returns the number of files."""
    if transport_for(handle, remote) == "docker":
        from ale_iac.substrates.docker.runtime import copy_in

        assert handle.container_id is not None
        return await asyncio.to_thread(copy_in, handle.container_id, local, remote)
    return await fallback(client, local, remote)


async def download_dir(
    handle: UnitOutputs, client: ComputerServerClient, remote: str, local: Path, fallback: DownloadFn
) -> int:
    """Copy ``remote`` of the unit (regular files) into a host folder; returns the number of files."""
    if transport_for(handle, remote) == "docker":
        from ale_iac.substrates.docker.runtime import copy_out

        assert handle.container_id is not None
        return await asyncio.to_thread(copy_out, handle.container_id, remote, local)
    return await fallback(client, remote, local)
