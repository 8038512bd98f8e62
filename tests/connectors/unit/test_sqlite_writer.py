"""SQLite's writer lock within a process (``nexuscrm_runtime.sqlite_writer``, decisions 134 and 136).

Each test runs on a real SQLite file through ``database.create_engine``, as every service does.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from nexuscrm_runtime import database, sqlite_writer
from nexuscrm_runtime.sqlite_writer import SerializedWriterDialect, WriterLock
from nexuscrm_schema_catalog import migrations
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants
from tests.support.waiting import wait_until
from workqueue.values import Outcome

HANG_GUARD = 30.0  # seconds: a join that outlives this means a lock was never released


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[sa.Engine]:
    engine = database.create_engine(f"sqlite:///{tmp_path / 'writer.db'}")
    with engine.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE t (n INTEGER)")
    yield engine
    engine.dispose()


def writer(engine: sa.Engine) -> WriterLock:
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


def _queue(lock: WriterLock, order: list[str], name: str, *, urgent: bool) -> threading.Thread:
    """A thread that waits for ``lock``, notes ``name`` in ``order`` once it has it, and releases it."""

    def take() -> None:
        assert lock.acquire(urgent=urgent, timeout=HANG_GUARD)
        order.append(name)
        lock.release()

    thread = threading.Thread(target=take)
    thread.start()
    return thread


def _wait_for_waiters(lock: WriterLock, count: int) -> None:
    wait_until(lambda: lock.waiting == count, f"{count} waiters to queue")


def _grant_order(first_urgent: bool, queued: list[tuple[str, bool]]) -> list[str]:
    """The order in which ``queued`` waiters (name, urgent), all waiting at once, get the lock after a holder."""
    lock, order = WriterLock(), list[str]()
    assert lock.acquire(urgent=first_urgent, timeout=1)
    threads = []
    for count, (name, urgent) in enumerate(queued, start=1):
        threads.append(_queue(lock, order, name, urgent=urgent))
        _wait_for_waiters(lock, count)  # queued in this order
    lock.release()
    for thread in threads:
        thread.join(HANG_GUARD)
    assert not any(thread.is_alive() for thread in threads)
    assert not lock.locked() and lock.waiting == 0
    return order


def test_an_urgent_waiter_goes_before_ordinary_ones_that_waited_longer() -> None:
    order = _grant_order(False, [("ordinary-1", False), ("ordinary-2", False), ("urgent", True)])
    assert order[0] == "urgent"
    assert sorted(order[1:]) == ["ordinary-1", "ordinary-2"]


def test_urgent_and_ordinary_waiters_alternate_so_that_neither_starves() -> None:
    queued = [("ordinary-1", False), ("ordinary-2", False), ("urgent-1", True), ("urgent-2", True)]
    order = _grant_order(True, queued)  # an urgent transaction held it: an ordinary one is next
    assert ["urgent" in name for name in order] == [False, True, False, True]
    assert sorted(order) == sorted(name for name, _ in queued)


def test_a_release_hands_the_lock_to_the_waiter_before_the_releaser_can_take_it_back() -> None:
    lock, order = WriterLock(), list[str]()
    assert lock.acquire(urgent=False, timeout=1)
    waiter = _queue(lock, order, "waiter", urgent=False)
    _wait_for_waiters(lock, 1)
    lock.release()
    assert lock.locked()  # the waiter's already, though its thread may not have run yet
    retaken = lock.acquire(urgent=False, timeout=HANG_GUARD)  # queues behind the waiter
    assert retaken and order == ["waiter"]
    lock.release()
    waiter.join(HANG_GUARD)
    assert not lock.locked()


def test_a_waiter_that_times_out_leaves_the_lock_and_the_queue_as_they_were() -> None:
    lock = WriterLock()
    assert lock.acquire(urgent=False, timeout=1)
    assert not lock.acquire(urgent=True, timeout=0.05)
    assert lock.locked() and lock.waiting == 0
    lock.release()
    assert lock.acquire(urgent=False, timeout=1)  # the urgent one that gave up holds no turn
    lock.release()


def test_urgent_applies_to_the_transactions_begun_inside_only(engine: sa.Engine) -> None:
    seen: list[bool] = []
    lock = writer(engine)
    original = lock.acquire

    def record(*, urgent: bool, timeout: float) -> bool:
        seen.append(urgent)
        return original(urgent=urgent, timeout=timeout)

    lock.acquire = record  # type: ignore[method-assign]  # observe the urgency each BEGIN asks for
    with sqlite_writer.urgent(), engine.begin() as connection:
        connection.execute(sa.text("INSERT INTO t VALUES (1)"))
    with engine.begin() as connection:
        connection.execute(sa.text("INSERT INTO t VALUES (2)"))
    assert seen == [True, False]


def test_an_ingest_goes_before_the_workers_transactions_waiting_for_the_writer(tmp_path: Path) -> None:
    engine = database.create_engine(f"sqlite:///{tmp_path / 'queue.db'}")
    try:
        migrations.apply_schema(engine)
        connectors = Connectors(engine)
        pack = install_pack(engine)
        order: list[str] = []
        with engine.begin() as holder:  # an ordinary transaction holds the writer, as a worker's would
            holder.execute(sa.text("SELECT 1"))
            worker = threading.Thread(target=lambda: _background_write(engine, order))
            worker.start()
            wait_until(lambda: writer(engine).waiting == 1, "the background transaction to queue")
            answers: list[Outcome] = []

            def ingest() -> None:
                answers.extend(r.outcome for r in connectors.ingest(pack, items=[delivery("r-1", lane="lane-1")]))
                order.append("ingest")

            client = threading.Thread(target=ingest)
            client.start()
            wait_until(lambda: writer(engine).waiting == 2, "the ingest to queue behind it")
        for thread in (worker, client):
            thread.join(HANG_GUARD)
        assert order == ["ingest", "background"]
        assert answers == [Outcome.ADMITTED]
        assert_invariants(engine)
    finally:
        engine.dispose()


def _background_write(engine: sa.Engine, order: list[str]) -> None:
    with engine.begin() as connection:
        connection.execute(sa.text("SELECT 1"))
    order.append("background")
