"""Timestamps as ale-iac writes them: UTC, ISO 8601, with a ``Z``."""

from __future__ import annotations

import datetime as dt
from typing import Literal


def utc_now(timespec: Literal["seconds", "milliseconds"] = "milliseconds") -> str:
    """Now, e.g. ``2026-12-01T04:11:17.231Z`` (or to the second)."""
    return dt.datetime.now(dt.UTC).isoformat(timespec=timespec).replace("+00:00", "Z")
