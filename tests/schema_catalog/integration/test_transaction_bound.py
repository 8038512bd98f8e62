"""A transaction attempt never runs (and holds its locks) past its maximum duration (issue 19 item 5).

The bound is enforced by the client on every backend: a statement that would start, or the
commit, after ``max_seconds`` raises ``TransactionTooLong`` (ABORTED) and the attempt rolls
back. The clock is the retry policy's, driven by the test: no sleeps.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from nexuscrm_runtime.database import MAX_TRANSACTION_SECONDS, RetryPolicy, TransactionTooLong, run_transaction
from workqueue.errors import ErrorKind

INVARIANTS_NOT_CHECKED = "the transaction time bound on scratch statements: no projection data"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def policy(self) -> RetryPolicy:
        return RetryPolicy(clock=self, sleep=lambda seconds: None)


@pytest.fixture
def table(empty_engine: sa.Engine) -> sa.Table:
    table = sa.Table("BoundProbe", sa.MetaData(), sa.Column("x", sa.Integer, primary_key=True, autoincrement=False))
    table.create(empty_engine)
    return table


def rows(engine: sa.Engine, table: sa.Table) -> list[int]:
    with engine.connect() as connection:
        return sorted(connection.execute(sa.select(table.c.x)).scalars())


def test_a_statement_past_the_bound_is_refused_and_the_attempt_rolls_back(
    empty_engine: sa.Engine, table: sa.Table
) -> None:
    clock = Clock()

    def work(connection: sa.Connection) -> None:
        connection.execute(sa.insert(table).values(x=1))
        clock.now += MAX_TRANSACTION_SECONDS + 1  # the work stalled (a slow client, a long lock wait)
        connection.execute(sa.insert(table).values(x=2))

    with pytest.raises(
        TransactionTooLong, match=r"^bounded ran longer than its 60 s bound and was rolled back"
    ) as caught:
        run_transaction(empty_engine, work, name="bounded", retry=clock.policy())
    assert caught.value.kind is ErrorKind.ABORTED
    assert rows(empty_engine, table) == []  # nothing committed, the locks went with the rollback


def test_the_commit_past_the_bound_is_refused_too(empty_engine: sa.Engine, table: sa.Table) -> None:
    clock = Clock()

    def work(connection: sa.Connection) -> None:
        connection.execute(sa.insert(table).values(x=1))
        clock.now += 5.5

    with pytest.raises(TransactionTooLong, match="its 5 s bound"):
        run_transaction(empty_engine, work, name="bounded", retry=clock.policy(), max_seconds=5)
    assert rows(empty_engine, table) == []
    # The bound belongs to its attempt: the connection goes back to the pool without it.
    run_transaction(empty_engine, lambda c: c.execute(sa.insert(table).values(x=3)), name="next")
    assert rows(empty_engine, table) == [3]


def test_within_the_bound_or_unbounded_the_transaction_commits(empty_engine: sa.Engine, table: sa.Table) -> None:
    clock = Clock()

    def work(x: int, stall: float) -> None:
        def run(connection: sa.Connection) -> None:
            connection.execute(sa.insert(table).values(x=x))
            clock.now += stall

        run_transaction(empty_engine, run, name="bounded", retry=clock.policy(), max_seconds=None if x == 2 else 10)

    work(1, 9.9)
    work(2, 10_000.0)  # a caller with its own deadline (the cutover) passes None
    assert rows(empty_engine, table) == [1, 2]
