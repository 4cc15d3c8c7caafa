"""Bulk transport: staging a host folder into a unit and pulling one back, by the fastest way the unit offers.

Every endpoint moves files with the computer-server's file commands, one base64 request per file
(``ale_iac.runner.tasks.upload_dir`` / ``download_dir``, passed in as ``fallback``). A unit of a host substrate
with :attr:`~ale_iac.substrates.base.Capability.BULK_TRANSPORT` offers a faster way for the paths its transport
reaches (``docker``: one streamed tar through the engine's archive API, for paths on the unit's volumes;
``qemu``: the guest's 9p share, for any path); anything else falls back to the endpoint.

Both give the same result: files byte-exact, root-owned, parents made; only regular files come back, never
written outside the host folder.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from ale_iac.contract import UnitOutputs
from ale_iac.sandbox.client import ComputerServerClient
from ale_iac.substrates import registry
from ale_iac.substrates.base import BulkTransport

UploadFn = Callable[[ComputerServerClient, Path, str], Awaitable[int]]
DownloadFn = Callable[[ComputerServerClient, str, Path], Awaitable[int]]


def bulk_transport(handle: UnitOutputs, remote: str) -> BulkTransport | None:
    """The unit's bulk transport when it reaches ``remote`` from this host; None to use the endpoint."""
    substrate = registry.of_unit(handle)
    transport = substrate.transport if substrate is not None else None
    return transport if transport is not None and transport.reaches(handle, remote) else None


def transport_for(handle: UnitOutputs, remote: str) -> str:
    """The name of the way files move to or from ``remote``: the unit's substrate's, or ``http``."""
    return handle.transport if bulk_transport(handle, remote) is not None else "http"


async def upload_dir(
    handle: UnitOutputs, client: ComputerServerClient, local: Path, remote: str, fallback: UploadFn
) -> int:
    """Copy a host folder into ``remote`` of the unit; returns the number of files."""
    transport = bulk_transport(handle, remote)
    if transport is not None:
        return await transport.upload(handle, client, local, remote)
    return await fallback(client, local, remote)


async def download_dir(
    handle: UnitOutputs, client: ComputerServerClient, remote: str, local: Path, fallback: DownloadFn
) -> int:
    """Copy ``remote`` of the unit (regular files) into a host folder; returns the number of files."""
    transport = bulk_transport(handle, remote)
    if transport is not None:
        return await transport.download(handle, client, remote, local)
    return await fallback(client, remote, local)
