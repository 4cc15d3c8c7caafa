"""The bridge side of a PTY: the server's output stream is push-only, so what it sends is buffered here until
read (bounded: the oldest output is dropped beyond the limit, and counted)."""

from __future__ import annotations

import asyncio
from collections import deque


class PtySession:
    """Output of one PTY as received from ``GET /pty/{pid}/stream``, buffered until read."""

    def __init__(self, pid: int, limit: int) -> None:
        self.pid = pid
        self.limit = limit
        self.chunks: deque[bytes] = deque()
        self.size = 0
        self.dropped = 0
        self.exited = False
        self.exit_code: int | None = None
        self.changed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def push(self, data: bytes) -> None:
        if not data:
            return
        self.chunks.append(data)
        self.size += len(data)
        while self.size > self.limit:
            head = self.chunks[0]
            excess = self.size - self.limit
            if len(head) <= excess:
                self.chunks.popleft()
                self.size -= len(head)
                self.dropped += len(head)
            else:
                self.chunks[0] = head[excess:]
                self.size -= excess
                self.dropped += excess
        self.changed.set()

    def finish(self, code: int | None) -> None:
        """The process exited with ``code``, or (None) the stream broke and its exit is unknown."""
        if not self.exited:
            self.exited = True
            self.exit_code = code
        self.changed.set()

    def drain(self, max_bytes: int) -> tuple[bytes, int]:
        out = bytearray()
        while self.chunks and len(out) < max_bytes:
            head = self.chunks.popleft()
            room = max_bytes - len(out)
            if len(head) > room:
                self.chunks.appendleft(head[room:])
                head = head[:room]
            out += head
            self.size -= len(head)
        dropped, self.dropped = self.dropped, 0
        return bytes(out), dropped
