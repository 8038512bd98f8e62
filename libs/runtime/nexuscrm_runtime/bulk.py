"""Multi-row INSERTs whose values are converted per column, not through SQLAlchemy's per-row path.

Admission writes hundreds of Event and EventPayload rows per transaction. For an
``executemany`` SQLAlchemy builds every row's parameters anew (``construct_params``) and runs
each value through its type's bind processor: 28 % of an Ingest transaction's Python on SQLite
(docs/performance.md, "Fourteenth pass"). ``insert_many`` compiles the INSERT once per
table, columns and dialect with SQLAlchemy, keeps each column's bind processor, converts the
rows with them and executes through ``exec_driver_sql``: the same SQL, the same driver call,
and the engine's statement events (deadline, TiDB profile, statement counts) still see it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect

Processor = Callable[[Any], Any] | None


@functools.lru_cache(maxsize=64)
def _prepared(table: sa.Table, columns: tuple[str, ...], dialect: Dialect) -> tuple[str, tuple[Processor, ...], bool]:
    """The INSERT's SQL, each column's bind processor, and whether the driver takes positional parameters."""
    compiled = sa.insert(table).values({name: sa.bindparam(name) for name in columns}).compile(dialect=dialect)
    processors = tuple(table.c[name].type.dialect_impl(dialect).bind_processor(dialect) for name in columns)
    if compiled.positional and tuple(compiled.positiontup or ()) != columns:
        raise ValueError(f"{table.name}: compiled parameter order {compiled.positiontup} is not {columns}")
    return str(compiled), processors, compiled.positional


def insert_many(
    connection: Connection, table: sa.Table, columns: Sequence[str], rows: Sequence[Mapping[str, Any]]
) -> None:
    """Insert ``rows`` (each a mapping with every name of ``columns``) into ``table`` in one driver call."""
    if not rows:
        return
    names = tuple(columns)
    sql, processors, positional = _prepared(table, names, connection.dialect)
    pairs = tuple(zip(names, processors, strict=True))
    converted = [tuple(row[name] if process is None else process(row[name]) for name, process in pairs) for row in rows]
    if positional:
        connection.exec_driver_sql(sql, converted)
    else:
        connection.exec_driver_sql(sql, [dict(zip(names, values, strict=True)) for values in converted])
