"""The GCE export itself (the archive's own disk.raw) booted under QEMU as GCE would boot it: SeaBIOS and the disk's
GRUB, virtio-scsi, a virtio-net NIC configured by DHCP, and a stand-in metadata server on 169.254.169.254 (QEMU's
``guestfwd``). The guest takes its endpoint token from there, its forwarder answers only with that token, and the
scripted agent solves a demo task through it end to end (``ale-iac evaluate`` on a static profile naming the
endpoint). The same endpoint declared an ale-iac forwarder (``forwarder: true``) gets a remote unit's two host
channels: the real Claude Code CLI runs in the guest (the ``sandbox`` executor) and reaches the scripted model
through the reverse model channel, and an egress policy on the route is carried to a proxy on this host through
the guest's 127.0.0.1:4011. One boot serves the module (a TCG boot takes minutes); the export is made on first need.
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
import yaml

from ale_iac.images import ImageInfo
from ale_iac.runner import evaluation
from ale_iac.runner.evaluation import run_experiment
from ale_iac.runner.experiment import load_experiment
from ale_iac.runner.status import UnitStatus
from ale_iac.sandbox.client import ComputerServerClient
from ale_iac.sandbox.protocol import CommandResult
from ale_iac.substrates.authproxy import MODEL_PORT
from ale_iac.substrates.channel import ModelChannel
from ale_iac.substrates.egress import IN_UNIT_PROXY
from ale_iac.substrates.qemu import cloud, cloud_boot
from ale_iac.substrates.relay import unix_connector
from tests.support.channel import answering_socket
from tests.support.fake_internet import fake_internet
from tests.support.runs import bridge_calls
from tests.support.tasks import TCG_TASK_TIMEOUT_S, make_preset, with_timeout

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
                f"grep -rlF -- '{booted.token}' /var/log /etc /root /tmp",
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
    _no_secret_in(summary.run_dir, booted.token)


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


def _static_profile(tmp_path: Path, booted: Booted, monkeypatch: pytest.MonkeyPatch, **extra: object) -> Path:
    """A static profile whose one route names the booted guest's endpoint, declared an ale-iac forwarder."""
    monkeypatch.setenv("ALE_TEST_GCE_TOKEN", booted.token)
    route = {
        "provider": "static",
        "endpoints": [booted.guest.endpoint],
        "endpoint_token_env": "ALE_TEST_GCE_TOKEN",
        "forwarder": True,
        **extra,
    }
    profile = tmp_path / "Pulumi.gce-forwarder.yaml"
    profile.write_text(
        "config:\n  ale-iac:profile:\n    name: gce-forwarder\n    ready_timeout_s: 300\n    snapshots:\n"
        f"      cpu-free-ubuntu: {json.dumps(route)}\n"
    )
    return profile


def _no_secret_in(run_dir: Path, *secrets_: str) -> None:
    for record in run_dir.rglob("*"):
        if record.is_file():
            data = record.read_bytes()
            for secret in secrets_:
                assert secret.encode() not in data, record


@pytest.mark.engine
@pytest.mark.agent_clis
def test_claude_code_solves_a_demo_task_in_the_guest_through_the_reverse_model_channel(
    booted: Booted, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shipped preset on its default executor (``sandbox``): its runtime, the CLI and the deployer staged in
    the guest at the profile's paths, the CLI's model calls carried from the guest's 127.0.0.1:4010 to the run's
    gateway (and on to the run's scripted model server) over connections this host opened to the endpoint; the
    CLI's own shell solves the task in the guest."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    started: list[evaluation.PlanServer] = []

    class Recorded(evaluation.PlanServer):
        def start(self) -> None:
            super().start()
            started.append(self)

    monkeypatch.setattr(evaluation, "PlanServer", Recorded)
    task = with_timeout(REPO / "examples" / "tasks" / "cli-log-stats", tmp_path)  # TCG: minutes to stage and start
    # The shipped plan without its screenshot: the channel is what this test is about (the qemu dry run of
    # tests/agents/test_cli_agents.py drives the cua bridge in a TCG guest).
    plan = yaml.safe_load((REPO / "examples" / "plans" / "cli-log-stats.yaml").read_text())
    turns = plan["scripts"][0]["turns"]
    plan["scripts"][0]["turns"] = [t for t in turns if t.get("tool") != "mcp:cua.screenshot"]
    assert len(plan["scripts"][0]["turns"]) == len(turns) - 1 == 2
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan))
    spec = {
        "name": "gce-claude-code",
        "agents": [str(REPO / "agents" / "claude_code" / "preset.yaml")],
        "tasks": [str(task)],
        "profile": str(_static_profile(tmp_path, booted, monkeypatch)),
        "model_plan": str(tmp_path / "plan.yaml"),
        "concurrency": 1,
        "unit_timeout_s": TCG_TASK_TIMEOUT_S,
        "output_root": str(tmp_path / "runs"),
    }
    path = tmp_path / "exp.yaml"
    path.write_text(json.dumps(spec))

    summary = run_experiment(load_experiment(path))

    [outcome] = summary.outcomes
    unit = summary.run_dir / outcome.unit_id
    logs = {p.name: p.read_text(errors="replace")[-3000:] for p in (unit / "agent").rglob("*.log")}
    assert outcome.status == UnitStatus.SUCCEEDED, (outcome, (unit / "events.jsonl").read_text(), logs)
    assert outcome.score == 1.0
    trajectory = json.loads((unit / "trajectory.json").read_text())
    [shell] = bridge_calls(trajectory)
    assert "written" in shell[1] and not shell[2], shell  # its own shell in the guest did the work
    usage = json.loads((unit / "model_usage.json").read_text())  # the gateway's count: both calls came through
    assert (usage["requests"], usage["errors"], usage["refused"]) == (2, 0, 0), usage
    [server] = started
    _no_secret_in(summary.run_dir, booted.token, server.key)


