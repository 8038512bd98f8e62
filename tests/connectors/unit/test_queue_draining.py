"""The SDK's wait for a drained queue: one bounded step after another until drained or the deadline, never a spin."""

from __future__ import annotations

import datetime as dt

import pytest

from workqueue.draining import PAUSE, wait_until_drained
from workqueue.errors import InvalidArgument
from workqueue.values import QueueState

EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def state(pending: int) -> QueueState:
    return QueueState(
        pack_install_id="pk-1",
        pending=pending,
        blocked=0,
        retry=0,
        processing=0,
        receipts_waiting=0,
        oldest_waiting_work_id=None,
        oldest_waiting_since=None,
        oldest_waiting_age=None,
        read_at=EPOCH,
    )


class FakeTime:
    """A monotonic clock that moves only when a step waits or the loop sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_steps_ask_for_the_time_left_and_stop_once_drained() -> None:
    time = FakeTime()
    asked: list[dt.timedelta] = []
    answers = iter([state(3), state(1), state(0)])

    def step(wait: dt.timedelta) -> QueueState:
        asked.append(wait)
        time.now += 20.0  # the server waited its whole bound, 20 s
        return next(answers)

    drained = wait_until_drained(step, timeout=dt.timedelta(minutes=1), monotonic=time.monotonic, sleep=time.sleep)
    assert drained.drained
    assert asked == [dt.timedelta(seconds=60), dt.timedelta(seconds=40), dt.timedelta(seconds=20)]
    assert time.sleeps == []  # every step waited: no pause needed


def test_a_step_that_answers_at_once_is_paused_after_and_the_deadline_is_an_answer() -> None:
    time = FakeTime()
    calls = 0

    def step(wait: dt.timedelta) -> QueueState:  # the server's waiting places are taken: it answers at once
        nonlocal calls
        calls += 1
        return state(1)

    last = wait_until_drained(step, timeout=dt.timedelta(seconds=1), monotonic=time.monotonic, sleep=time.sleep)
    assert not last.drained and last.pending == 1
    assert calls == 5 and time.sleeps == [PAUSE.total_seconds()] * 4  # 4 pauses of 250 ms reach the deadline


def test_a_zero_timeout_reads_once_and_a_negative_one_is_refused() -> None:
    calls: list[dt.timedelta] = []

    def step(wait: dt.timedelta) -> QueueState:
        calls.append(wait)
        return state(2)

    assert not wait_until_drained(step, timeout=dt.timedelta(0)).drained
    assert calls == [dt.timedelta(0)]
    with pytest.raises(InvalidArgument, match="timeout must not be negative") as refused:
        wait_until_drained(step, timeout=dt.timedelta(seconds=-1))
    assert refused.value.field == "timeout"
