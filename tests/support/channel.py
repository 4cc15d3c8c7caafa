"""The host's end of a unit's model channel in tests: a Unix socket that the channel carries a connection to."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def answering_socket(path: Path, reply: bytes, length: int | None = None) -> Iterator[list[bytes]]:
    """A Unix socket at ``path`` that takes one connection, reads it to its end (or ``length`` bytes: where a
    half-close does not cross the way in, as a Kubernetes port-forward), answers ``reply`` and closes.

    Yields the list that receives what the connection sent; on leaving, waits (30 s at most) for the answer."""
    received: list[bytes] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen(1)

        def answer() -> None:
            conn, _ = server.accept()
            with conn:
                data = b""
                while (length is None or len(data) < length) and (chunk := conn.recv(100)):
                    data += chunk
                received.append(data)
                conn.sendall(reply)

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        try:
            yield received
        finally:
            thread.join(timeout=30)
