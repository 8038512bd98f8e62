"""SQLite's writer between engines and processes (``nexuscrm_runtime.sqlite_file_lock``, decision 171).

Each engine holds its own open file description of ``<database>-writer``, so two engines of
this process meet there exactly as two processes do; one test runs the holder in a child
process and kills it. Every test runs on a real SQLite file through ``database.create_engine``.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from nexuscrm_runtime import database, sqlite_file_lock
from nexuscrm_runtime.sqlite_file_lock import FileWriterLock
from nexuscrm_runtime.sqlite_writer import SerializedWriterDialect
from tests.support.waiting import wait_until

INVARIANTS_NOT_CHECKED = "SQLite's writer lock between engines and processes, on scratch tables"

HANG_GUARD = 30.0  # seconds: a join that outlives this means a lock was never released

# A child process that holds the writer inside an open transaction until it is killed (or its
# standard input closes, should the test itself die first).
HOLDER = """
import sys
from nexuscrm_runtime import database
engine = database.create_engine(f"sqlite:///{sys.argv[1]}")
with engine.begin() as connection:
    connection.exec_driver_sql("INSERT INTO t VALUES ('child')")
    print("holding", flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def path(tmp_path: Path) -> Path:
    path = tmp_path / "shared.db"
    engine = database.create_engine(f"sqlite:///{path}")
    with engine.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE t (name TEXT)")
    engine.dispose()
    return path


@pytest.fixture
def engines(path: Path) -> Iterator[tuple[sa.Engine, sa.Engine]]:
    """Two engines on one file: two claimants of its writer, as two processes would be."""
    pair = (database.create_engine(f"sqlite:///{path}"), database.create_engine(f"sqlite:///{path}"))
    yield pair
    for engine in pair:
        engine.dispose()


def dialect(engine: sa.Engine) -> SerializedWriterDialect:
    assert isinstance(engine.dialect, SerializedWriterDialect)
    return engine.dialect


def names(engine: sa.Engine) -> list[str]:
    with engine.connect() as connection:
        return list(connection.exec_driver_sql("SELECT name FROM t ORDER BY rowid").scalars())


def insert(engine: sa.Engine, name: str) -> None:
    with engine.begin() as connection:
        connection.exec_driver_sql("INSERT INTO t VALUES (?)", (name,))


def test_a_file_database_takes_the_file_lock_and_a_memory_one_does_not(path: Path) -> None:
    engine = database.create_engine(f"sqlite:///{path}")
    memory = database.create_engine("sqlite://")
    try:
        assert dialect(engine).file_writer is not None
        assert Path(sqlite_file_lock.lock_path(str(path))).exists()
        assert dialect(memory).file_writer is None
        with memory.begin() as connection:  # still one writer at a time, within the engine
            assert connection.exec_driver_sql("SELECT 1").scalar_one() == 1
    finally:
        engine.dispose()
        memory.dispose()


def test_a_waiting_engine_starts_once_the_holder_commits(engines: tuple[sa.Engine, sa.Engine], path: Path) -> None:
    first, second = engines
    probe = FileWriterLock(str(path))
    with first.begin() as connection:
        connection.exec_driver_sql("INSERT INTO t VALUES ('first')")
        waiter = threading.Thread(target=insert, args=(second, "second"))
        waiter.start()
        wait_until(probe.contended, "the second engine to wait for the writer")
        assert waiter.is_alive()
    waiter.join(HANG_GUARD)
    assert not waiter.is_alive()
    assert names(first) == ["first", "second"]
    assert not probe.contended()


def test_a_released_writer_goes_to_the_waiting_engine_before_the_releaser_takes_it_again(
    engines: tuple[sa.Engine, sa.Engine], path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_file_lock, "GRACE", HANG_GUARD)  # the protocol, not the scheduler's speed
    first, second = engines
    probe = FileWriterLock(str(path))
    insert(first, "first")  # the first engine has released once before, with nobody waiting
    with first.begin() as connection:
        connection.exec_driver_sql("INSERT INTO t VALUES ('first again')")
        waiter = threading.Thread(target=insert, args=(second, "second"))
        waiter.start()
        wait_until(probe.contended, "the second engine to wait for the writer")
    insert(first, "third")  # at once, in the same thread: it lets the waiter go first
    waiter.join(HANG_GUARD)
    assert names(first) == ["first", "first again", "second", "third"]


def test_an_engine_that_waits_past_its_timeout_fails_as_locked_and_leaves_nothing_behind(
    engines: tuple[sa.Engine, sa.Engine], path: Path
) -> None:
    first, second = engines
    dialect(second).writer_timeout = 0.2
    probe = FileWriterLock(str(path))
    with first.begin() as connection:
        connection.exec_driver_sql("INSERT INTO t VALUES ('first')")
        with pytest.raises(sa.exc.OperationalError, match="database is locked: another process") as refused:
            insert(second, "second")
        assert database.is_retryable(refused.value)  # run_transaction retries it as a conflict
        assert not probe.contended()  # its announcement is gone with it
        assert not dialect(second).writer.locked()  # and its own process's writer is free
    insert(second, "second")  # the next attempt starts as soon as the writer is free
    assert names(first) == ["first", "second"]


def test_one_thread_that_begins_on_a_second_engine_inside_a_transaction_fails_instead_of_hanging(
    engines: tuple[sa.Engine, sa.Engine],
) -> None:
    first, second = engines
    dialect(second).writer_timeout = 0.2
    with first.begin() as connection:
        connection.exec_driver_sql("INSERT INTO t VALUES ('outer')")
        with pytest.raises(sa.exc.OperationalError, match="database is locked"):
            insert(second, "inner")
    assert names(first) == ["outer"]


def test_a_killed_process_holding_the_writer_frees_it_and_its_transaction_is_lost(path: Path) -> None:
    engine = database.create_engine(f"sqlite:///{path}")
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as child:
        try:
            assert child.stdout is not None and child.stderr is not None
            assert child.stdout.readline().strip() == "holding", child.stderr.read()
            dialect(engine).writer_timeout = 0.2
            with pytest.raises(sa.exc.OperationalError, match="database is locked: another process"):
                insert(engine, "refused")
            child.kill()  # the kernel drops its file lock, and SQLite's, with the process
            child.wait(HANG_GUARD)
            dialect(engine).writer_timeout = HANG_GUARD
            insert(engine, "after")
            assert names(engine) == ["after"]  # the child never committed
        finally:
            child.kill()
            engine.dispose()
