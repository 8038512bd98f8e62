"""The whole-transaction retry policy, with DBAPI errors as drivers raise them."""

from __future__ import annotations

import pymysql
import pytest
import sqlalchemy as sa

from nexuscrm_runtime import database
from nexuscrm_runtime.database import DatabaseUnavailable, RetryPolicy, TransactionConflict, run_transaction

INVARIANTS_NOT_CHECKED = "the retry policy with forged driver errors on a scratch table: no projection data"


@pytest.fixture
def engine() -> sa.Engine:
    return database.create_engine("sqlite://")


def driver_error(code: int, message: str) -> sa.exc.OperationalError:
    return sa.exc.OperationalError("UPDATE ...", {}, pymysql.err.OperationalError(code, message))


class FakeTime:
    """A monotonic clock that only ``sleep`` (and each transaction attempt, by ``cost``) moves."""

    def __init__(self, cost: float = 0.0) -> None:
        self.now = 1000.0
        self.cost = cost  # seconds each attempt of the transaction takes
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def policy(self, **overrides: float) -> RetryPolicy:
        return RetryPolicy(clock=self.clock, sleep=self.sleep, jitter=lambda low, high: high, **overrides)


@pytest.mark.parametrize("code", [1213, 1205, 8002, 8022, 9007])
def test_conflicts_are_retried_as_whole_transactions(engine: sa.Engine, code: int) -> None:
    time = FakeTime()
    calls = []

    def work(connection: sa.Connection) -> str:
        calls.append(1)
        if len(calls) < 3:
            raise driver_error(code, "conflict")
        return "done"

    assert run_transaction(engine, work, name="test", retry=time.policy()) == "done"
    assert len(calls) == 3
    assert time.sleeps == [0.01, 0.02]  # exponential ceilings (the jitter here picks the ceiling)


def test_retries_are_bounded_by_total_time_not_by_a_count(engine: sa.Engine) -> None:
    """Conflicts are retried while the next attempt would start within the budget, then the call gives up."""
    time = FakeTime(cost=0.05)
    calls = []

    def work(connection: sa.Connection) -> None:
        calls.append(time.now)
        time.now += time.cost
        raise driver_error(1213, "Deadlock found")

    with pytest.raises(TransactionConflict, match=r"conflicted with concurrent transactions \d+ times .*budget 10s"):
        run_transaction(engine, work, name="test", retry=time.policy(budget=10.0))
    assert calls[-1] - calls[0] < 10.0, "an attempt started after the budget"
    # Sleeps: 0.01, 0.02, ... 0.32, then 0.5 each; each attempt costs 0.05 s.
    assert time.sleeps[:6] == [0.01, 0.02, 0.04, 0.08, 0.16, 0.32]
    assert set(time.sleeps[6:]) == {0.5}
    assert len(calls) > 8, "a multi-writer burst gets more than the old fixed 8 attempts"
    assert time.now - calls[0] < 10.0 + 0.5 + 0.05, "the call ran past its budget by more than one attempt"


def test_a_longer_budget_allows_more_retries_and_a_zero_budget_none(engine: sa.Engine) -> None:
    for budget, expected_calls in [(0.0, 1), (0.02, 2), (1.0, 7)]:  # 1.0: six sleeps 0.01..0.32 fit
        time = FakeTime()
        calls: list[int] = []

        def work(connection: sa.Connection, calls: list[int] = calls) -> None:
            calls.append(1)
            raise driver_error(1213, "Deadlock found")

        with pytest.raises(TransactionConflict):
            run_transaction(engine, work, name="test", retry=time.policy(budget=budget))
        assert len(calls) == expected_calls, budget


def test_retry_sleeps_are_jittered_below_the_ceiling() -> None:
    seen: list[tuple[float, float]] = []

    def jitter(low: float, high: float) -> float:
        seen.append((low, high))
        return (low + high) / 2

    policy = RetryPolicy(clock=lambda: 0.0, jitter=jitter)
    assert policy.delay(1, started=0.0) == 0.005
    assert policy.delay(100, started=0.0) == 0.25  # capped, and no overflow for a long streak
    assert seen == [(0.0, 0.01), (0.0, 0.5)]


def test_retry_policy_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="budget"):
        RetryPolicy(budget=-1.0)
    with pytest.raises(ValueError, match="base_delay"):
        RetryPolicy(base_delay=1.0, max_delay=0.5)


def test_lost_connection_is_unavailable_not_retried(engine: sa.Engine) -> None:
    calls = []

    def work(connection: sa.Connection) -> None:
        calls.append(1)
        raise driver_error(2013, "Lost connection to MySQL server during query")

    with pytest.raises(DatabaseUnavailable, match="retry the request"):
        run_transaction(engine, work, name="test")
    assert len(calls) == 1


def test_other_errors_propagate_unchanged(engine: sa.Engine) -> None:
    def work(connection: sa.Connection) -> None:
        raise driver_error(1064, "syntax error")

    with pytest.raises(sa.exc.OperationalError):
        run_transaction(engine, work, name="test")


def test_engines_hide_parameters_from_error_text() -> None:
    engine = database.create_engine("sqlite://")
    with pytest.raises(sa.exc.OperationalError) as caught, engine.begin() as connection:
        connection.execute(sa.text("INSERT INTO missing VALUES (:secret)"), {"secret": "payload-secret"})
    assert "payload-secret" not in str(caught.value)


@pytest.mark.parametrize("code", [1062, 1586])
def test_a_duplicate_key_is_a_conflict_only_where_the_caller_says_so(engine: sa.Engine, code: int) -> None:
    """Admission and replay: a twin committed through another primary first; the next attempt finds it."""
    time = FakeTime()
    calls = []

    def work(connection: sa.Connection) -> str:
        calls.append(1)
        if len(calls) < 2:
            raise sa.exc.IntegrityError("INSERT ...", {}, pymysql.err.IntegrityError(code, "Duplicate entry 'x'"))
        return "answered as a duplicate"

    with pytest.raises(sa.exc.IntegrityError):  # elsewhere a duplicate key is a bug: not retried
        run_transaction(engine, work, name="test", retry=time.policy())
    assert len(calls) == 1
    calls.clear()
    result = run_transaction(engine, work, name="test", retry=time.policy(), unique_keys_conflict=True)
    assert result == "answered as a duplicate" and len(calls) == 2
