"""Bulk transport: staging a host folder into a unit and pulling one back, by the fastest way the unit offers.

A handle says which transport its unit offers (``UnitOutputs.transport``):

* ``http``, every endpoint: the computer-server's file commands, one base64 request per file
  (``ale_iac.runner.tasks.upload_dir`` / ``download_dir``, passed in as ``fallback``);
* ``docker``, a unit container on the local engine: one streamed tar through the engine's archive API
  (``put_archive`` / ``get_archive`` on ``container_id``), for paths on the unit's volumes
  (``ale_iac.substrates.docker.runtime.archive_reaches``); any other path falls back to ``http``;
* ``qemu``, a unit guest on this host: its guest share (9p), a host folder copy plus one command in the
  guest (``ale_iac.substrates.qemu.share``), for any path; ``http`` when the share is not on this host.

Both give the same result: files byte-exact, root-owned, parents made; only regular files come back, never
written outside the host folder.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

from ale_iac.contract import UnitOutputs
from ale_iac.errors import AleIacError
from ale_iac.sandbox.client import ComputerServerClient

UploadFn = Callable[[ComputerServerClient, Path, str], Awaitable[int]]
DownloadFn = Callable[[ComputerServerClient, str, Path], Awaitable[int]]


def transport_for(handle: UnitOutputs, remote: str) -> str:
    """The transport that moves files to or from ``remote`` of ``handle``'s unit: ``docker``, ``qemu`` or
    ``http``."""
    if handle.transport == "qemu" and _qemu_share(handle) is not None:
        return "qemu"
    if handle.transport == "docker" and handle.container_id:
        from ale_iac.substrates.docker.runtime import archive_reaches

        if archive_reaches(remote):
            return "docker"
    return "http"


def _qemu_share(handle: UnitOutputs) -> Path | None:
    from ale_iac.substrates.qemu.runtime import share_dir

    try:
        share = share_dir(handle.resource_id)
    except AleIacError:  # not a qemu unit id of this host
        return None
    return share if share.is_dir() else None


async def _qemu_upload(handle: UnitOutputs, client: ComputerServerClient, local: Path, remote: str) -> int:
    from ale_iac.substrates.qemu import share as guest_share

    share = _qemu_share(handle)
    assert share is not None
    host, guest = guest_share.new_transfer(share, "in")
    try:
        count = await asyncio.to_thread(guest_share.put_tree, local, host)
        done = await client.run_command(guest_share.stage_command(guest, remote))
        if done.exit_code != 0:
            raise guest_share.ShareError(f"staging into {remote} through the guest share failed: {done.stderr.strip()}")
    finally:
        await asyncio.to_thread(shutil.rmtree, host, True)
    return count


async def _qemu_download(handle: UnitOutputs, client: ComputerServerClient, remote: str, local: Path) -> int:
    from ale_iac.substrates.qemu import share as guest_share

    share = _qemu_share(handle)
    assert share is not None
    host, guest = guest_share.new_transfer(share, "out")
    try:
        done = await client.run_command(guest_share.collect_command(remote, guest))
        if done.exit_code == guest_share.MISSING_EXIT:
            return 0
        if done.exit_code != 0:
            raise guest_share.ShareError(f"pulling {remote} through the guest share failed: {done.stderr.strip()}")
        return await asyncio.to_thread(guest_share.take_tree, host, local)
    finally:
        await asyncio.to_thread(shutil.rmtree, host, True)


async def upload_dir(
    handle: UnitOutputs, client: ComputerServerClient, local: Path, remote: str, fallback: UploadFn
) -> int:
    """Copy a host folder into ``remote`` of the unit; returns the number of files."""
    if transport_for(handle, remote) == "qemu":
        return await _qemu_upload(handle, client, local, remote)
    if transport_for(handle, remote) == "docker":
        from ale_iac.substrates.docker.runtime import copy_in

        assert handle.container_id is not None
        return await asyncio.to_thread(copy_in, handle.container_id, local, remote)
    return await fallback(client, local, remote)


async def download_dir(
    handle: UnitOutputs, client: ComputerServerClient, remote: str, local: Path, fallback: DownloadFn
) -> int:
    """Copy ``remote`` of the unit (regular files) into a host folder; returns the number of files."""
    if transport_for(handle, remote) == "qemu":
        return await _qemu_download(handle, client, remote, local)
    if transport_for(handle, remote) == "docker":
        from ale_iac.substrates.docker.runtime import copy_out

        assert handle.container_id is not None
        return await asyncio.to_thread(copy_out, handle.container_id, remote, local)
    return await fallback(client, remote, local)
