"""Row checksums: proof that an operation changed no existing row."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import sqlalchemy as sa

Checksums = dict[str, dict[tuple[object, ...], str]]


def row_checksums(
    connection: sa.Connection, table_name: str, columns: Iterable[str] | None = None
) -> dict[tuple[object, ...], str]:
    """Map each row's primary key to a sha256 of its values in ``columns`` (default: all).

    The table is reflected, so rows written under an older schema version can be compared
    after an upgrade on the columns they had.
    """
    table = sa.Table(table_name, sa.MetaData(), autoload_with=connection)
    names = list(columns) if columns is not None else [c.name for c in table.columns]
    # A table without a primary key is keyed by its whole row: identical rows count once.
    key_columns = list(table.primary_key.columns) or list(table.columns)
    result: dict[tuple[object, ...], str] = {}
    for row in connection.execute(sa.select(table).order_by(*key_columns)).mappings():
        digest = hashlib.sha256(repr([(name, row[name]) for name in names]).encode()).hexdigest()
        result[tuple(row[c.name] for c in key_columns)] = digest
    return result


def database_checksums(connection: sa.Connection, table_names: Iterable[str]) -> Checksums:
    """``row_checksums`` of every named table, over all of its current columns."""
    return {name: row_checksums(connection, name) for name in table_names}


def database_digest(bind: sa.Engine | sa.Connection) -> Checksums:
    """``row_checksums`` of EVERY table in the database, all columns: the proof that a call changed nothing.

    The tables are reflected, not listed, so a table added to the schema is covered without
    touching a test. Nothing is left out: no table of the schema changes on a read-only call
    (there is no heartbeat, last-seen or read-lease table; a claim's lease is a WorkItem write).
    """
    if isinstance(bind, sa.Engine):
        with bind.connect() as connection:
            return database_digest(connection)
    return database_checksums(bind, sa.inspect(bind).get_table_names())
