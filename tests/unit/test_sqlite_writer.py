"""SQLite's writer lock within a process (``nexuscrm_runtime.sqlite_writer``, decision 134).

Each test runs on a real SQLite file through ``database.create_engine``, as every service does.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from nexuscrm_runtime import database
from nexuscrm_runtime.sqlite_writer import SerializedWriterDialect

HANG_GUARD = 30.0  # seconds: a join that outlives this means a lock was never released


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[sa.Engine]:
    engine = database.create_engine(f"sqlite:///{tmp_path / 'writer.db'}")
    with engine.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE t (n INTEGER)")
    yield engine
    engine.dispose()


def writer(engine: sa.Engine) -> threading.Lock:
    dialect = engine.dialect
    assert isinstance(dialect, SerializedWriterDialect)
    return dialect.writer


def test_a_transaction_holds_the_writer_from_begin_until_commit_or_rollback(engine: sa.Engine) -> None:
    assert not writer(engine).locked()
    with engine.begin() as connection:
        connection.execute(sa.text("INSERT INTO t VALUES (1)"))
        assert writer(engine).locked()
    assert not writer(engine).locked()
    with pytest.raises(RuntimeError), engine.begin() as connection:
        connection.execute(sa.text("INSERT INTO t VALUES (2)"))
        raise RuntimeError("abandon")
    assert not writer(engine).locked()
    with engine.connect() as connection:
        assert connection.execute(sa.text("SELECT n FROM t")).scalars().all() == [1]  # the rollback kept nothing


def test_a_read_releases_the_writer_when_its_connection_returns(engine: sa.Engine) -> None:
    with engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM t")).scalar_one() == 0
        assert writer(engine).locked()  # BEGIN IMMEDIATE: reads are transactions too
    assert not writer(engine).locked()


def test_transactions_of_several_threads_run_one_at_a_time_and_lose_nothing(engine: sa.Engine) -> None:
    threads, rounds = 4, 25
    inside, overlaps = [0], [0]
    guard = threading.Lock()

    def insert(base: int) -> None:
        for n in range(rounds):
            with engine.begin() as connection:
                with guard:
                    inside[0] += 1
                    overlaps[0] += inside[0] > 1
                connection.execute(sa.text("INSERT INTO t VALUES (:n)"), {"n": base + n})
                with guard:
                    inside[0] -= 1

    workers = [threading.Thread(target=insert, args=(1000 * t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(HANG_GUARD)
    assert not any(worker.is_alive() for worker in workers)
    assert overlaps == [0]
    with engine.connect() as connection:
        stored = connection.execute(sa.text("SELECT n FROM t ORDER BY n")).scalars().all()
    assert stored == sorted(1000 * t + n for t in range(threads) for n in range(rounds))
    assert not writer(engine).locked()


def test_a_second_transaction_of_the_same_thread_fails_as_locked_instead_of_hanging(engine: sa.Engine) -> None:
    dialect = engine.dialect
    assert isinstance(dialect, SerializedWriterDialect)
    dialect.writer_timeout = 0.05
    with engine.begin() as outer:
        outer.execute(sa.text("INSERT INTO t VALUES (1)"))
        with pytest.raises(sa.exc.OperationalError, match="database is locked") as refused:
            with engine.begin() as inner:
                inner.execute(sa.text("INSERT INTO t VALUES (2)"))
        assert database.is_retryable(refused.value)  # run_transaction retries it as a conflict
        assert writer(engine).locked()  # still the outer transaction's
    assert not writer(engine).locked()
    with engine.connect() as connection:
        assert connection.execute(sa.text("SELECT n FROM t")).scalars().all() == [1]


def test_a_begin_that_sqlite_refuses_releases_the_writer(engine: sa.Engine, tmp_path: Path) -> None:
    other = sqlite3.connect(tmp_path / "writer.db", isolation_level=None)  # another process's writer, in effect
    other.execute("BEGIN IMMEDIATE")
    try:
        with engine.connect() as connection:
            connection.connection.dbapi_connection.execute("PRAGMA busy_timeout=20")
            with pytest.raises(sa.exc.OperationalError, match="database is locked"):
                connection.execute(sa.text("SELECT count(*) FROM t"))
            assert not writer(engine).locked()
    finally:
        other.rollback()
        other.close()
    with engine.begin() as connection:  # the next transaction starts
        connection.execute(sa.text("INSERT INTO t VALUES (3)"))
    assert not writer(engine).locked()
