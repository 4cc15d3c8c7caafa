"""A relay on a loopback port whose connections wait for their upstream to listen.

A Kubernetes unit's endpoint (``sandbox.portforward``) sits in front of ``kubectl port-forward``, which ends a
forward at an error of any of its streams and is started again on its port: while it starts, its port refuses
connections. A connection to this relay's port is accepted at once and joined to the upstream port as soon as
that listens again (within ``patience_s``, and while ``alive()`` says the forward lives), so a client never sees
the gap.

Plain threads and blocking sockets, two threads per connection (one per direction), standard library only.
An asyncio relay on a loop of its own thread was tried first: the garbage collector closed its connection
coroutines at random points of the runner's thread, and the kubernetes demo failed in 2 runs of 4 (a bridge's
start raised ``SystemError: AST constructor recursion depth mismatch``).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from typing import Final

ACCEPT_POLL_S: Final = 0.5
"""How often the accepting thread looks whether the relay was closed."""
RETRY_S: Final = 0.05
"""The pause between two connection attempts to an upstream that refuses."""
_CHUNK: Final = 65536


class HoldingRelay:
    """Listens on 127.0.0.1 (a port the kernel picks); joins each connection to ``127.0.0.1:upstream_port``."""

    def __init__(self, upstream_port: int, alive: Callable[[], bool], patience_s: float, name: str):
        self.upstream_port = upstream_port
        self.alive = alive
        self.patience_s = patience_s
        self.closed = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.listener.settimeout(ACCEPT_POLL_S)
        self.port: int = self.listener.getsockname()[1]
        self._accepting = threading.Thread(target=self._accept, name=f"relay {name}", daemon=True)
        self._accepting.start()

    def close(self) -> None:
        """Stop accepting and end every connection (both of its ends)."""
        self.closed.set()
        self._accepting.join(timeout=ACCEPT_POLL_S * 4)
        self.listener.close()
        with self._lock:
            live = list(self._sockets)
        for sock in live:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._carry, args=(client,), daemon=True).start()

    def _open_upstream(self) -> socket.socket | None:
        deadline = time.monotonic() + self.patience_s
        while not self.closed.is_set():
            try:
                return socket.create_connection(("127.0.0.1", self.upstream_port), timeout=10)
            except ConnectionRefusedError:
                if not self.alive() or time.monotonic() >= deadline:
                    return None
                self.closed.wait(RETRY_S)
            except OSError:
                return None
        return None

    def _carry(self, client: socket.socket) -> None:
        upstream = self._open_upstream()
        if upstream is None:
            client.close()  # the client sees EOF, as from a forward that is gone
            return
        pair = (client, upstream)
        for sock in pair:
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._sockets.update(pair)
        try:
            back = threading.Thread(target=_copy, args=(upstream, client), daemon=True)
            back.start()
            _copy(client, upstream)
            back.join()
        finally:
            with self._lock:
                self._sockets.difference_update(pair)
            for sock in pair:
                sock.close()


def _copy(source: socket.socket, sink: socket.socket) -> None:
    """Bytes from ``source`` to ``sink`` until EOF (then ``sink`` is half-closed, as the source was) or an error
    (then both are shut down both ways, so that the other direction's thread ends too)."""
    try:
        while data := source.recv(_CHUNK):
            sink.sendall(data)
    except OSError:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        return
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)
