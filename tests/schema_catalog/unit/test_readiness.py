"""The readiness probe loop (decision 187): reports each change, bounds a probe, wakes what waits for the database."""

from __future__ import annotations

import threading

from nexuscrm_runtime.readiness import Readiness
from tests.support.waiting import wait_until

INTERVAL = 0.01  # seconds between probes


class Database:
    """A check whose answer the test sets; ``hang`` makes a probe block until released."""

    def __init__(self) -> None:
        self.up = True
        self.hang = threading.Event()
        self.released = threading.Event()
        self.probes = 0

    def check(self) -> bool:
        self.probes += 1
        if self.hang.is_set():
            self.released.wait()
        return self.up


def test_each_change_is_reported_once_and_a_return_wakes_the_listeners() -> None:
    database = Database()
    reports: list[bool] = []
    wakes: list[bool] = []
    readiness = Readiness(database.check, reports.append, interval=INTERVAL)
    readiness.on_ready(lambda: wakes.append(True))
    readiness.start()
    try:
        assert reports == [True]  # the first probe ran before start returned
        database.up = False
        wait_until(lambda: reports == [True, False], "the loss reported")
        seen = database.probes
        wait_until(lambda: database.probes >= seen + 3, "more probes while lost")
        assert reports == [True, False] and wakes == []
        database.up = True
        wait_until(lambda: reports == [True, False, True], "the return reported")
        assert wakes == [True]
    finally:
        readiness.stop()


def test_probes_that_do_not_answer_in_time_are_not_ready_and_at_most_two_run() -> None:
    database = Database()
    reports: list[bool] = []
    readiness = Readiness(database.check, reports.append, interval=INTERVAL, timeout=0.2).start()
    try:
        database.hang.set()
        wait_until(lambda: reports == [True, False], "a hung probe reported not ready")
        wait_until(lambda: database.probes == 3, "a second probe beside the hung one")
        hung = database.probes
        wait_until(lambda: readiness.ready is False and database.probes == hung, "no third probe beside two hung ones")
        database.hang.clear()
        database.released.set()
        wait_until(lambda: reports == [True, False, True], "ready once the database answers again")
        assert database.probes > hung
    finally:
        readiness.stop()
