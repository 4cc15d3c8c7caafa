"""What a task hook prints or logs, caught per unit while units run side by side in one event loop.

``sys.stdout``/``sys.stderr`` are swapped, while any hook runs, for proxies that write to the buffer of
the hook whose asyncio task (a context variable) is writing, and to the real stream otherwise; a
logging handler on the root logger does the same for log records.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import logging
import sys
from collections.abc import Iterator
from typing import TextIO

_current: contextvars.ContextVar[io.StringIO | None] = contextvars.ContextVar("ale_hook_output", default=None)
_TASKS_LOGGER = "ale_tasks"
"""Task modules are imported as ``ale_tasks.<id>``: their ``logging.getLogger(__name__)`` lands here."""


class _Proxy(io.TextIOBase):
    def __init__(self, real: TextIO) -> None:
        self.real = real

    def write(self, text: str) -> int:
        buffer = _current.get()
        return (buffer if buffer is not None else self.real).write(text)

    def flush(self) -> None:
        if _current.get() is None:
            self.real.flush()

    def isatty(self) -> bool:
        return self.real.isatty()

    def fileno(self) -> int:
        return self.real.fileno()


class _Handler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        buffer = _current.get()
        if buffer is not None:
            buffer.write(self.format(record) + "\n")


_handler = _Handler()
_handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))


class _Installed:
    """How many hooks capture right now, and the real streams while any does."""

    active = 0
    saved: tuple[TextIO, TextIO] | None = None


def _install() -> None:
    _Installed.saved = (sys.stdout, sys.stderr)
    sys.stdout, sys.stderr = _Proxy(sys.stdout), _Proxy(sys.stderr)
    logging.getLogger().addHandler(_handler)
    tasks_logger = logging.getLogger(_TASKS_LOGGER)
    if tasks_logger.level == logging.NOTSET:
        tasks_logger.setLevel(logging.INFO)


def _uninstall() -> None:
    if _Installed.saved is not None:
        sys.stdout, sys.stderr = _Installed.saved
        _Installed.saved = None
    logging.getLogger().removeHandler(_handler)


@contextlib.contextmanager
def capture() -> Iterator[io.StringIO]:
    """Within this block, this asyncio task's (and its children's) prints and log records go to the
    yielded buffer, not to the terminal."""
    if _Installed.active == 0:
        _install()
    _Installed.active += 1
    buffer = io.StringIO()
    token = _current.set(buffer)
    try:
        yield buffer
    finally:
        _current.reset(token)
        _Installed.active -= 1
        if _Installed.active == 0:
            _uninstall()
