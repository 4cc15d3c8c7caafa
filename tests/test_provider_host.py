"""The engine's shared dynamic-provider process: serves the CLI, refuses other uids, ends with its engine."""

from __future__ import annotations

import gc
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from google.protobuf import empty_pb2
from pulumi.runtime.proto import plugin_pb2, provider_pb2_grpc

from ale_iac import procs
from ale_iac.engine import Engine, sweep_orphan_providers
from ale_iac.provider_host import MODULE, ProviderHost, _own_uid_only, socket_uid
from tests.support.engine import marker_program

REPO = Path(__file__).resolve().parent.parent


def _hosts_of(owner: int) -> list[int]:
    return [pid for pid in procs.all_pids() if MODULE in procs.argv(pid)[1:4] and procs.argv(pid)[-1] == str(owner)]


def _wait_for(check: Callable[[], bool], what: str, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not check():
        assert time.monotonic() < deadline, f"still waiting for {what} after {limit_s:.0f} s"
        time.sleep(0.05)


def test_socket_uid_names_the_owner_of_the_calling_socket() -> None:
    """Read for real from /proc/net/tcp: our own connection, and one made by another uid (nobody)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    with listener, socket.create_connection(("127.0.0.1", port)) as mine:
        peer = listener.accept()[0]
        with peer:
            host, client_port = mine.getsockname()
            assert socket_uid(f"ipv4:{host}:{client_port}") == os.getuid()
        other = subprocess.Popen(
            ["runuser", "-u", "nobody", "--", "bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{port}; read -r _ <&3"],
            stdin=subprocess.DEVNULL,
        )
        try:
            theirs, address = listener.accept()
            with theirs:
                assert socket_uid(f"ipv4:{address[0]}:{address[1]}") == 65534
                theirs.sendall(b"done\n")
        finally:
            assert other.wait(timeout=30) == 0
    assert socket_uid("ipv4:127.0.0.1:1") is None  # no such connection
    assert socket_uid("unix:/tmp/x") is None


@pytest.fixture
def guarded_server() -> Iterator[tuple[grpc.Server, int, list[int | None]]]:
    """A real grpc provider server behind the uid check, whose idea of the caller's uid a test sets."""
    seen: list[int | None] = [os.getuid()]

    class Servicer(provider_pb2_grpc.ResourceProviderServicer):  # type: ignore[misc]
        def Cancel(self, request: object, context: object) -> empty_pb2.Empty:  # noqa: N802 - the grpc name
            return empty_pb2.Empty()

    server = grpc.server(futures.ThreadPoolExecutor(2), interceptors=[_own_uid_only(lambda _peer: seen[0])])
    provider_pb2_grpc.add_ResourceProviderServicer_to_server(Servicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield server, port, seen
    server.stop(0)


def test_a_call_from_another_uid_is_refused(guarded_server: tuple[grpc.Server, int, list[int | None]]) -> None:
    _, port, seen = guarded_server
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = provider_pb2_grpc.ResourceProviderStub(channel)
        assert stub.Cancel(empty_pb2.Empty()) == empty_pb2.Empty()
        for uid in (65534, None):
            seen[0] = uid
            with pytest.raises(grpc.RpcError) as info:
                stub.Cancel(empty_pb2.Empty())
            assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED


def test_the_host_serves_our_calls_and_says_yes_to_attach() -> None:
    host = ProviderHost(lambda: os.environ)
    try:
        port = host.port()
        assert host.port() == port  # one process, started once
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = provider_pb2_grpc.ResourceProviderStub(channel)
            assert stub.GetPluginInfo(empty_pb2.Empty()).version
            assert stub.Attach(plugin_pb2.PluginAttach(address="127.0.0.1:1")) == empty_pb2.Empty()
        assert host.attach_env({"PULUMI_DEBUG_PROVIDERS": "aws:1,pulumi-python:2"}) == {
            "PULUMI_DEBUG_PROVIDERS": f"aws:1,pulumi-python:{port}"
        }
        pid = host.pid
    finally:
        host.close()
    assert pid is not None and not procs.alive(pid)


@pytest.mark.engine
def test_every_operation_of_an_engine_uses_its_one_provider_process(tmp_path: Path) -> None:
    """Two stacks up and down: no ``pulumi-resource-pulumi-python`` plugin starts; the host is closed."""
    marker = tmp_path / "m"
    with Engine() as engine:
        for name in ("t-host-a", "t-host-b"):
            engine.init(name)
            engine.up_new(name, marker_program(str(marker), name), initialized=True)
            assert marker.read_text() == name
            host = engine.provider_pid
            assert host is not None and host in _hosts_of(os.getpid())
            assert not [p for p in procs.all_pids() if "pulumi-resource-pulumi-python" in " ".join(procs.argv(p))]
            engine.destroy(name)
            assert not marker.exists()
            assert engine.provider_pid == host
        assert engine.list_stacks() == []
    assert not procs.alive(host)


DRIVER = textwrap.dedent(
    """
    import sys
    from ale_iac.engine import Engine
    from tests.support.engine import marker_program
    engine = Engine()
    engine.up("t-host-orphan", marker_program(sys.argv[1], "x"))
    print("up", flush=True)
    sys.stdin.read()
    """
)


@pytest.mark.engine
def test_the_host_ends_when_its_engine_process_is_killed(tmp_path: Path) -> None:
    """SIGKILL of the engine's process alone (not its group): its provider host exits by itself."""
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(tmp_path / "m")],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert driver.stdout is not None and driver.stdout.readline() == b"up\n"
        [host] = _hosts_of(driver.pid)
        assert sweep_orphan_providers() == []  # its engine is alive: left alone
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        _wait_for(lambda: not procs.alive(host), "the orphaned provider host to exit")
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    Engine().recover("t-host-orphan")


@pytest.mark.engine
def test_an_engine_dropped_without_close_stops_its_provider_process(tmp_path: Path) -> None:
    engine = Engine()
    engine.up_new("t-host-gc", marker_program(str(tmp_path / "m"), "x"))
    engine.destroy("t-host-gc")
    host = engine.provider_pid
    assert host is not None and procs.alive(host)
    del engine
    gc.collect()
    assert not procs.alive(host)


def test_socket_uid_takes_only_a_live_connection_to_this_server(tmp_path: Path) -> None:
    """A closed connection of the same local port (TIME_WAIT, which the kernel lists as uid 0) and a live one
    of that port to another server come before the caller's own row: neither is taken for it."""
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    caller, server, other = "0100007F:A1B2", "0100007F:1F90", "0100007F:2328"  # 127.0.0.1:41394, :8080, :9000
    rows = [
        f"   0: {caller} {server} 06 00000000:00000000 03:00000F9F 00000000     0        0 0 3\n",  # TIME_WAIT
        f"   1: {caller} {other} 01 00000000:00000000 00:00000000 00000000     0        0 11 1\n",  # root, elsewhere
        f"   2: {caller} {server} 01 00000000:00000000 00:00000000 00000000  1001        0 12 1\n",
    ]
    table = tmp_path / "tcp"
    table.write_text(header + "".join(rows))
    peer = f"ipv4:127.0.0.1:{0xA1B2}"
    assert socket_uid(peer, {0x1F90}, tables=[str(table)]) == 1001
    assert socket_uid(peer, tables=[str(table)]) == 0  # without the server's ports: the other live connection
    assert socket_uid(peer, {0x1F91}, tables=[str(table)]) is None
