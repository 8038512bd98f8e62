"""Waiting until a pack's native queue is drained: the loop the client and the in-process facade share.

Callers wait with ``ConnectorsClient.wait_queue_drained`` or ``Connectors.wait_queue_drained``,
which both run it; it needs nothing but workqueue values, so it sits below both.

WaitQueueDrained waits at most the server's bound per call (a waiting call holds a handler
thread), so a caller's deadline is reached by calling it again: ``wait_until_drained`` does
that with ``step(wait)``, one bounded wait, until the queue is drained or ``timeout`` passes.
A step that answered early without a drained queue (the server's waiting places were taken)
is followed by a pause, so the loop never spins.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable

from workqueue.errors import InvalidArgument
from workqueue.values import QueueState

PAUSE = dt.timedelta(milliseconds=250)  # least time between two steps that did not wait


def wait_until_drained(
    step: Callable[[dt.timedelta], QueueState],
    *,
    timeout: dt.timedelta,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> QueueState:
    """The first drained state ``step`` returns, or the last one when ``timeout`` passes first.

    Calls ``step`` at least once (a zero ``timeout`` reads the state once); a negative
    ``timeout`` is refused with ``InvalidArgument``. Time is injected for tests.
    """
    if timeout < dt.timedelta(0):
        raise InvalidArgument(f"timeout must not be negative, got {timeout}", field="timeout")
    deadline = monotonic() + timeout.total_seconds()
    while True:
        started = monotonic()
        state = step(dt.timedelta(seconds=max(0.0, deadline - started)))
        now = monotonic()
        if state.drained or now >= deadline:
            return state
        short = PAUSE.total_seconds() - (now - started)
        if short > 0:
            sleep(min(short, deadline - now))
