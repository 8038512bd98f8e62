"""Real lock conflicts on the MySQL-protocol server are retried as whole transactions."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from nexuscrm_runtime.database import create_engine, normalize_dsn, run_transaction

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
