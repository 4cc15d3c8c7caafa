"""Stand-ins for third-party task SDKs, so that tasks written for them run unchanged.

``cua_bench``: the five names ALE's tasks use (``tasks_config``, ``setup_task``, ``evaluate_task``,
``Task``, ``DesktopSession``), the session over this project's computer-server client. It is importable
as ``cua_bench`` only inside :func:`cua_bench_importable`, and only when the real package is not.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from ale_iac.compat import cua_bench

__all__ = ["cua_bench_importable"]


@contextmanager
def cua_bench_importable() -> Iterator[bool]:
    """While the block runs, ``import cua_bench`` gives the real package if it is importable, else
    :mod:`ale_iac.compat.cua_bench`; yields whether the stand-in is the one in place. Afterwards the
    name is gone again (a module that imported it keeps its reference)."""
    if "cua_bench" in sys.modules or importlib.util.find_spec("cua_bench") is not None:
        yield False
        return
    sys.modules["cua_bench"] = cua_bench
    try:
        yield True
    finally:
        if sys.modules.get("cua_bench") is cua_bench:
            del sys.modules["cua_bench"]
