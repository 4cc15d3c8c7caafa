"""The host ends of QEMU's sockets: a socket file that exists but does not listen yet (QEMU's ``bind()`` comes
before its ``listen()``) is waited for, not taken for a dead guest. No QEMU here: a plain unix socket plays its
part, so these run in the fast lane."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ale_iac.substrates.qemu import qmp
from ale_iac.substrates.qemu.qmp import AgentChannel, QmpError


@pytest.fixture
def bound_only(tmp_path: Path) -> Iterator[tuple[Path, socket.socket]]:
    """A unix socket bound at a path, not yet listening: what a connecting host meets between QEMU's two calls."""
    path = tmp_path / "agent.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    yield path, server
    server.close()


def test_a_refused_connect_is_final_once_patience_is_spent(bound_only: tuple[Path, socket.socket]) -> None:
    path, _server = bound_only
    with pytest.raises(QmpError, match=r"cannot reach the guest agent channel.*Connection refused"):
        AgentChannel(path, patience=0.2)


def test_the_channel_connects_once_the_bound_socket_starts_listening(
    bound_only: tuple[Path, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, server = bound_only
    refused = threading.Event()
    accepted: list[socket.socket] = []
    connect_once = qmp._connect_once

    def noting_refusals(target: Path) -> socket.socket:
        try:
            return connect_once(target)
        except ConnectionRefusedError:
            refused.set()
            raise

    def listen_after_a_refusal() -> None:
        if refused.wait(10):
            server.listen(1)
            server.settimeout(10)  # the channel may have given up: never block the test's end
            try:
                conn, _ = server.accept()
            except TimeoutError:
                return
            conn.sendall(json.dumps({"event": "waiting"}).encode() + b"\n")
            accepted.append(conn)

    monkeypatch.setattr(qmp, "_connect_once", noting_refusals)
    listener = threading.Thread(target=listen_after_a_refusal, daemon=True)
    listener.start()
    try:
        channel = AgentChannel(path)
        try:
            assert channel.wait_for("waiting", time.monotonic() + 10)["event"] == "waiting"
        finally:
            channel.close()
    finally:
        refused.set()
        listener.join(10)
        for conn in accepted:
            conn.close()
