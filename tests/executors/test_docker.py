"""The ``docker`` executor on a real Docker engine: the deployer runs in a container of the desktop
image that sees only its work dir and read-only mounts, reaches nothing but the two relays, gets its
secrets without them landing on disk or in the container's configuration, and is gone whichever way
the run ends (done, deadline, cancel, crash); what a killed runner leaves, ``gc`` removes.

The sandbox here is a small HTTP server on the host's loopback standing in for a computer-server
(it checks the bearer token), and the model gateway a Unix socket server checking the unit's token.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from ale_iac.agent_sdk import AgentConfig, AgentRunResult, CliInstall, ModelGrant, load_deployer_class
from ale_iac.bridges.warm import WARM_ENV
from ale_iac.contract import ENDPOINT_TOKEN_ENV, ENDPOINT_TOKEN_FILE_ENV
from ale_iac.docker_engine import client as docker_client
from ale_iac.executors import docker as docker_executor
from ale_iac.executors.docker import DockerExecutor
from ale_iac.llm.gateway import ModelGateway
from ale_iac.llm.plan import Plan
from ale_iac.llm.scripted import ScriptedModelServer
from ale_iac.paths import cache_root, home_id
from ale_iac.runner.gc import GcReport, collect_containers
from ale_iac.runner.records import Redactor
from ale_iac.sandbox.handle import SandboxHandle

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
PRESET = Path(__file__).parent / "presets" / "docker_probe"
EXIT_MARKER = "docker-probe: exiting without a result"


def probe_config(**settings: Any) -> AgentConfig:
    data = yaml.safe_load((PRESET / "preset.yaml").read_text())
    return AgentConfig.model_validate({**data, "settings": settings, "source_dir": str(PRESET)})


def our_containers() -> list[str]:
    """Names of every container (running or not) this test's ale-iac home made."""
    client = docker_client()
    try:
        return [c.name or "" for c in client.containers.list(all=True, filters={"label": f"ale-iac.home={home_id()}"})]
    finally:
        client.close()


class FakeSandbox:
    """A computer-server stand-in on 127.0.0.1: answers ``/probe`` (after an optional hook, run while the
    container is up), holds ``/block`` open, and refuses a request without the bearer token."""

    def __init__(self, token: str, on_probe: Callable[[], Awaitable[None]] | None = None) -> None:
        self.token = token
        self.on_probe = on_probe
        self.requests: list[tuple[str, bool]] = []
        self.blocked = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode()
            path = head.split(" ", 2)[1]
            headers = {
                k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head.split("\r\n")[1:])
            }
            authorized = headers.get("authorization") == f"Bearer {self.token}"
            self.requests.append((path, authorized))
            if not authorized:
                writer.write(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            elif path == "/block":
                self.blocked.set()
                await reader.read()  # until the other end goes away
                return
            else:
                if self.on_probe is not None:
                    await self.on_probe()
                body = b"sandbox says hi"
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
                )
            await writer.drain()
        finally:
            writer.close()


def make_executor(
    endpoint: str,
    token: str,
    work_dir: Path,
    *,
    env: dict[str, str] | None = None,
    model: ModelGrant | None = None,
    clis: dict[str, CliInstall] | None = None,
    **settings: Any,
) -> DockerExecutor:
    work_dir.mkdir(parents=True, exist_ok=True)
    env = env or {}
    handle = SandboxHandle.for_endpoint(endpoint, token=token).model_copy(
        update={"labels": {"run": "test-run", "unit": "u-docker"}}
    )
    return DockerExecutor(
        config=probe_config(**settings),
        sandbox=handle,
        work_dir=work_dir,
        env=env,
        redact=Redactor([*env.values(), token]),
        model=model,
        clis=clis,
    )


async def run_probe(executor: DockerExecutor, prompt: str, timeout_s: float) -> AgentRunResult:
    deployer = load_deployer_class(executor.config)(executor)
    return await executor.run_deployer(deployer, prompt, timeout_s)


def host_address() -> str:
    """A non-loopback address of this host (the one its default route uses)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet is sent for a UDP connect
        return str(probe.getsockname()[0])


@pytest.fixture
def host_listener() -> Iterator[int]:
    """A TCP port listening on every host address: the container must reach it on none."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", 0))
    listener.listen(8)
    try:
        yield int(listener.getsockname()[1])
    finally:
        listener.close()


