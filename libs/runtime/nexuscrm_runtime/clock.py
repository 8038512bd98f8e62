"""Time as the database stores it: naive UTC datetimes with microseconds."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

Clock = Callable[[], dt.datetime]


def utcnow() -> dt.datetime:
    """Return the current UTC time as a naive datetime (the stored form)."""
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)
