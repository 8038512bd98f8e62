"""The canonical schema's version, describing the applied schema, and verifying what a feature needs.

Plain functions over an engine: the schema-catalog service answers its RPCs with them, and
every owner that needs a complete schema before serving (cutover, activation) calls them.
"""

from __future__ import annotations

import dataclasses

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from nexuscrm_runtime.database import DatabaseUnavailable, is_unavailable
from nexuscrm_schema import tables
from workqueue.errors import InvalidArgument

NEWEST_VERSION = 15  # the schema-catalog service's migrations reach exactly this version
NATIVE_PROJECTION = "native_projection"
# Native projection needs the complete canonical schema, including WorkItem.ReplayOfWorkId:
# it does not inherit the ordinary WorkItem path's optional-column rolling compatibility.
FEATURES: dict[str, tuple[sa.Table, ...]] = {NATIVE_PROJECTION: tuple(tables.metadata.sorted_tables)}


def current_version(connection: Connection) -> int:
    """The newest applied version, 0 for an empty database."""
    if not sa.inspect(connection).has_table(tables.SchemaVersion.name):
        return 0
    version = connection.execute(sa.select(sa.func.max(tables.SchemaVersion.c.Version))).scalar()
    return int(version or 0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ColumnInfo:
    """A reflected column."""

    name: str
    type: str
    nullable: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class IndexInfo:
    """A reflected index (the primary key is not listed)."""

    name: str
    columns: tuple[str, ...]
    unique: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class TableInfo:
    """A reflected table."""

    name: str
    columns: tuple[ColumnInfo, ...]
    indexes: tuple[IndexInfo, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class SchemaDescription:
    """The applied version and every canonical table present."""

    version: int
    newest_version: int
    tables: tuple[TableInfo, ...]


def describe_schema(engine: Engine) -> SchemaDescription:
    """Reflect the canonical tables that exist in the database.

    Raises ``DatabaseUnavailable`` when the connection is lost: MySQL reflection runs its
    statements with the engine's error events switched off, so the engine-wide conversion
    of lost connections does not reach it.
    """
    try:
        return _describe(engine)
    except sa.exc.DBAPIError as error:
        if is_unavailable(error):
            raise DatabaseUnavailable("database connection lost while reading the schema; retry") from error
        raise


def _describe(engine: Engine) -> SchemaDescription:
    with engine.connect() as connection:
        inspector = sa.inspect(connection)
        present = set(inspector.get_table_names())
        infos = tuple(
            TableInfo(
                name=table.name,
                columns=tuple(
                    ColumnInfo(name=c["name"], type=str(c["type"]), nullable=bool(c["nullable"]))
                    for c in inspector.get_columns(table.name)
                ),
                indexes=tuple(
                    IndexInfo(
                        name=str(i["name"]),
                        columns=tuple(str(c) for c in i["column_names"]),
                        unique=bool(i["unique"]),
                    )
                    for i in inspector.get_indexes(table.name)
                ),
            )
            for table in tables.metadata.sorted_tables
            if table.name in present
        )
        return SchemaDescription(version=current_version(connection), newest_version=NEWEST_VERSION, tables=infos)


def verify_schema(engine: Engine, feature: str) -> list[str]:
    """List every piece ``feature`` needs that the database lacks; empty when complete.

    Pieces are named ``Table``, ``Table.Column`` or ``Table(index)``.
    """
    if feature not in FEATURES:
        raise InvalidArgument(
            f"unknown feature {feature!r}; known features: {', '.join(sorted(FEATURES))}", field="feature"
        )
    described = {t.name: t for t in describe_schema(engine).tables}
    missing: list[str] = []
    for table in FEATURES[feature]:
        info = described.get(table.name)
        if info is None:
            missing.append(table.name)
            continue
        columns = {c.name for c in info.columns}
        missing.extend(f"{table.name}.{c.name}" for c in table.columns if c.name not in columns)
        indexes = {i.name for i in info.indexes}
        missing.extend(
            f"{table.name}({i.name})" for i in sorted(table.indexes, key=lambda i: str(i.name)) if i.name not in indexes
        )
    return missing