def files_under(root: Path) -> Iterator[Path]:
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            yield path


def test_the_container_sees_only_its_work_dir_and_reaches_only_the_relays(  # noqa: PLR0915 (one run, its facts in order)
    docker_image: str, tmp_path: Path, host_listener: int
) -> None:
    api_key = "sk-docker-" + secrets.token_hex(16)
    endpoint_token = "tok-" + secrets.token_hex(16)
    model_key = "sk-model-" + secrets.token_hex(16)
    plan = Plan.model_validate({"scripts": [{"match": "probe", "turns": [{"text": "model says hi"}]}]})
    upstream = ScriptedModelServer(plan, api_key=model_key)
    gateway = ModelGateway()
    work = tmp_path / "unit" / "agent"
    cli_root = tmp_path / "clis" / "fakecli"
    (cli_root / "bin").mkdir(parents=True)
    (cli_root / "bin" / "fakecli").write_text("#!/bin/sh\necho fake\n")
    inspected: list[dict[str, Any]] = []

    async def inspect_while_running() -> None:
        client = docker_client()
        try:
            for container in client.containers.list(filters={"label": f"ale-iac.home={home_id()}"}):
                inspected.append(container.attrs)
        finally:
            client.close()

    sockets: list[Path] = []
    tokens: list[str] = []

    async def main() -> tuple[AgentRunResult, DockerExecutor, FakeSandbox]:
        grant = gateway.grant("u-docker", api="anthropic", upstream_base_url=upstream.base_url, api_key=model_key)
        tokens.append(grant.token)

        def attach_unix(path: Path) -> None:
            sockets.append(path)
            grant.attach_unix(path)

        model = ModelGrant(
            api="anthropic", model="probe-model", token=grant.token, tcp_root=gateway.tcp_root, attach_unix=attach_unix
        )
        sandbox = FakeSandbox(endpoint_token, on_probe=inspect_while_running)
        endpoint = await sandbox.start()
        executor = make_executor(
            endpoint,
            endpoint_token,
            work,
            env={"ALE_TEST_API_KEY": api_key},
            model=model,
            clis={"fakecli": CliInstall("fakecli", "1.0", cli_root, "bin/fakecli", ("bin/fakecli",))},
            targets=[
                ["127.0.0.1", host_listener],
                [host_address(), host_listener],
                ["127.0.0.1", int(endpoint.rsplit(":", 1)[1])],
            ],
            host_paths=[str(REPO), str(work), str(tmp_path), os.environ["ALE_IAC_HOME"], "/var/run/docker.sock"],
            cli_names=["fakecli"],
        )
        try:
            return await run_probe(executor, "look around", 120), executor, sandbox
        finally:
            await sandbox.close()

    with upstream, gateway:
        result, executor, sandbox = asyncio.run(main())
        usage = gateway.usage("u-docker")
        served = upstream.requests
    log = (work / "container.log").read_text() if (work / "container.log").exists() else "(no container.log)"
    assert result.status == "completed", (result, log)
    report = json.loads((work / "probe.json").read_text())

    assert report["kind"] == "docker" and report["native_shell"] is False
    assert report["prompt"] == "look around" and report["cwd"] == "/work"
    assert (work / "install.log").read_text() == "kind=docker\n"
    # Hardened: no capability, no new privileges.
    assert int(report["cap_eff"], 16) == 0 and report["no_new_privs"] == "1"

    # Mounts: /work read-write; the bundle, the preset and the CLI read-only; the rest is the image
    # (read-only), tmpfs, or the engine's own (/proc, /dev, /sys, /etc/hosts...).
    mounts = {m["point"]: m for m in report["mounts"]}
    engine_own = (
        "/proc",
        "/dev",
        "/sys",
        "/etc/hosts",
        "/etc/hostname",
        "/etc/resolv.conf",
        "/sbin/docker-init",
        "/usr/sbin/docker-init",
    )
    ours = {p for p in mounts if not p.startswith(engine_own)}
    assert ours == {
        "/",
        "/work",
        "/tmp",
        "/root",
        "/run/ale-iac",
        "/opt/ale-iac/runtime/src",
        "/opt/ale-iac/runtime/site",
        "/opt/ale-iac/preset",
        "/opt/ale-iac/clis/fakecli",
    }, sorted(ours)
    for point in ("/", "/opt/ale-iac/runtime/src", "/opt/ale-iac/runtime/site", "/opt/ale-iac/preset"):
        assert "ro" in mounts[point]["options"].split(","), mounts[point]
    assert "ro" in mounts["/opt/ale-iac/clis/fakecli"]["options"].split(",")
    assert mounts["/tmp"]["fstype"] == "tmpfs" and mounts["/root"]["fstype"] == "tmpfs"
    writes = report["writes"]
    assert writes["/work/probe-write.txt"] == writes["/tmp/probe-write.txt"] == writes["/root/probe-write.txt"] == "ok"
    for path in ("/probe-write.txt", "/usr/probe-write.txt", "/opt/ale-iac/runtime/src/probe-write.txt"):
        assert writes[path].startswith("OSError: Read-only file system"), (path, writes[path])
    assert writes["/opt/ale-iac/preset/probe-write.txt"].startswith("OSError: Read-only file system")
    # No host path is there (the repo, the work dir's host path, the home, the engine's socket).
    assert not any(report["host_paths"].values()), report["host_paths"]

    # Network: loopback only; the host's ports (loopback, its own address, the sandbox's real port) are
    # out of reach; the sandbox answers through the relay, and only with its token.
    assert report["interfaces"] == ["lo"]
    assert all(v != "connected" for v in report["connects"].values()), report["connects"]
    assert report["sandbox_endpoint"] == "http://127.0.0.1:4002"
    assert report["sandbox"] == {"status": 200, "body": "sandbox says hi"}
    assert report["sandbox_without_token"]["status"] == 401
    assert ("/probe", True) in sandbox.requests
    # The real gateway through its relay: the unit's token is answered by the model (the upstream saw the
    # real key, never the token), a wrong token is refused there, and the gateway counted both.
    assert report["model"] == {
        "base_url": "http://127.0.0.1:4001",
        "model": "probe-model",
        "right_token": {"status": 200, "text": "model says hi"},
        "wrong_token": {"status": 401, "text": ""},
    }
    assert [r.auth for r in served] == ["ok"]
    assert usage["requests"] == 1 and usage["refused"] == 1 and usage["errors"] == 0, usage
    assert [p.name for p in sockets] == ["gateway.sock"]

    # What the SDK says inside is what the host-side executor says, plus, for the bridge alone, the
    # endpoint's token in a private file of the socket folder (never the value: MCP configs are records), and
    # the socket of the entry's warm bridges.
    inside_env = dict(report["bridges"]["vm"]["env"])
    token_file = inside_env.pop(ENDPOINT_TOKEN_FILE_ENV)
    assert token_file.startswith("/run/ale-iac/") and ENDPOINT_TOKEN_ENV not in inside_env
    warm_socket = inside_env.pop(WARM_ENV)
    assert warm_socket.startswith("/tmp/ale-iac-bridges-") and warm_socket.endswith("/bridges.sock"), warm_socket
    assert report["bridges"]["vm"] == {
        "command": executor.bridge("vm").command,
        "args": executor.bridge("vm").args,
        "env": {**executor.bridge("vm").env, ENDPOINT_TOKEN_FILE_ENV: token_file, WARM_ENV: warm_socket},
    }
    assert report["bridges"]["cua"]["args"] == ["-m", "ale_iac.bridges", "cua", "--endpoint", "http://127.0.0.1:4002"]
    assert (
        report["clis"] == {"fakecli": executor.cli("fakecli")} == {"fakecli": "/opt/ale-iac/clis/fakecli/bin/fakecli"}
    )
    assert executor.model_access().base_url == "http://127.0.0.1:4001"

    # Secrets: they arrived (hashes match), the file that carried them is gone, and none of them is
    # anywhere in the work dir or in the container's configuration as the engine shows it.
    import hashlib

    assert report["secret_digest"] == hashlib.sha256(api_key.encode()).hexdigest()
    assert report["token_digest"] == hashlib.sha256(endpoint_token.encode()).hexdigest()
    assert "secrets.json" not in report["socket_dir"]
    assert report["secret_names_in_os_environ"] == []  # the entry took them out of its environment
    values = [api_key, endpoint_token, model_key, *tokens]
    for path in files_under(work):
        data = path.read_bytes()
        assert not any(v.encode() in data for v in values), f"a secret is in {path}"
    spec = json.loads((work / "_spec.json").read_text())
    assert spec["secret_env"] == [] and spec["secrets_file"] == "/run/ale-iac/secrets.json"
    assert len(inspected) == 1, inspected
    attrs = json.dumps(inspected[0])
    assert not any(v in attrs for v in values)
    config = inspected[0]["Config"]
    assert config["Labels"]["ale-iac.home"] == home_id()
    assert config["Labels"]["ale-iac.run"] == "test-run" and config["Labels"]["ale-iac.unit"] == "u-docker"
    host = inspected[0]["HostConfig"]
    assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"] and "no-new-privileges" in host["SecurityOpt"]
    assert host["Memory"] > 0 and host["PidsLimit"] > 0
    assert inspected[0]["Name"].startswith(f"/ale-iac-{home_id()}-")

    # Gone afterwards: the container, and the private socket folder.
    assert our_containers() == []
    assert not sockets[0].parent.exists()


