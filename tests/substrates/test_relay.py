"""``relay.loopback_listener`` in a network namespace whose loopback is not configured yet.

A local sandbox's supervisor makes the model channel's listener in the sandbox's namespace as soon as
bubblewrap reports the sandbox's pid, before bubblewrap has finished configuring ``lo`` there. While the
namespace's local routing table exists without a route for 127.0.0.1, a plain bind fails with
EADDRNOTAVAIL (a suite run met it under load). The tests make that state for real, in a namespace of
their own: a local table that holds another address only.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from ale_iac.substrates.local import linux
from ale_iac.substrates.relay import loopback_listener

pytestmark = pytest.mark.needs_root

T = TypeVar("T")


@pytest.fixture
def namespace() -> Iterator[str]:
    """A new network namespace (by its ``/proc`` path) whose local table exists without 127.0.0.1."""
    holder = subprocess.Popen(["unshare", "--net", "--", "sleep", "600"])
    try:
        ours = os.readlink("/proc/self/ns/net")
        # unshare(1) execs sleep once the namespace is made; bounded by the process: if it fails, it exits.
        while holder.poll() is None and os.readlink(f"/proc/{holder.pid}/ns/net") == ours:
            os.sched_yield()
        assert holder.poll() is None, "unshare --net failed"
        path = f"/proc/{holder.pid}/ns/net"
        ip(path, "route", "add", "local", "198.18.0.1", "dev", "lo", "table", "local")
        yield path
    finally:
        holder.kill()
        holder.wait()


def ip(namespace: str, *argv: str) -> None:
    subprocess.run(["nsenter", f"--net={namespace}", "ip", *argv], check=True)


def inside(namespace: str, call: Callable[[], T]) -> T | OSError:
    """``call()``'s result, or the OSError it raised, called in a thread that joined ``namespace``."""
    outcome: list[T | OSError] = []

    def run() -> None:
        fd = os.open(namespace, os.O_RDONLY | os.O_CLOEXEC)
        try:
            linux.setns(fd, linux.CLONE_NEWNET)
        finally:
            os.close(fd)
        try:
            outcome.append(call())
        except OSError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return outcome[0]


def plain_bind() -> str:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
    return "bound"


def test_a_plain_bind_on_127_0_0_1_fails_there(namespace: str) -> None:
    """The state itself: without it the test below would prove nothing."""
    outcome = inside(namespace, plain_bind)
    assert isinstance(outcome, OSError) and outcome.errno == 99  # EADDRNOTAVAIL


def test_the_listener_binds_there_and_is_reached_once_lo_is_up(namespace: str) -> None:
    listener = inside(namespace, lambda: loopback_listener(4010))
    assert isinstance(listener, socket.socket)
    with listener:
        ip(namespace, "addr", "add", "127.0.0.1/8", "dev", "lo")
        ip(namespace, "link", "set", "lo", "up")

        def round_trip() -> bytes:
            listener.setblocking(True)
            with socket.create_connection(("127.0.0.1", 4010), timeout=30) as client:
                accepted, _ = listener.accept()
                with accepted:
                    client.sendall(b"ping")
                    return accepted.recv(4)

        assert inside(namespace, round_trip) == b"ping"
