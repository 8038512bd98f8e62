"""Versioned, additive migrations of the canonical schema.

Version 1 is the pre-upgrade schema: WorkItem already has ReplayOfWorkId but no
InputStartOrdinal, and there is no protocol table. Version 2 is the additive upgrade of the
specification: a nullable WorkItem.InputStartOrdinal and the immutable
_System_ConnectorProjectionProtocol table. Version 3 adds WorkItem.SuccessorWorkId (decision
106), version 4 PackInstall.ControlVersion (decision 107), version 5
WorkItem.ClaimedMemberCount (decision 110), version 6 the NamespaceControl table (decision
107, amendment), version 7 the retention tables and WorkItem(ix_workitem_retention) (decision
123), version 8 the EventPayload table and Event.PayloadBytes (decision 126), version 9
the duplicate window: three RetentionPolicy columns, a SourceTime column and index on each
of PrunedWork and PrunedReceipt (decision 127), version 10 the payload contract's one-way flag
(decision 130: set at once on a database this apply creates, by the operator otherwise).
Steps only create tables, indexes and nullable columns, each guarded so a repeated or
concurrent run is a no-op, so the previous release keeps running while the schema moves. One
step also copies data: v8 copies every payload into EventPayload (``payload_copy``), in
batches committed one by one after its DDL; the version is recorded when the copy is done, so
an interrupted copy resumes on the next run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import sqlalchemy as sa
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy.engine import Connection, Engine

from nexuscrm_runtime.clock import DATABASE_CLOCK
from nexuscrm_schema import tables
from nexuscrm_schema.verification import NEWEST_VERSION, current_version
from nexuscrm_schema_catalog.payload_contract import set_contract
from nexuscrm_schema_catalog.payload_copy import copy_event_payloads
from workqueue.errors import InvalidArgument

V2_COLUMN = "InputStartOrdinal"
V2_TABLES = (tables.ConnectorProjectionProtocol,)
V3_COLUMN = "SuccessorWorkId"
V4_COLUMN = "ControlVersion"
V5_COLUMN = "ClaimedMemberCount"
V6_TABLES = (tables.NamespaceControl,)
V7_TABLES = (tables.RetentionPolicy, tables.PrunedWork, tables.PrunedReceipt)
V7_INDEX = "ix_workitem_retention"
V8_TABLES = (tables.EventPayload,)
V8_COLUMN = "PayloadBytes"
V10_TABLES = (tables.PayloadContract,)
# Who set the payload contract on a database that ApplySchema created from nothing.
SET_BY_EMPTY_DATABASE = "ApplySchema on an empty database"
V9_COLUMNS = {
    tables.RetentionPolicy: ("DuplicateWindowSeconds", "HorizonSourceTime", "ExpiredReceipts"),
    tables.PrunedWork: ("SourceTime",),
    tables.PrunedReceipt: ("SourceTime",),
}


def _v1_metadata() -> sa.MetaData:
    """The canonical tables as they were at version 1."""
    v1 = sa.MetaData()
    for table in tables.metadata.sorted_tables:
        if table in V2_TABLES + V6_TABLES + V7_TABLES + V8_TABLES + V10_TABLES:
            continue
        if table is tables.WorkItem:
            sa.Table(
                table.name,
                v1,
                *(column._copy() for column in table.columns if column.name not in (V2_COLUMN, V3_COLUMN, V5_COLUMN)),
                *(
                    sa.Index(index.name, *index.columns.keys(), unique=index.unique)
                    for index in table.indexes
                    if index.name != V7_INDEX
                ),
                **tables.MYSQL_TABLE_OPTIONS,
            )
        elif table in (tables.PackInstall, tables.Event):
            sa.Table(
                table.name,
                v1,
                *(column._copy() for column in table.columns if column.name not in (V4_COLUMN, V8_COLUMN)),
                *(sa.Index(index.name, *index.columns.keys(), unique=index.unique) for index in table.indexes),
                **tables.MYSQL_TABLE_OPTIONS,
            )
        else:
            table.to_metadata(v1)
    return v1


def _apply_v1(connection: Connection) -> None:
    _v1_metadata().create_all(connection, checkfirst=True)


def _apply_v2(connection: Connection) -> None:
    columns = {c["name"] for c in sa.inspect(connection).get_columns(tables.WorkItem.name)}
    if V2_COLUMN not in columns:
        operations = Operations(MigrationContext.configure(connection))
        operations.add_column(tables.WorkItem.name, sa.Column(V2_COLUMN, sa.BigInteger, nullable=True))
    tables.metadata.create_all(connection, tables=list(V2_TABLES), checkfirst=True)


def _apply_v3(connection: Connection) -> None:
    columns = {c["name"] for c in sa.inspect(connection).get_columns(tables.WorkItem.name)}
    if V3_COLUMN not in columns:
        operations = Operations(MigrationContext.configure(connection))
        operations.add_column(tables.WorkItem.name, tables.WorkItem.c[V3_COLUMN]._copy())


def _apply_v4(connection: Connection) -> None:
    columns = {c["name"] for c in sa.inspect(connection).get_columns(tables.PackInstall.name)}
    if V4_COLUMN not in columns:
        operations = Operations(MigrationContext.configure(connection))
        operations.add_column(tables.PackInstall.name, tables.PackInstall.c[V4_COLUMN]._copy())


def _apply_v5(connection: Connection) -> None:
    columns = {c["name"] for c in sa.inspect(connection).get_columns(tables.WorkItem.name)}
    if V5_COLUMN not in columns:
        operations = Operations(MigrationContext.configure(connection))
        operations.add_column(tables.WorkItem.name, tables.WorkItem.c[V5_COLUMN]._copy())


def _apply_v6(connection: Connection) -> None:
    tables.metadata.create_all(connection, tables=list(V6_TABLES), checkfirst=True)


def _apply_v7(connection: Connection) -> None:
    # The v7 tables as they were then: v9 adds columns and indexes to them.
    v7 = sa.MetaData()
    for table in V7_TABLES:
        sa.Table(
            table.name,
            v7,
            *(column._copy() for column in table.columns if column.name not in V9_COLUMNS[table]),
            **tables.MYSQL_TABLE_OPTIONS,
        )
    v7.create_all(connection, checkfirst=True)
    indexes = {i["name"] for i in sa.inspect(connection).get_indexes(tables.WorkItem.name)}
    if V7_INDEX not in indexes:
        (index,) = (i for i in tables.WorkItem.indexes if i.name == V7_INDEX)
        index.create(connection)


def _apply_v8(connection: Connection) -> None:
    tables.metadata.create_all(connection, tables=list(V8_TABLES), checkfirst=True)
    columns = {c["name"] for c in sa.inspect(connection).get_columns(tables.Event.name)}
    if V8_COLUMN not in columns:
        operations = Operations(MigrationContext.configure(connection))
        operations.add_column(tables.Event.name, tables.Event.c[V8_COLUMN]._copy())


def _apply_v9(connection: Connection) -> None:
    inspector = sa.inspect(connection)
    operations = Operations(MigrationContext.configure(connection))
    for table, names in V9_COLUMNS.items():
        present = {c["name"] for c in inspector.get_columns(table.name)}
        for name in names:
            if name not in present:
                operations.add_column(table.name, table.c[name]._copy())
        indexes = {i["name"] for i in inspector.get_indexes(table.name)}
        for index in table.indexes:
            if index.name not in indexes:
                index.create(connection)


def _apply_v10(connection: Connection) -> None:
    tables.metadata.create_all(connection, tables=list(V10_TABLES), checkfirst=True)


def _contract_empty_database(connection: Connection) -> None:
    set_contract(connection, SET_BY_EMPTY_DATABASE)


@dataclasses.dataclass(frozen=True)
class Step:
    """One schema version: the additive DDL that reaches it, and the data it copies after that DDL commits."""

    version: int
    name: str
    apply: Callable[[Connection], None]
    copy: Callable[[Engine], object] | None = None
    # Also run in the step's transaction when the apply started from a database without Events.
    on_empty: Callable[[Connection], None] | None = None


STEPS = (
    Step(1, "v1_pre_upgrade_schema", _apply_v1),
    Step(2, "v2_projection_input_ranges", _apply_v2),
    Step(3, "v3_successor_links", _apply_v3),
    Step(4, "v4_pack_control_version", _apply_v4),
    Step(5, "v5_claimed_member_count", _apply_v5),
    Step(6, "v6_namespace_control", _apply_v6),
    Step(7, "v7_retention", _apply_v7),
    Step(8, "v8_event_payload", _apply_v8, copy_event_payloads),
    Step(9, "v9_duplicate_window", _apply_v9),
    Step(10, "v10_payload_contract", _apply_v10, on_empty=_contract_empty_database),
)
if STEPS[-1].version != NEWEST_VERSION:  # the library defines the schema, the steps reach it
    raise RuntimeError(f"migrations end at version {STEPS[-1].version}, the schema library is at {NEWEST_VERSION}")


def apply_schema(engine: Engine, target_version: int = 0) -> tuple[int, int, list[str]]:
    """Migrate forward to ``target_version`` (0 = newest); return (from, to, applied step names).

    Idempotent. Never migrates backwards: a target below the current version changes nothing.
    A step that copies data commits its DDL first, then copies in transactions of its own, and
    is recorded after the copy: interrupted, it is applied again (and resumes) on the next run.
    An apply that starts without an Event table (nothing ever served the database) also runs
    the steps' ``on_empty`` actions: v10 sets the payload contract at once.
    """
    target = target_version or NEWEST_VERSION
    if not 0 < target <= NEWEST_VERSION:
        raise InvalidArgument(
            f"target_version must be between 1 and {NEWEST_VERSION}, got {target_version}",
            field="target_version",
        )
    with engine.connect() as connection:
        start = current_version(connection)
        empty = not sa.inspect(connection).has_table(tables.Event.name)
    applied: list[str] = []
    for step in STEPS:
        if start < step.version <= target:
            with engine.begin() as connection:
                step.apply(connection)
                if empty and step.on_empty is not None:
                    step.on_empty(connection)
                tables.SchemaVersion.create(connection, checkfirst=True)
                if step.copy is None:
                    _record(connection, step)
            if step.copy is not None:
                step.copy(engine)
                with engine.begin() as connection:
                    _record(connection, step)
            applied.append(step.name)
    with engine.connect() as connection:
        return start, current_version(connection), applied


def _record(connection: Connection, step: Step) -> None:
    exists = connection.execute(
        sa.select(tables.SchemaVersion.c.Version).where(tables.SchemaVersion.c.Version == step.version)
    ).first()
    if exists is None:
        connection.execute(
            tables.SchemaVersion.insert().values(
                Version=step.version,
                Step=step.name,
                AppliedAt=DATABASE_CLOCK.now(),
            )
        )
