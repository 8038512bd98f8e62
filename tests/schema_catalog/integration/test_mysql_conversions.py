"""A MySQL-protocol engine reads DATETIME and TIMESTAMP values exactly as PyMySQL's own converter does."""

from __future__ import annotations

from collections.abc import Iterator

import pymysql
import pytest
import sqlalchemy as sa
from pymysql.constants import FIELD_TYPE

from nexuscrm_runtime.database import create_engine, normalize_dsn
from nexuscrm_runtime.mysql_conversions import CONVERSIONS

INVARIANTS_NOT_CHECKED = "the driver's DATETIME conversions on scratch tables: no projection data"

pytestmark = pytest.mark.database

# Every form a server sends: no fraction, 3 and 6 digits, a TIMESTAMP column, the range's ends,
# and the zero date PyMySQL answers as text.
SELECT = """
    SELECT CAST('2026-12-02 11:31:32' AS DATETIME), CAST('2026-12-02 11:31:32.5' AS DATETIME(3)),
           CAST('2026-12-02 11:31:32.123456' AS DATETIME(6)), TIMESTAMP'2026-12-02 01:02:03',
           CAST('1000-01-01 00:00:00' AS DATETIME), CAST('9999-12-31 23:59:59.999999' AS DATETIME(6)),
           CAST('0000-00-00 00:00:00' AS DATETIME), CAST(NULL AS DATETIME), NOW(6), CURRENT_TIMESTAMP(6)
"""


@pytest.fixture
def server(mysql_server_dsn: str) -> Iterator[sa.Engine]:
    engine = create_engine(str(normalize_dsn(mysql_server_dsn).set(database=None)))
    yield engine
    engine.dispose()


def test_datetimes_read_as_pymysql_reads_them(server: sa.Engine) -> None:
    with server.connect() as connection:
        ours = connection.exec_driver_sql(SELECT).one()
        raw = connection.connection.dbapi_connection
        assert raw is not None
        assert raw.decoders[FIELD_TYPE.DATETIME] is CONVERSIONS[FIELD_TYPE.DATETIME]  # the engine reads with ours
        stock = pymysql.connect(
            host=raw.host, port=raw.port, user=raw.user, password=raw.password, conv=pymysql.converters.conversions
        )
    try:
        with stock.cursor() as cursor:
            cursor.execute(SELECT)
            theirs = cursor.fetchone()
    finally:
        stock.close()
    assert ours[:8] == theirs[:8]
    assert ours[6] == "0000-00-00 00:00:00"  # the zero date stays text, as PyMySQL answers it
    assert all(type(a) is type(b) for a, b in zip(ours, theirs, strict=True))
