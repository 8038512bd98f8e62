"""Time as the database stores it: naive UTC datetimes with microseconds."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import overload

Clock = Callable[[], dt.datetime]


def utcnow() -> dt.datetime:
    """Return the current UTC time as a naive datetime (the stored form)."""
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


@overload
def iso_utc(value: dt.datetime) -> str: ...
@overload
def iso_utc(value: None) -> None: ...
@overload
def iso_utc(value: dt.datetime | None) -> str | None: ...
def iso_utc(value: dt.datetime | None) -> str | None:
    """A UTC timestamp as ISO 8601 with ``Z``: ``2024-05-01T12:00:00.250000Z`` (None stays None).

    Naive values are UTC (the stored form); aware ones are converted to UTC first.
    """
    if value is None:
        return None
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return value.isoformat() + "Z"
