"""Waiting on a condition with a deadline, instead of sleeping a fixed time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

DEADLINE = 60.0  # seconds any awaited condition may take
POLL = 0.02  # seconds between checks


def wait_until(
    condition: Callable[[], T],
    what: str,
    timeout: float = DEADLINE,
    *,
    poll: float = POLL,
    failure: Callable[[str], Exception] = AssertionError,
) -> T:
    """Poll ``condition`` until it returns something truthy and return that; fail naming ``what``.

    ``failure`` makes the exception raised at the deadline from its message (``AssertionError``).
    """
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not (value := condition()):
        if time.monotonic() >= deadline:
            raise failure(f"timed out after {timeout:.0f}s waiting for {what}")
        pause.wait(poll)
    return value
