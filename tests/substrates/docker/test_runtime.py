"""The docker substrate's driver against the real engine: limits, the endpoint, the network walls, removal,
the archive transport and gc after a crash. Every probe of the network runs inside the unit."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ale_iac.substrates import registry
from ale_iac.substrates.docker import runtime, walls
from ale_iac.substrates.docker.runtime import DockerSandboxSpec, DockerSandboxState
from ale_iac.substrates.seccomp import docker_profile
from tests.support.sandbox import Endpoint, new_sandbox_id, run, wait_for_status

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[3]


def _start(image: str, **fields: Any) -> DockerSandboxState:
    spec = DockerSandboxSpec(sandbox_id=new_sandbox_id("dkr"), image=image, **fields)
    state = runtime.start(spec)
    try:
        wait_for_status(Endpoint(state.endpoint, state.token))
    except BaseException:
        runtime.stop(state.sandbox_id)
        raise
    return state


@pytest.fixture(scope="module")
def unit(docker_image: str) -> Iterator[DockerSandboxState]:
    state = _start(
        docker_image,
        vcpus=1,
        memory_gb=1.5,
        shm_gb=0.5,
        pids_limit=300,
        labels={"stack": "pytest-docker", "unit": "u0", "run": "run-pytest"},
        expires_at="2099-01-01T00:00:00Z",
    )
    try:
        yield state
    finally:
        runtime.stop(state.sandbox_id)


def sh(state: DockerSandboxState, command: str) -> dict[str, Any]:
    return run(Endpoint(state.endpoint, state.token), command)


def _host_address() -> str:
    """A non-loopback address of this host (the one its default route leaves from)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.254", 9))  # no packet is sent for a UDP connect
        return str(probe.getsockname()[0])


def test_limits_labels_and_hardening_are_applied(unit: DockerSandboxState, docker_engine: None) -> None:
    host = runtime.inspect_limits(unit.container_id)
    assert host["NanoCpus"] == 1_000_000_000
    assert host["Memory"] == host["MemorySwap"] == round(1.5 * 1024) * 2**20
    assert host["ShmSize"] == 512 * 2**20 and host["PidsLimit"] == 300
    assert host["ReadonlyRootfs"] is True and host["Privileged"] is False and not host["CapAdd"]
    assert set(host["CapDrop"]) == set(runtime.DROPPED_CAPS)
    assert host["SecurityOpt"][0] == "no-new-privileges:true" and len(host["SecurityOpt"]) == 2
    assert json.loads(host["SecurityOpt"][1].removeprefix("seccomp=")) == docker_profile()  # never the engine's
    recorded = {limit.name: limit for limit in unit.limits}
    for wall in ("userns", "seccomp", "disk", "nosuid"):  # ale-iac's own engine remaps
        assert recorded[wall].applied, recorded[wall]
    engine = runtime.client()
    try:
        assert recorded["apparmor"].applied == walls.engine_security(engine).apparmor
    finally:
        engine.close()
    # No host path is mounted: every bind is one of the unit's own volumes.
    assert sorted(b.split(":")[0] for b in host["Binds"]) == sorted(unit.volumes)
    assert all("/" not in b.split(":")[0] for b in host["Binds"])
    # From inside: the cgroup limits, the read-only root, /dev/shm's size.
    inside = sh(unit, "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max; "
                "df -B1 --output=size /dev/shm | tail -1; touch /usr/x 2>&1; "
                "mkdir -p /media/user/data/agenthle && echo media-ok; grep CapEff /proc/1/status")  # fmt: skip
    lines = inside["stdout"].split("\n")
    assert lines[0] == str(round(1.5 * 1024) * 2**20) and lines[1] == "300", inside
    assert int(lines[2]) == 512 * 2**20, inside
    assert "Read-only file system" in lines[3], inside
    assert lines[4] == "media-ok", inside  # ALE tasks' data root is writable
    assert int(lines[5].split()[1], 16) == 0x404EB, inside  # the local substrate's eight capabilities
    info = runtime.inspect(unit.sandbox_id)
    assert info is not None and info.status == "running"
    for key, value in {
        "stack": "pytest-docker",
        "unit": "u0",
        "run": "run-pytest",
        "expires": "2099-01-01T00:00:00Z",
    }.items():
        assert info.labels[f"ale-iac.{key}"] == value