FETCH = f"""
import sys, urllib.error, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({{"http": {IN_UNIT_PROXY!r}}}))
for url in sys.argv[1:]:
    try:
        with opener.open(url, timeout=60) as reply:
            print(url, reply.status, reply.read().decode().strip())
    except urllib.error.HTTPError as refused:
        print(url, refused.code)
"""
FETCH_TASK = """
import base64

async def setup(sandbox):
    script = base64.b64encode(FETCH.encode()).decode()
    command = f"python3 -c \\"import base64; exec(base64.b64decode('{script}'))\\" {' '.join(URLS)}"
    result = await sandbox.run(command, timeout=300)
    fetched = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    if not fetched.get(URLS[0], "").startswith("200 hello from") or fetched.get(URLS[1]) != "403":
        raise RuntimeError(f"fetched {fetched!r}; stderr {result.stderr!r}")


async def evaluate(sandbox):
    return 1.0
"""


@pytest.mark.engine
def test_an_egress_policy_on_the_static_route_is_carried_through_the_guest_s_endpoint(
    booted: Booted, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The route's policy, loaded with the experiment (no longer refused for a remote unit), opened by the runner
    through the endpoint as for qemu: from inside the guest, 127.0.0.1:4011 reaches an allowed host of the fake
    internet (a namespace on this host, where the unit's proxy runs) and is refused a denied one (the task's setup
    checks both from inside, and fails otherwise); both attempts are in the unit's record."""
    (tmp_path / "fake-internet").mkdir()
    with fake_internet(["allowed.test", "other.test"], tmp_path / "fake-internet") as internet:
        urls = ["http://allowed.test/", "http://other.test/"]
        task = tmp_path / "fetch-both"
        (task / "input").mkdir(parents=True)
        (task / "reference").mkdir()
        (task / "task.yaml").write_text("id: fetch-both\ninstruction: Nothing to do.\n")
        (task / "main.py").write_text(f"FETCH = {FETCH!r}\nURLS = {urls!r}\n{FETCH_TASK}")
        make_preset(tmp_path, "writer", "WriterAgent")
        policy = {"allow": ["allowed.test"], "resolver": internet.dns}
        spec = {
            "name": "gce-egress",
            "agents": ["writer.yaml"],
            "tasks": ["fetch-both"],
            "profile": str(_static_profile(tmp_path, booted, monkeypatch, egress=policy)),
            "concurrency": 1,
            "unit_timeout_s": 900,
            "output_root": str(tmp_path / "runs"),
        }
        (tmp_path / "exp.yaml").write_text(json.dumps(spec))
        summary = run_experiment(load_experiment(tmp_path / "exp.yaml"))

    [outcome] = summary.outcomes
    unit = summary.run_dir / outcome.unit_id
    assert outcome.status == UnitStatus.SUCCEEDED, (outcome, (unit / "events.jsonl").read_text())
    attempts = [json.loads(line) for line in (unit / "egress.jsonl").read_text().splitlines()]
    assert [(a["host"], a["allowed"]) for a in attempts] == [("allowed.test", True), ("other.test", False)]
    assert "no allow entry matches the name" in attempts[1]["reason"]
    run = json.loads((unit / "run.json").read_text())
    assert run["egress"]["policy"] == "proxy: allow allowed.test; ports 80, 443"
    assert (run["egress"]["allowed"], run["egress"]["refused"]) == (1, 1)
    _no_secret_in(summary.run_dir, booted.token)
