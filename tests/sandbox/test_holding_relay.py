"""``sandbox.holding_relay`` on loopback: bytes both ways and a half-close carried, a connection held until its
upstream listens, given up (EOF) when it never does, and every connection ended by ``close``."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator

import pytest

from ale_iac.sandbox.holding_relay import HoldingRelay


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _echo_until_eof(listener: socket.socket) -> None:
    """Accept one connection; send back everything it sends, then a byte count once it half-closes."""
    connection, _ = listener.accept()
    with connection:
        total = 0
        while data := connection.recv(65536):
            total += len(data)
            connection.sendall(data)
        connection.sendall(f"|{total}".encode())


@pytest.fixture
def upstream() -> Iterator[socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    yield listener
    listener.close()


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while data := sock.recv(65536):
        chunks.append(data)
    return b"".join(chunks)


def test_bytes_cross_both_ways_and_a_half_close_too(upstream: socket.socket) -> None:
    relay = HoldingRelay(upstream.getsockname()[1], lambda: True, 5.0, "test")
    server = threading.Thread(target=_echo_until_eof, args=(upstream,))
    server.start()
    try:
        payload = os.urandom(3 * 2**20)
        with socket.create_connection(("127.0.0.1", relay.port), timeout=10) as client:
            sender = threading.Thread(target=lambda: (client.sendall(payload), client.shutdown(socket.SHUT_WR)))
            sender.start()
            got = _read_all(client)
            sender.join()
        assert got == payload + f"|{len(payload)}".encode()
    finally:
        server.join(timeout=10)
        relay.close()


def test_a_connection_waits_for_its_upstream_to_listen() -> None:
    port = _free_port()
    relay = HoldingRelay(port, lambda: True, 30.0, "test")
    try:
        with socket.create_connection(("127.0.0.1", relay.port), timeout=10) as client:
            client.sendall(b"early")
            client.shutdown(socket.SHUT_WR)
            # Only now does the upstream listen: the relay has been trying it meanwhile.
            listener = socket.create_server(("127.0.0.1", port))
            with listener:
                server = threading.Thread(target=_echo_until_eof, args=(listener,))
                server.start()
                assert _read_all(client) == b"early|5"
                server.join(timeout=10)
    finally:
        relay.close()


def test_a_connection_ends_when_the_upstream_never_listens_or_the_forward_is_gone() -> None:
    port = _free_port()
    alive = threading.Event()
    alive.set()
    relay = HoldingRelay(port, alive.is_set, 0.3, "test")
    try:
        with socket.create_connection(("127.0.0.1", relay.port), timeout=10) as client:
            assert client.recv(10) == b""  # after its patience: EOF, as from a forward that is gone
        alive.clear()
        with socket.create_connection(("127.0.0.1", relay.port), timeout=10) as client:
            assert client.recv(10) == b""
    finally:
        relay.close()


def test_close_ends_live_connections_and_the_port(upstream: socket.socket) -> None:
    relay = HoldingRelay(upstream.getsockname()[1], lambda: True, 5.0, "test")
    client = socket.create_connection(("127.0.0.1", relay.port), timeout=10)
    accepted, _ = upstream.accept()
    try:
        client.sendall(b"x")
        assert accepted.recv(1) == b"x"
        relay.close()
        assert client.recv(10) == b""  # the relay's end of it was shut down
        assert accepted.recv(10) == b""
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", relay.port), timeout=10).close()
    finally:
        client.close()
        accepted.close()