def test_a_shape_larger_than_the_host_is_fitted_to_it_and_recorded(docker_image: str) -> None:
    """The engine refuses a CPU quota above its CPUs (400 "Range of CPUs is from 0.01 to N"): a unit whose
    shape asks more gets none, like a local sandbox, and its record says so with the numbers."""
    client = runtime.client()
    try:
        host = runtime.host_resources(client)
    finally:
        client.close()
    state = _start(docker_image, vcpus=host.cpus + 2, memory_gb=1)
    try:
        assert runtime.inspect_limits(state.container_id)["NanoCpus"] == 0
        cpu = {limit.name: limit for limit in state.limits}["cpu"]
        assert not cpu.applied and cpu.requested == str(host.cpus + 2)
        assert f"it has {host.cpus} CPUs, the shape asked {host.cpus + 2}" in cpu.detail
        assert runtime.limits_of(state.sandbox_id) == state.limits  # what the unit's record reads back
    finally:
        runtime.stop(state.sandbox_id)
    assert runtime.limits_of(state.sandbox_id) is None


def test_the_image_s_font_caches_are_current_in_a_container(unit: DockerSandboxState) -> None:
    """The image's font caches hold up in its tar export: with a stale one, every fontconfig client of the unit
    (openbox at its start, any application the agent opens) rescans those fonts and writes a cache of its own to
    the unit's home (the root file system is read-only)."""
    reply = sh(unit, "fc-list >/dev/null && ls -A /root/.cache/fontconfig 2>/dev/null | wc -l")
    assert reply["return_code"] == 0, reply
    assert reply["stdout"].strip() == "0", f"the unit rebuilt {reply['stdout'].strip()} font caches its image holds"


def test_the_token_is_in_no_configuration_the_engine_shows(unit: DockerSandboxState, docker_engine: None) -> None:
    client = runtime.client()
    try:
        attrs = client.api.inspect_container(unit.container_id)
    finally:
        client.close()
    assert unit.token not in json.dumps(attrs)
    assert httpx.get(f"{unit.endpoint}/status", timeout=10).status_code == 401
    assert (
        httpx.get(f"{unit.endpoint}/status", headers={"Authorization": f"Bearer {unit.token}"}, timeout=10).status_code
        == 200
    )


def test_the_container_keeps_its_spec_and_current_reads_its_endpoint_and_token(
    unit: DockerSandboxState, docker_image: str
) -> None:
    """What a pool reset needs: the spec to start again (no token in it), and the endpoint and token read back."""
    client = runtime.client()
    try:
        recorded = client.containers.get(unit.container_id).labels[runtime.LABEL_SPEC]
    finally:
        client.close()
    spec = DockerSandboxSpec.from_json(recorded)
    assert spec.sandbox_id == unit.sandbox_id and spec.image == docker_image and spec.pids_limit == 300
    assert spec.labels["stack"] == "pytest-docker" and unit.token not in recorded
    assert runtime.current(unit.sandbox_id, known_container=unit.container_id) is None  # the stack's is right
    now = runtime.current(unit.sandbox_id)
    assert now is not None and (now.container_id, now.endpoint, now.token) == (
        unit.container_id,
        unit.endpoint,
        unit.token,
    )
    assert runtime.current("no-such-unit") is None


def test_the_endpoint_is_published_on_loopback_only(unit: DockerSandboxState, docker_engine: None) -> None:
    bindings = runtime.inspect_limits(unit.container_id)["PortBindings"]
    assert [b["HostIp"] for b in bindings[f"{runtime.PROXY_PORT}/tcp"]] == ["127.0.0.1"]
    assert list(bindings) == [f"{runtime.PROXY_PORT}/tcp"]  # the computer-server's own port is not published
    with pytest.raises(OSError):
        socket.create_connection((_host_address(), unit.host_port), timeout=5).close()
    socket.create_connection(("127.0.0.1", unit.host_port), timeout=5).close()
    # Inside, the computer-server listens on loopback only; the forwarder is what the network sees.
    listening = sh(unit, "cat /proc/net/tcp")["stdout"]
    assert f"0100007F:{runtime.SERVER_PORT:04X}" in listening and f"00000000:{runtime.SERVER_PORT:04X}" not in listening


