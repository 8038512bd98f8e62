"""Real lock conflicts on the MySQL-protocol server are retried whole; pooled connections come back clean."""

from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from nexuscrm_runtime.database import create_engine, normalize_dsn, run_transaction

INVARIANTS_NOT_CHECKED = "lock conflicts and pooled sessions on scratch tables: no projection data"

pytestmark = pytest.mark.database


@pytest.fixture
def mysql_engine(mysql_server_dsn: str) -> Iterator[sa.Engine]:
    name = f"nxtest_{uuid.uuid4().hex[:12]}"
    admin = create_engine(mysql_server_dsn)
    with admin.begin() as connection:
        connection.exec_driver_sql(f"CREATE DATABASE `{name}`")
    engine = create_engine(normalize_dsn(mysql_server_dsn).set(database=name).render_as_string(hide_password=False))
    with engine.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE t (id INT PRIMARY KEY, v INT NOT NULL)")
        connection.exec_driver_sql("INSERT INTO t VALUES (1, 0), (2, 0)")
    yield engine
    engine.dispose()
    with admin.begin() as connection:
        connection.exec_driver_sql(f"DROP DATABASE `{name}`")
    admin.dispose()


def test_a_real_deadlock_is_retried_and_both_transactions_apply(mysql_engine: sa.Engine) -> None:
    barrier = threading.Barrier(2)
    attempts = {1: 0, 2: 0}
    errors: list[BaseException] = []

    def transfer(first: int, second: int) -> None:
        def work(connection: sa.Connection) -> None:
            attempts[first] += 1
            connection.exec_driver_sql(f"UPDATE t SET v = v + 1 WHERE id = {first}")
            if attempts[first] == 1:
                barrier.wait(timeout=10)  # both hold their first row: lock the other in opposite order
            connection.exec_driver_sql(f"UPDATE t SET v = v + 1 WHERE id = {second}")

        try:
            run_transaction(mysql_engine, work, name="transfer")
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=transfer, args=(1, 2)), threading.Thread(target=transfer, args=(2, 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert attempts[1] + attempts[2] == 3  # exactly one deadlock victim ran again
    with mysql_engine.connect() as connection:
        assert connection.exec_driver_sql("SELECT v FROM t ORDER BY id").scalars().all() == [2, 2]


def _set_all(connection: sa.Connection, *, value: int) -> None:
    connection.exec_driver_sql(f"UPDATE t SET v = {value}")


def _rollbacks(engine: sa.Engine) -> tuple[int, int]:
    """The pooled session's id and the ROLLBACKs it received, read in a committed transaction of its own."""

    def read(connection: sa.Connection) -> tuple[int, int]:
        session = connection.exec_driver_sql("SELECT CONNECTION_ID()").scalar_one()
        status = connection.exec_driver_sql("SHOW SESSION STATUS LIKE 'Com_rollback'").one()
        return int(session), int(status[1])

    return run_transaction(engine, read, name="read")


def test_a_committed_transaction_gives_its_connection_back_without_a_rollback(mysql_engine: sa.Engine) -> None:
    session, before = _rollbacks(mysql_engine)
    for value in (1, 2, 3):
        run_transaction(mysql_engine, functools.partial(_set_all, value=value), name="set")
    assert _rollbacks(mysql_engine) == (session, before)  # one session, and the pool's reset sent no ROLLBACK
    with mysql_engine.connect() as connection:
        assert connection.exec_driver_sql("SELECT v FROM t WHERE id = 1").scalar_one() == 3


def test_a_connection_given_back_inside_a_transaction_is_rolled_back(mysql_engine: sa.Engine) -> None:
    session, before = _rollbacks(mysql_engine)
    raw = mysql_engine.raw_connection()
    cursor = raw.cursor()
    cursor.execute("UPDATE t SET v = 5 WHERE id = 1")  # holds the row's lock, uncommitted
    cursor.close()
    raw.close()  # back to the pool with the transaction open
    assert _rollbacks(mysql_engine) == (session, before + 1)  # the reset rolled it back
    other = create_engine(mysql_engine.url.render_as_string(hide_password=False), pool_size=1)
    try:
        with other.begin() as connection:
            connection.exec_driver_sql("SET SESSION innodb_lock_wait_timeout = 1")
            connection.exec_driver_sql("UPDATE t SET v = v + 1 WHERE id = 1")  # the lock is free
            assert connection.exec_driver_sql("SELECT v FROM t WHERE id = 1").scalar_one() == 1
    finally:
        other.dispose()
