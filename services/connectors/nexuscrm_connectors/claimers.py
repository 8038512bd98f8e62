"""In-process coordination of concurrent Claim calls: disjoint candidate slices, waiting for work.

The Claim calls of one Connectors process run in parallel RPC handler threads. Left alone,
they all read the same oldest candidates and all but one lose each compare-and-set. So each
claim transaction holds a slot while it runs, the lowest number no other running one holds,
and takes its generations from position ``slot * max_items`` of the oldest claimable ones:
claims of this process that run at the same time take disjoint slices, and a lone claim
still takes the oldest. Claims of other processes are not coordinated; the conditional
UPDATE settles those races.

A claim that found nothing may wait for work. ``notify`` (the facade calls it after this
process admitted work or finished a generation, which may unblock its successor) wakes every
waiting claim at once; work made claimable elsewhere (by another process, a retry coming due,
an expired lease) is found by polling. At most ``max_waiters`` claims wait at once, so that
waiting claims never hold every RPC handler thread.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator


class Claimers:
    """Slots and the work signal of one process's claims; thread-safe."""

    def __init__(self, max_waiters: int) -> None:
        self._changed = threading.Condition()
        self._version = 0  # bumped by every notify: a waiter compares it with what it saw
        self._slots: set[int] = set()
        self._waiters = threading.BoundedSemaphore(max_waiters)

    @contextlib.contextmanager
    def slot(self) -> Iterator[int]:
        """Hold the lowest free slot number for the duration of one claim transaction."""
        with self._changed:
            slot = next(n for n in itertools.count() if n not in self._slots)
            self._slots.add(slot)
        try:
            yield slot
        finally:
            with self._changed:
                self._slots.discard(slot)

    def version(self) -> int:
        """The signal's current version: read it before looking for work, pass it to ``wait``."""
        with self._changed:
            return self._version

    def notify(self) -> None:
        """Wake every waiting claim: work may have become claimable."""
        with self._changed:
            self._version += 1
            self._changed.notify_all()

    def wait(self, seen: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a ``notify`` after the version ``seen`` was read.

        A notify between reading ``seen`` and this call is not lost: it returns at once.
        Returns False at once, without waiting, when ``max_waiters`` claims are waiting already.
        """
        if not self._waiters.acquire(blocking=False):
            return False
        try:
            with self._changed:
                self._changed.wait_for(lambda: self._version != seen, timeout)
        finally:
            self._waiters.release()
        return True
