"""``nexuscrm_runtime.bulk.insert_many`` stores what SQLAlchemy's own executemany stores, on every backend."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa

from nexuscrm_runtime.bulk import insert_many
from nexuscrm_schema.tables import Timestamp
from tests.support.statements import capture

INVARIANTS_NOT_CHECKED = "insert_many on scratch tables: a driver-level test, no projection data"

pytestmark = pytest.mark.database

metadata = sa.MetaData()


def _table(name: str) -> sa.Table:
    return sa.Table(
        name,
        metadata,
        sa.Column("Id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("Name", sa.String(40), nullable=True),
        sa.Column("At", Timestamp(), nullable=True),  # microseconds on every backend, as the schema stores times
        sa.Column("Data", sa.LargeBinary, nullable=True),
        sa.Column("Flag", sa.Boolean, nullable=False),
    )


BY_SQLALCHEMY, BY_BULK = _table("BulkBySqlalchemy"), _table("BulkByInsertMany")
ONE_COLUMN = sa.Table("BulkOneColumn", metadata, sa.Column("Id", sa.Integer, primary_key=True, autoincrement=False))
AT = dt.datetime(2026, 12, 1, 12, 30, 15, 123456)


def _rows() -> list[dict[str, Any]]:
    return [
        {"Id": 1, "Name": "plain", "At": AT, "Data": b"\x00\x01'\\\"%s", "Flag": True},
        {"Id": 2, "Name": "it's %(Name)s; DROP TABLE x --", "At": None, "Data": b"", "Flag": False},
        {"Id": 3, "Name": None, "At": AT + dt.timedelta(days=400), "Data": None, "Flag": True},
    ]


def test_insert_many_stores_what_sqlalchemy_stores_in_one_statement(engine: sa.Engine) -> None:
    metadata.create_all(engine)
    try:
        with engine.begin() as connection:
            connection.execute(sa.insert(BY_SQLALCHEMY), _rows())
            with capture(engine) as sent:
                insert_many(connection, BY_BULK, ("Id", "Name", "At", "Data", "Flag"), _rows())
        with engine.connect() as connection:
            stored = [
                connection.execute(sa.select(table).order_by(table.c.Id)).all() for table in (BY_SQLALCHEMY, BY_BULK)
            ]
    finally:
        metadata.drop_all(engine)
    assert [(c.executemany, c.parameter_sets) for c in sent.statements] == [(True, len(_rows()))]
    assert sent.round_trips() == ["INSERT"]  # PyMySQL sends it as one multi-row INSERT
    assert stored[1] == stored[0]
    assert [tuple(row) for row in stored[1]] == [tuple(row.values()) for row in _rows()]


def test_insert_many_of_no_rows_sends_nothing(engine: sa.Engine) -> None:
    with capture(engine) as sent, engine.begin() as connection:
        insert_many(connection, BY_BULK, ("Id",), [])
    assert sent.statements == []


def test_insert_many_takes_a_single_column(engine: sa.Engine) -> None:
    ONE_COLUMN.create(engine)
    try:
        with engine.begin() as connection:
            insert_many(connection, ONE_COLUMN, ("Id",), [{"Id": 7}, {"Id": 8}])
        with engine.connect() as connection:
            stored = connection.execute(sa.select(ONE_COLUMN.c.Id).order_by(ONE_COLUMN.c.Id)).scalars().all()
    finally:
        ONE_COLUMN.drop(engine)
    assert stored == [7, 8]
