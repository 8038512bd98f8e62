"""The database clock: SQL evaluated by the server, moved only by an offset (decision 118)."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from nexuscrm_runtime import database
from nexuscrm_runtime.clock import TIDB_DIALECT_FLAG, DatabaseClock
from nexuscrm_runtime.database import create_engine, is_sqlite
from tests.support.factories import FakeClock

INVARIANTS_NOT_CHECKED = "the database clock's SQL: reads of the server's time, no projection data"


def test_the_clock_is_the_servers_time_shifted_by_the_offset(engine: sa.Engine) -> None:
    clock = FakeClock()
    with engine.connect() as connection:
        # One statement reads the server's time twice, shifted and not: the offset is the only difference.
        true, shifted = connection.execute(
            sa.select(DatabaseClock().now(), DatabaseClock(offset=dt.timedelta(hours=1, microseconds=500)).now())
        ).one()
        before = clock.read(connection)
        clock.advance(90)
        after = clock.read(connection)
    # SQLite's clock has milliseconds; the servers' microseconds.
    resolution = dt.timedelta(milliseconds=1) if is_sqlite(engine) else dt.timedelta(microseconds=1)
    assert abs(shifted - true - dt.timedelta(hours=1, microseconds=500)) < resolution
    assert after - before >= dt.timedelta(seconds=90)
    assert true.tzinfo is None and after.tzinfo is None  # naive UTC, the stored form


def test_on_tidb_the_clock_is_the_transactions_tso_from_pd() -> None:
    dialect = mysql.dialect()
    setattr(dialect, TIDB_DIALECT_FLAG, True)
    sql = str(sa.select(DatabaseClock().now()).compile(dialect=dialect))
    assert "(@@tidb_current_ts >> 18) * 1000" in sql and "UTC_TIMESTAMP(6)" in sql  # the latter only outside a txn
    assert "tidb_current_ts" not in str(sa.select(DatabaseClock().now()).compile(dialect=mysql.dialect()))


def test_the_engine_asks_the_prerequisites_test_whether_the_server_is_tidb(
    mysql_server_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first connection's server version goes through ``prerequisites.is_tidb``, the one TiDB test."""
    asked: list[str] = []

    def recording(version: str) -> bool:
        asked.append(version)
        return True  # the real MariaDB, taken for TiDB: the clock must then read PD's timestamps

    monkeypatch.setattr(database, "is_tidb", recording)
    engine = create_engine(mysql_server_dsn, pool_size=1)
    try:
        with engine.connect() as connection:
            version = str(connection.execute(sa.select(sa.func.version())).scalar_one())
        # Once, with the handshake's server version (MariaDB 10 prefixes VERSION() with "5.5.5-").
        assert len(asked) == 1 and version in asked[0], (asked, version)
        assert "tidb_current_ts" in str(sa.select(DatabaseClock().now()).compile(dialect=engine.dialect))
    finally:
        engine.dispose()