def _probe(state: DockerSandboxState, targets: list[tuple[str, int, str]]) -> list[str]:
    code = f"""
        import socket
        for host, port, kind in {targets!r}:
            try:
                if kind == "tcp":
                    socket.create_connection((host, port), timeout=3).close()
                elif kind == "dns":
                    socket.getaddrinfo(host, port)
                print(host, port, kind, "reached")
            except OSError as exc:
                print(host, port, kind, "failed", exc.errno)
        """
    reply = sh(state, "python3 -c " + shlex.quote(textwrap.dedent(code)))
    return reply["stdout"].splitlines()


@pytest.mark.parametrize("outbound", [False, True], ids=["no-outbound", "outbound-allowed"])
def test_nothing_of_the_host_and_no_outbound_unless_allowed(docker_image: str, outbound: bool) -> None:
    state = _start(docker_image, allow_outbound=outbound)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
            server.bind(("0.0.0.0", 0))
            server.listen(8)
            server.setblocking(False)
            port = server.getsockname()[1]
            client = runtime.client()
            try:
                network = client.networks.get(state.network).attrs
            finally:
                client.close()
            gateway = network["IPAM"]["Config"][0]["Gateway"]
            bridge = network["Options"]["com.docker.network.bridge.name"]
            assert bridge.startswith(runtime.OUTBOUND_BRIDGE if outbound else runtime.NO_OUTBOUND_BRIDGE)
            assert network["Options"]["com.docker.network.bridge.enable_icc"] == "false"
            host_probes = _probe(state, [(gateway, port, "tcp"), (_host_address(), port, "tcp")])
            with pytest.raises(BlockingIOError):
                server.accept()
        assert len(host_probes) == 2 and all(" failed " in line for line in host_probes), host_probes
        if not outbound:
            # Through the host to anywhere: dropped at the host (DOCKER-USER), DNS through the engine too.
            away = _probe(state, [("192.0.2.254", 80, "tcp"), ("deb.debian.org", 80, "dns")])
            assert len(away) == 2 and all(" failed " in line for line in away), away
    finally:
        runtime.stop(state.sandbox_id)


def _leftovers(sandbox_id: str) -> list[str]:
    client = runtime.client()
    label = {"label": f"{runtime.LABEL_SANDBOX}={sandbox_id}"}
    try:
        return (
            [f"container {c.name}" for c in client.containers.list(all=True, filters=label)]
            + [f"network {n.name}" for n in client.networks.list(filters=label)]
            + [f"volume {v.name}" for v in client.volumes.list(filters=label)]
            + ([f"disk {sandbox_id}"] if walls.unit_dir(sandbox_id).exists() else [])
        )
    finally:
        client.close()


def test_stop_leaves_no_container_network_or_volume(docker_image: str) -> None:
    state = runtime.start(DockerSandboxSpec(sandbox_id=new_sandbox_id("dkr-stop"), image=docker_image))
    assert len(_leftovers(state.sandbox_id)) == 1 + 1 + len(runtime.VOLUMES) + 1
    disk = walls.unit_dir(state.sandbox_id) / walls.MOUNT_DIR
    flags = os.statvfs(disk).f_flag
    assert os.path.ismount(disk) and flags & os.ST_NOSUID and flags & os.ST_NODEV
    assert runtime.stop(state.sandbox_id) is True
    assert _leftovers(state.sandbox_id) == []
    assert runtime.inspect(state.sandbox_id) is None
    assert runtime.stop(state.sandbox_id) is False  # idempotent