@pytest.mark.parametrize(
    ("mode", "killed"),
    [
        ("hang", False),  # the entry's own deadline fires first and reports the timeout
        ("freeze", True),  # the entry itself is stuck: the engine kills the container
    ],
)
def test_the_deadline_ends_the_container(docker_image: str, tmp_path: Path, mode: str, killed: bool) -> None:
    """``install.log`` shows the deployer ran: the first thing its ``install`` writes. Not ``launch``'s marker:
    between the two the entry waits for its warm bridges' imports, which on a loaded machine can take longer
    than this test's 2 s limit (the limit covers the wait; it fired there once in CI, before ``launch``)."""

    async def main() -> AgentRunResult:
        sandbox = FakeSandbox("tok-" + secrets.token_hex(8))
        endpoint = await sandbox.start()
        executor = make_executor(endpoint, sandbox.token, tmp_path / "agent", mode=mode)
        try:
            return await run_probe(executor, mode, 2)
        finally:
            await sandbox.close()

    result = asyncio.run(main())
    assert result.status == "timeout", result
    assert "2 s limit" in (result.error or "")
    assert (tmp_path / "agent" / "install.log").exists()  # it did start
    assert ("container killed" in (result.error or "")) is killed
    assert (tmp_path / "agent" / "_done").exists() is not killed
    assert our_containers() == []


