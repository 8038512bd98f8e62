"""Reservations of one process's claims: no two take the same rows, and a claim may wait for work.

Claims of one process would otherwise all read the same oldest candidates and lose to each
other's compare-and-set; claims of other processes are settled by the UPDATE (decision 090).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence


class Reservations:
    """The reserved rows and the work signal of one process's claims; thread-safe."""

    def __init__(self, max_waiters: int) -> None:
        self._changed = threading.Condition()
        self._version = 0  # bumped by every notify: a waiter compares it with what it saw
        self._rows = _ReservedRows()  # guarded by self._changed
        self._waiters = threading.BoundedSemaphore(max_waiters)
        self._closed = False  # guarded by self._changed; set once the service stops

    def held(self) -> int:
        """How many rows are reserved now: a candidate read skips at most that many."""
        with self._changed:
            return self._rows.size()

    @contextlib.contextmanager
    def reserving(self) -> Iterator[Callable[[Sequence[str], int], list[str]]]:
        """Yield ``take(work_ids, count)`` for one claim; its reservation ends with the block.

        Enter the block before reading candidates and leave it after the claim's transaction
        ended. ``take`` gives up what an earlier call of the same block reserved (a retried
        transaction chooses again), then reserves and returns the first ``count`` of
        ``work_ids`` that are not reserved for this claim.
        """
        with self._changed:
            ticket = self._rows.begin()
        mine: set[str] = set()

        def take(work_ids: Sequence[str], count: int) -> list[str]:
            with self._changed:
                return self._rows.take(ticket, mine, work_ids, count)

        try:
            yield take
        finally:
            with self._changed:
                self._rows.end(ticket, mine)

    def version(self) -> int:
        """The signal's current version: read it before looking for work, pass it to ``wait``."""
        with self._changed:
            return self._version

    def notify(self) -> None:
        """Wake every waiting claim: work may have become claimable."""
        with self._changed:
            self._version += 1
            self._changed.notify_all()

    def close(self) -> None:
        """End every wait, now and later: the service is stopping.

        A Claim waiting for work would otherwise keep its handler thread, and so the process,
        past the grace period (gRPC cannot cancel Python code); it answers what it has instead.
        """
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def wait(self, seen: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a ``notify`` after the version ``seen`` was read.

        A notify between reading ``seen`` and this call is not lost: it returns at once.
        Returns False at once, without waiting, when ``max_waiters`` claims are waiting already
        or once ``close`` was called (then also ending waits in progress).
        """
        if not self._waiters.acquire(blocking=False):
            return False
        try:
            with self._changed:
                if self._closed:
                    return False
                self._changed.wait_for(lambda: self._version != seen or self._closed, timeout)
                if self._closed:
                    return False
        finally:
            self._waiters.release()
        return True


class _ReservedRows:
    """Reserved rows by WorkId; not thread-safe (``Reservations`` guards it).

    Each claim gets a ticket when it begins, before it reads. A row is reserved while a claim
    holds it (mark None); when that claim ends, the row keeps as its mark the last ticket
    issued then, and stays reserved for claims with a ticket up to that mark: they began
    before the end, so their reads may show the row claimable. It is forgotten once every such
    claim has ended.
    """

    def __init__(self) -> None:
        self._last_ticket = 0
        self._running: set[int] = set()
        self._rows: dict[str, int | None] = {}

    def begin(self) -> int:
        self._last_ticket += 1
        self._running.add(self._last_ticket)
        return self._last_ticket

    def size(self) -> int:
        return len(self._rows)

    def take(self, ticket: int, mine: set[str], work_ids: Sequence[str], count: int) -> list[str]:
        for work_id in mine:
            del self._rows[work_id]
        mine.clear()
        chosen = [work_id for work_id in work_ids if not self._reserved(work_id, ticket)][:count]
        mine.update(chosen)
        self._rows.update(dict.fromkeys(chosen))
        return chosen

    def _reserved(self, work_id: str, ticket: int) -> bool:
        if work_id not in self._rows:
            return False
        mark = self._rows[work_id]
        return mark is None or ticket <= mark

    def end(self, ticket: int, mine: set[str]) -> None:
        self._rows.update(dict.fromkeys(mine, self._last_ticket))
        self._running.discard(ticket)
        oldest = min(self._running, default=self._last_ticket + 1)
        self._rows = {work_id: mark for work_id, mark in self._rows.items() if mark is None or mark >= oldest}
