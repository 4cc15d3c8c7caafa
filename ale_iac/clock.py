"""Timestamps as ale-iac writes them: UTC, ISO 8601, with a ``Z``."""

from __future__ import annotations

import datetime as dt
from typing import Literal


def utc_now(timespec: Literal["seconds", "milliseconds"] = "milliseconds") -> str:
    """Now, e.g. ``2026-12-01T04:11:17.231Z`` (or to the second)."""
    return dt.datetime.now(dt.UTC).isoformat(timespec=timespec).replace("+00:00", "Z")


def ttl_seconds(ttl_hours: float) -> int:
    """A time to live in whole seconds, at least a minute."""
    return max(60, round(ttl_hours * 3600))


def expires_at(ttl_hours: float, start: dt.datetime | None = None) -> dt.datetime:
    """``start`` (default now), floored to the minute, plus the time to live."""
    begin = (start or dt.datetime.now(dt.UTC)).astimezone(dt.UTC).replace(second=0, microsecond=0)
    return begin + dt.timedelta(seconds=ttl_seconds(ttl_hours))


def iso_seconds(at: dt.datetime) -> str:
    """``2026-12-01T04:11:00Z``: a time to the second, as handles and labels carry it."""
    return at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