def test_cancelling_the_run_removes_the_container_before_it_raises(docker_image: str, tmp_path: Path) -> None:
    seen_after_cancel: list[list[str]] = []

    async def main() -> None:
        sandbox = FakeSandbox("tok-" + secrets.token_hex(8))
        endpoint = await sandbox.start()
        executor = make_executor(endpoint, sandbox.token, tmp_path / "agent", mode="block")
        task = asyncio.create_task(run_probe(executor, "block", 600))
        try:
            await asyncio.wait_for(sandbox.blocked.wait(), 120)  # the agent is inside, mid-request
            assert our_containers() != []
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            seen_after_cancel.append(our_containers())
        finally:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            await sandbox.close()

    asyncio.run(main())
    assert seen_after_cancel == [[]]


def test_a_container_that_dies_without_a_result_fails_with_its_log(docker_image: str, tmp_path: Path) -> None:
    async def main() -> AgentRunResult:
        sandbox = FakeSandbox("tok-" + secrets.token_hex(8))
        endpoint = await sandbox.start()
        executor = make_executor(endpoint, sandbox.token, tmp_path / "agent", mode="exit")
        try:
            return await run_probe(executor, "exit", 120)
        finally:
            await sandbox.close()

    result = asyncio.run(main())
    assert result.status == "failed" and result.exit_code == 7, result
    assert EXIT_MARKER in (result.error or "")
    assert EXIT_MARKER in (tmp_path / "agent" / "container.log").read_text()
    assert not (tmp_path / "agent" / "_result.json").exists()
    assert our_containers() == []


def _leftover(tag: str, owner_pid: int, owner_start: float | None, name: str) -> str:
    client = docker_client()
    try:
        container = client.containers.run(
            tag,
            ["sleep", "3600"],
            name=f"ale-iac-{home_id()}-{name}",
            labels={
                docker_executor.LABEL_HOME: home_id(),
                docker_executor.LABEL_RUN: "run-gone",
                docker_executor.LABEL_UNIT: name,
                docker_executor.LABEL_OWNER_PID: str(owner_pid),
                docker_executor.LABEL_OWNER_START: repr(owner_start),
            },
            network_mode="none",
            detach=True,
        )
        return container.name or ""
    finally:
        client.close()


