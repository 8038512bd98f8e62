"""Whether the payload contract is set (schema v10, decision 130), cached per engine.

The flag is a fact of the database, read through every connection of its engine, so the
cache lives with the engine, not with one service; it is refreshed outside transactions and
never read again once set (the flag is one-way).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from nexuscrm_schema.tables import PAYLOAD_CONTRACT, PayloadContract

REFRESH_SECONDS = 5.0  # seconds an unset flag is trusted before it is read again


class _Cached:
    def __init__(self) -> None:
        self.held = False
        self.read_at: float | None = None  # time.monotonic() of the last read
        self.lock = threading.Lock()


_CACHE: weakref.WeakKeyDictionary[Engine, _Cached] = weakref.WeakKeyDictionary()
_CACHE_LOCK = threading.Lock()


def _cached(engine: Engine) -> _Cached:
    with _CACHE_LOCK:
        return _CACHE.setdefault(engine, _Cached())


def held(engine: Engine) -> bool:
    """The cached flag: True once this process has seen it set; no statement."""
    return _cached(engine).held


def refresh(engine: Engine, *, now: Callable[[], float] = time.monotonic) -> bool:
    """Read the flag on a connection of its own when unset and stale (or never read); return it.

    A database older than v10 has no flag table: unset.
    """
    cached = _cached(engine)
    with cached.lock:
        if cached.held or (cached.read_at is not None and now() - cached.read_at < REFRESH_SECONDS):
            return cached.held
        with engine.connect() as connection:
            cached.held = sa.inspect(connection).has_table(PayloadContract.name) and (
                connection.execute(
                    sa.select(PayloadContract.c.Contract).where(PayloadContract.c.Contract == PAYLOAD_CONTRACT)
                ).first()
                is not None
            )
        cached.read_at = now()
        return cached.held
