"""The one bounded polling loop: read a status until it is done, a deadline passes, or a stop.

Every wait of an operator command uses it (the drain wait of ``connector-projection-drain``
over the database, ``nexuscrm drain wait`` over GetDrainStatus, ``nexuscrm-run``'s wait for
the projection): the reading function differs, the deadline arithmetic does not. Time is
injected (``monotonic`` and ``wait``) so tests run it without sleeping.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Polled(Generic[T]):
    """The last status read, and whether it was done (False: the deadline or a stop came first)."""

    status: T
    done: bool


def poll_until(
    read: Callable[[], T],
    done: Callable[[T], bool],
    *,
    timeout: dt.timedelta,
    interval: dt.timedelta,
    on_poll: Callable[[T], None] | None = None,
    stop: threading.Event | None = None,
    monotonic: Callable[[], float] = time.monotonic,
    wait: Callable[[float], bool] | None = None,
) -> Polled[T]:
    """Call ``read`` until ``done(status)``, at most every ``interval``, for at most ``timeout``.

    Reads at least once, and once more after the last wait, so a status that becomes done
    exactly at the deadline is seen. ``on_poll`` sees every status read. ``wait(seconds)``
    sleeps and returns True to end early; by default it is ``stop.wait`` (a signal handler
    sets ``stop``). Never raises for the deadline: the caller maps ``Polled.done`` to its
    outcome (the operator commands: exit code TIMEOUT).
    """
    sleep = wait if wait is not None else (stop or threading.Event()).wait
    deadline = monotonic() + timeout.total_seconds()
    while True:
        status = read()
        if on_poll is not None:
            on_poll(status)
        if done(status):
            return Polled(status=status, done=True)
        remaining = deadline - monotonic()
        if remaining <= 0 or (stop is not None and stop.is_set()):
            return Polled(status=status, done=False)
        if sleep(min(interval.total_seconds(), remaining)):
            return Polled(status=status, done=False)
