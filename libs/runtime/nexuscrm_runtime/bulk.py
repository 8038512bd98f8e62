"""Multi-row INSERTs whose values are converted per column, not through SQLAlchemy's per-row path.

Admission writes hundreds of Event and EventPayload rows per transaction. For an
``executemany`` SQLAlchemy builds every row's parameters anew (``construct_params``) and runs
each value through its type's bind processor, a large share of an Ingest transaction's Python
(measured in docs/performance-log.md, "Fourteenth pass"). ``insert_many`` compiles the INSERT once per
table, columns and dialect with SQLAlchemy, keeps each column's bind processor, converts the
rows with them and executes through ``exec_driver_sql``: the same SQL, the same driver call,
and the engine's statement events (deadline, TiDB profile, statement counts) still see it.
"""

from __future__ import annotations

import copy
import functools
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect


@functools.lru_cache(maxsize=64)
def _prepared(table: sa.Table, columns: tuple[str, ...], dialect: Dialect) -> tuple[str, _RowConverter]:
    """The INSERT's SQL, with positional parameters, and the converter of a row mapping to its values."""
    compiled = (
        sa.insert(table).values({name: sa.bindparam(name) for name in columns}).compile(dialect=_positional(dialect))
    )
    if tuple(compiled.positiontup or ()) != columns:
        raise ValueError(f"{table.name}: compiled parameter order {compiled.positiontup} is not {columns}")
    processors = [table.c[name].type.dialect_impl(dialect).bind_processor(dialect) for name in columns]
    return str(compiled), _RowConverter(columns, tuple((n, p) for n, p in enumerate(processors) if p is not None))


def _positional(dialect: Dialect) -> Dialect:
    """``dialect``, or a copy of it rendering ``%s`` for a ``%(name)s`` driver (PyMySQL takes both).

    Positional rows are tuples: no dictionary per row to build, nor for the driver to escape
    (measured in docs/performance-log.md, "Seventeenth pass").
    """
    if dialect.positional or dialect.paramstyle != "pyformat":
        return dialect
    positional = copy.copy(dialect)
    positional.paramstyle, positional.positional = "format", True
    return positional


class _RowConverter:
    """A row mapping's values in column order, each through its column's bind processor if it has one."""

    def __init__(self, columns: tuple[str, ...], processors: tuple[tuple[int, Callable[[Any], Any]], ...]) -> None:
        self._values = operator.itemgetter(*columns) if len(columns) > 1 else lambda row: (row[columns[0]],)
        self._processors = processors

    def __call__(self, row: Mapping[str, Any]) -> tuple[Any, ...]:
        values = self._values(row)
        if not self._processors:
            return values
        converted = list(values)
        for index, process in self._processors:
            converted[index] = process(converted[index])
        return tuple(converted)


def insert_many(
    connection: Connection, table: sa.Table, columns: Sequence[str], rows: Sequence[Mapping[str, Any]]
) -> None:
    """Insert ``rows`` (each a mapping with every name of ``columns``) into ``table`` in one driver call."""
    if not rows:
        return
    sql, convert = _prepared(table, tuple(columns), connection.dialect)
    connection.exec_driver_sql(sql, [convert(row) for row in rows])