def test_the_archive_transport_round_trips_a_folder(unit: DockerSandboxState, tmp_path: Path) -> None:
    source = tmp_path / "in"
    (source / "sub" / "deeper").mkdir(parents=True)
    files = {"a.txt": b"alpha\n", "sub/b.bin": os.urandom(3 * 2**20 + 7), "sub/deeper/c": b"", "run.sh": b"#!/bin/sh\n"}
    for name, data in files.items():
        (source / name).write_bytes(data)
    (source / "run.sh").chmod(0o755)
    remote = "/data/tasks/t-archive/input"
    assert runtime.copy_in(unit.container_id, source, remote) == len(files)
    listing = sh(unit, f"cd {remote} && find . -type f -printf '%P %m %u\\n' | sort && sha256sum sub/b.bin")
    assert listing["stdout"].splitlines()[:4] == [
        "a.txt 644 root",
        "run.sh 755 root",
        "sub/b.bin 644 root",
        "sub/deeper/c 644 root",
    ]
    assert listing["stdout"].splitlines()[4].split()[0] == hashlib.sha256(files["sub/b.bin"]).hexdigest()
    # Back out: regular files only; a link the unit planted is neither followed nor copied.
    assert sh(unit, f"ln -s /etc/shadow {remote}/link && mkfifo {remote}/fifo")["return_code"] == 0
    back = tmp_path / "out"
    assert runtime.copy_out(unit.container_id, remote, back) == len(files)
    assert {p.relative_to(back).as_posix(): p.read_bytes() for p in back.rglob("*") if p.is_file()} == files
    assert not (back / "link").exists() and not (back / "fifo").exists()
    assert runtime.copy_out(unit.container_id, "/data/tasks/none", tmp_path / "none") == 0
    with pytest.raises(runtime.DockerSubstrateError, match="no volume"):
        runtime.copy_in(unit.container_id, source, "/etc/x")


_CRASH = """
import os, signal, sys
from ale_iac.substrates.docker import runtime
spec = runtime.DockerSandboxSpec(sandbox_id=sys.argv[1], image=sys.argv[2], labels={"stack": "run-gone-000000"})
state = runtime.start(spec)
print(state.container_id, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_gc_removes_a_unit_whose_creator_was_killed(docker_image: str) -> None:
    crashed = new_sandbox_id("dkr-crash")
    done = subprocess.run(
        [sys.executable, "-c", _CRASH, crashed, docker_image], capture_output=True, text=True, cwd=REPO, check=False
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    # And one killed half-way: a network and volumes, no container yet.
    client = runtime.client()
    half = new_sandbox_id("dkr-half")
    labels = {runtime.LABEL_KIND: runtime.KIND, runtime.LABEL_SANDBOX: half, runtime.LABEL_HOME: runtime.home_id()}
    try:
        client.volumes.create(f"ale-iac-{half}-data", labels=labels)
    finally:
        client.close()
    # And one killed before its engine objects: only its disk.
    early = new_sandbox_id("dkr-early")
    walls.make_disk(early, 0.1, ["data"], (0, 0), {**labels, runtime.LABEL_SANDBOX: early})
    assert _leftovers(crashed) and _leftovers(half) and _leftovers(early)
    listed = subprocess.run(
        [sys.executable, "-m", "ale_iac", "gc", "--dry-run"], capture_output=True, text=True, cwd=REPO, check=False
    )
    found = all(unit in listed.stdout for unit in (crashed, half, early))
    assert listed.returncode == 0 and found, listed.stdout + listed.stderr
    assert _leftovers(crashed)
    swept = subprocess.run(
        [sys.executable, "-m", "ale_iac", "gc"], capture_output=True, text=True, cwd=REPO, check=False
    )
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert _leftovers(crashed) == [] and _leftovers(half) == [] and _leftovers(early) == []


def test_doctor_checks_say_what_the_host_has_for_isolation(docker_engine: None) -> None:
    checks = {check.name: check for check in registry.get("docker").host_checks()}
    assert {"mkfs.ext4", "mount", "loop devices", "engine", "seccomp", "AppArmor"} <= set(checks)
    userns = checks["user namespace"]
    assert userns.ok and userns.detail.startswith("root in a unit is host uid "), userns  # ale-iac's own engine
    assert int(userns.detail.rsplit(" ", 1)[1]) >= 65536
    assert not checks["AppArmor"].required