def test_gc_removes_the_containers_of_dead_runners_only(docker_image: str) -> None:
    from ale_iac import procs

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone_start = procs.start_time(gone.pid)
    gone.wait()
    orphan = _leftover(docker_image, gone.pid, gone_start or 1.0, "orphan")
    live = _leftover(docker_image, os.getpid(), procs.start_time(os.getpid()), "live")
    try:
        dry = GcReport()
        collect_containers(dry_run=True, report=dry)
        assert dry.containers_removed == [orphan] and not dry.errors
        assert sorted(our_containers()) == sorted([orphan, live])  # a dry run removes nothing

        report = GcReport()
        collect_containers(dry_run=False, report=report)
        assert report.containers_removed == [orphan] and not report.errors
        assert our_containers() == [live]
    finally:
        client = docker_client()
        try:
            for name in (orphan, live):
                docker_executor.remove_container(client, name)
        finally:
            client.close()


@pytest.mark.engine
def test_ale_iac_gc_lists_then_removes_a_leftover_container(docker_image: str) -> None:
    from tests.support.cli import ale_iac

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    orphan = _leftover(docker_image, gone.pid, 1.0, "cli-orphan")
    try:
        dry = ale_iac("gc", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert f"would remove leftover agent container {orphan}" in dry.stdout
        assert our_containers() == [orphan]
        real = ale_iac("gc")
        assert real.returncode == 0, real.stderr
        assert f"removed leftover agent container {orphan}" in real.stdout
        assert our_containers() == []
    finally:
        client = docker_client()
        try:
            docker_executor.remove_container(client, orphan)
        finally:
            client.close()


@pytest.mark.needs_root
def test_dockerd_script_is_idempotent(docker_engine: None) -> None:
    """Runs after the first find the engine answering and start nothing: the same single dockerd of ale-iac's
    configuration, which keeps its promise of no default bridge (every unit has a network of its own)."""
    config = str(cache_root() / "engine" / "daemon.json")

    def daemons() -> list[int]:
        return sorted(
            p.pid
            for p in psutil.process_iter(["cmdline"])
            if (p.info["cmdline"] or [""])[0].endswith("dockerd") and config in p.info["cmdline"]
        )

    before = daemons()
    assert len(before) == 1, before
    for _ in range(2):
        proc = subprocess.run(
            ["bash", str(REPO / "scripts" / "dockerd.sh")], capture_output=True, text=True, check=False
        )
        assert proc.returncode == 0, proc.stderr
        assert "ready in" not in proc.stderr, proc.stderr  # nothing was started
    assert daemons() == before
    client = docker_client()
    try:
        assert "bridge" not in {network.name for network in client.networks.list()}
    finally:
        client.close()


LEAD_PROBE = Path(__file__).parent / "presets" / "probe"


@pytest.mark.sandbox
def test_a_deployer_drives_a_real_sandbox_through_the_bridges_inside(
    docker_image: str, local_sandbox: Any, tmp_path: Path
) -> None:
    """End to end: the shared probe deployer, in the container, starts the cua bridge there over stdio;
    the bridge reaches the real sandbox through the relay with the sandbox's token, and takes a screenshot."""
    from tests.support.sandbox import handle_of

    data = yaml.safe_load((LEAD_PROBE / "preset.yaml").read_text())
    config = AgentConfig.model_validate({**data, "executor": "docker", "source_dir": str(LEAD_PROBE)})
    handle = handle_of(local_sandbox)
    token = handle.token()
    assert token
    work = tmp_path / "unit" / "agent"
    work.mkdir(parents=True)
    executor = DockerExecutor(config=config, sandbox=handle, work_dir=work, env={}, redact=Redactor([token]))
    result = asyncio.run(run_probe(executor, "look around", 180))
    log = (work / "container.log").read_text() if (work / "container.log").exists() else ""
    assert result.status == "completed", (result, log)
    report = json.loads((work / "report.json").read_text())
    assert report["kind"] == "docker" and report["native_shell"] is False
    assert report["hostname"] == "agent" and report["shell_exit"] == 0
    assert "screenshot" in report["cua_tools"] and "image" in report["screenshot"]
    assert "has no model" in report["model"]["error"]
    for path in files_under(work):
        assert token.encode() not in path.read_bytes(), f"the endpoint token is in {path}"
    assert our_containers() == []
