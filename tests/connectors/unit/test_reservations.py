"""Closing the claim signal ends every wait, so a stopping Connectors is not held by a long poll."""

from __future__ import annotations

import threading

from nexuscrm_connectors.reservations import Reservations

LONG_WAIT = 600.0  # seconds: far longer than the test may take, so only ``close`` can end it


def test_close_ends_waits_in_progress_and_later_ones() -> None:
    reservations = Reservations(max_waiters=2)
    answers: list[bool] = []
    waiter = threading.Thread(target=lambda: answers.append(reservations.wait(reservations.version(), LONG_WAIT)))
    waiter.start()
    reservations.close()
    waiter.join()
    assert answers == [False]  # nothing was notified: the wait ended because the service stops
    assert reservations.wait(reservations.version(), LONG_WAIT) is False  # and the next one does not wait at all


def test_a_notify_still_wakes_a_waiter_before_close() -> None:
    reservations = Reservations(max_waiters=1)
    seen = reservations.version()
    reservations.notify()
    assert reservations.wait(seen, LONG_WAIT) is True
