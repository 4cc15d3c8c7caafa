"""The GCE export itself (the archive's own disk.raw) booted under QEMU as GCE would boot it: SeaBIOS and the disk's
GRUB, virtio-scsi, a virtio-net NIC configured by DHCP, and a stand-in metadata server on 169.254.169.254 (QEMU's
``guestfwd``). The guest takes its endpoint token from there, its forwarder answers only with that token, and the
scripted agent solves a demo task through it end to end (``ale-iac evaluate`` on a static profile naming the
endpoint). One boot serves the module (a TCG boot takes minutes); the export is made on first need.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shlex
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ale_iac.images import ImageInfo
from ale_iac.runner.evaluation import run_experiment
from ale_iac.runner.experiment import load_experiment
from ale_iac.runner.status import UnitStatus
from ale_iac.sandbox.client import ComputerServerClient
from ale_iac.sandbox.protocol import CommandResult
from ale_iac.substrates.authproxy import MODEL_PORT
from ale_iac.substrates.channel import ModelChannel
from ale_iac.substrates.qemu import cloud, cloud_boot
from ale_iac.substrates.relay import unix_connector
from tests.support.channel import answering_socket

REPO = Path(__file__).resolve().parents[3]
BOOT_DEADLINE_S = 900.0
pytestmark = [pytest.mark.qemu, pytest.mark.timeout(1800), pytest.mark.xdist_group("qemu")]


class Booted:
    def __init__(self, guest: cloud_boot.CloudGuest, token: str, archive: Path, ready_s: float) -> None:
        self.guest, self.token, self.archive, self.ready_s = guest, token, archive, ready_s


@pytest.fixture(scope="module")
def booted(desktop_image: ImageInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Booted]:
    archive = cloud.ensure_cloud_export(desktop_image.name, "gce")
    disk_raw = cloud_boot.unpack_gce(archive, tmp_path_factory.mktemp("gce-unpacked"))
    token = secrets.token_urlsafe(32)
    guest = cloud_boot.boot(disk_raw, tmp_path_factory.mktemp("gce-guest") / "guest", {"ale-endpoint-token": token})
    try:
        ready_s = cloud_boot.wait_ready(guest, token, time.monotonic() + BOOT_DEADLINE_S)
        print(f"GCE artifact under QEMU: endpoint ready {ready_s} s after QEMU started")
        yield Booted(guest, token, archive, ready_s)
    finally:
        guest.stop()
        disk_raw.unlink(missing_ok=True)
    assert not guest.alive()


def test_the_archive_holds_one_sparse_disk_raw_in_gnu_tar(booted: Booted, tmp_path: Path) -> None:
    import gzip

    with gzip.open(booted.archive) as stream:
        header = stream.read(512)
    assert header[:9] == b"disk.raw\0" and header[257:265] == b"ustar  \0"  # oldgnu magic
    assert header[156:157] == b"S", "GNU sparse member"
    assert cloud.DISK_GB * 2**30 % 2**30 == 0  # GCE takes whole GiB disks


def test_the_forwarder_answers_only_with_the_token_from_the_metadata_server(booted: Booted) -> None:
    endpoint = booted.guest.endpoint
    assert httpx.get(f"{endpoint}/status", timeout=10).status_code == 401
    wrong = {"Authorization": f"Bearer {secrets.token_urlsafe(32)}"}
    assert httpx.get(f"{endpoint}/status", headers=wrong, timeout=10).status_code == 401
    right = {"Authorization": f"Bearer {booted.token}"}
    assert httpx.get(f"{endpoint}/status", headers=right, timeout=10).status_code == 200
    asked = [json.loads(line) for line in booted.guest.metadata_log.read_text().splitlines()]
    token_requests = [r for r in asked if r["path"].endswith("/attributes/ale-endpoint-token")]
    assert token_requests and all(r["flavor"] for r in token_requests)  # with Metadata-Flavor: Google
    assert token_requests[-1]["status"] == 200


def test_the_guest_booted_as_a_cloud_vm_and_keeps_the_token_out_of_its_logs(booted: Booted) -> None:
    async def ask(commands: list[str]) -> list[CommandResult]:
        async with ComputerServerClient(booted.guest.endpoint, token=booted.token) as client:
            return [await client.run_command(command) for command in commands]

    cmdline, root, address, leak = asyncio.run(
        ask(
            [
                "cat /proc/cmdline",
                "findmnt -n -o SOURCE /; ls /sys/bus/virtio/drivers",
                "ip -4 -o addr show scope global",
                f"grep -rlF '{booted.token}' /var/log /etc /root /tmp",
            ]
        )
    )
    assert "ale.identity=metadata" in cmdline.stdout and "BOOT_IMAGE" in cmdline.stdout  # GRUB booted it
    assert root.stdout.startswith("/dev/sda1") and "virtio_scsi" in root.stdout
    assert "169.254.169.15/24" in address.stdout  # from QEMU's DHCP server, by dhcpcd
    assert leak.exit_code == 1 and leak.stdout == ""
    assert booted.token not in booted.guest.serial_log.read_text(errors="replace")


def test_the_scripted_agent_solves_a_demo_task_through_it(
    booted: Booted, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ALE_TEST_GCE_TOKEN", booted.token)
    profile = tmp_path / "Pulumi.gce-under-qemu.yaml"
    route = {"provider": "static", "endpoints": [booted.guest.endpoint], "endpoint_token_env": "ALE_TEST_GCE_TOKEN"}
    profile.write_text(
        "config:\n  ale-iac:profile:\n    name: gce-under-qemu\n    ready_timeout_s: 300\n    snapshots:\n"
        f"      cpu-free-ubuntu: {json.dumps(route)}\n"
    )
    spec = {
        "name": "gce-demo",
        "agents": [str(REPO / "agents" / "scripted" / "preset.yaml")],
        "tasks": [str(REPO / "examples" / "tasks" / "cli-log-stats")],
        "profile": str(profile),
        "concurrency": 1,
        "unit_timeout_s": 900,
    }
    path = tmp_path / "exp.yaml"
    path.write_text(json.dumps(spec))

    summary = run_experiment(load_experiment(path))

    [outcome] = summary.outcomes
    assert outcome.status == UnitStatus.SUCCEEDED, outcome
    assert outcome.score == 1.0
    for record in summary.run_dir.rglob("*"):
        if record.is_file():
            assert booted.token not in record.read_text(errors="replace"), record


def test_the_reverse_model_channel_carries_a_call_from_the_guest_to_the_host(booted: Booted, tmp_path: Path) -> None:
    """The channel an in-sandbox agent's model calls take (``substrates/channel.py``): the host opens it to the
    endpoint with the token from the metadata; a connection to the guest's 127.0.0.1:4010 reaches the host."""
    probe = (
        "import socket\n"
        f"c = socket.create_connection(('127.0.0.1', {MODEL_PORT}), timeout=60)\n"
        "c.sendall(b'ping-from-the-cloud-guest'); c.shutdown(socket.SHUT_WR)\n"
        "print('got', c.recv(100).decode() or 'EOF')\n"
    )
    path = tmp_path / "model.sock"
    with answering_socket(path, b"pong-from-the-host") as received:

        async def carried() -> CommandResult:
            channel = ModelChannel(booted.guest.endpoint, booted.token, unix_connector(str(path)), pool=1)
            await channel.open()
            try:
                async with ComputerServerClient(booted.guest.endpoint, token=booted.token) as client:
                    return await client.run_command(f"/usr/bin/python3 -c {shlex.quote(probe)}", timeout=120)
            finally:
                await channel.aclose()

        assert asyncio.run(carried()).stdout.strip() == "got pong-from-the-host"
    assert received == [b"ping-from-the-cloud-guest"]
