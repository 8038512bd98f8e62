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
(decision 130: set at once on a database this apply creates, by the operator otherwise),
version 11 WorkItem.AdmittedMemberCount and WorkItem.AdmittedThroughOrdinal (decision 149),
version 12 the ClaimPause, OrderPolicy and SkippedWork tables (decisions 158, 160) and the
PrunedWork index ix_prunedwork_identity (decision 161), version 13 the WorkTypeOrderPolicy
table (decision 165) and, on SQLite only, WorkItem(ix_workitem_replay_of) rebuilt as a partial
index of the replays (decision 167), version 14 WorkItem.RunsBeforeWorkId with its index
ix_workitem_runs_before (decision 174), WorkItem.ClaimedAt and the WorkTypeRetryPolicy and
WorkAttempt tables (decision 175), version 15 the Flow version tracks: the FlowVersionTrack and
FlowVersionChange tables and WorkItem.FlowVersion, InputKey and BuildRun (decision 185).
Steps only create tables, indexes and nullable columns (v13's rebuild of one SQLite index
aside: it writes no row), each guarded so a repeated or concurrent run is a no-op, so the
previous release keeps running while the schema moves. No step writes an existing row (decision
150): every Event and WorkItem stays byte for byte as it was, its new columns NULL or
defaulted. After v8 the payload of an Event admitted before it stays in Event.Payload
(PayloadBytes NULL), where every reader finds it; moving it into
EventPayload is the operator's own command (``payload_move``), never a step.

``apply_schema`` is the one migration: the service runs it at start
(NEXUSCRM_APPLY_SCHEMA_ON_START) and for ApplySchema, and ``nexuscrm-schema migrate`` runs it
with an ``Observer`` that shows progress and stops between steps on Ctrl-C
(docs/decisions/145-migrating-without-a-server.md). ``plan`` says what it would run.
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
from workqueue.errors import DomainError, InvalidArgument

V2_COLUMN = "InputStartOrdinal"
V2_TABLES = (tables.ConnectorProjectionProtocol,)
V3_COLUMN = "SuccessorWorkId"
V4_COLUMN = "ControlVersion"
V5_COLUMN = "ClaimedMemberCount"
V6_TABLES = (tables.NamespaceControl,)
V7_TABLES = (tables.RetentionPolicy, tables.PrunedWork, tables.PrunedReceipt)
V7_INDEX = "ix_workitem_retention"
V8_TABLES = (tables.EventPayload,)
V8_COLUMN = tables.Event.c.PayloadBytes.name
V10_TABLES = (tables.PayloadContract,)
V11_COLUMNS = ("AdmittedMemberCount", "AdmittedThroughOrdinal")
V12_TABLES = (tables.ClaimPause, tables.OrderPolicy, tables.SkippedWork)
V13_TABLES = (tables.WorkTypeOrderPolicy,)
V14_TABLES = (tables.WorkTypeRetryPolicy, tables.WorkAttempt)
V14_COLUMNS = ("RunsBeforeWorkId", "ClaimedAt")
V14_INDEX = next(index for index in tables.WorkItem.indexes if index.name == "ix_workitem_runs_before")
V15_TABLES = (tables.FlowVersionTrack, tables.FlowVersionChange)
V15_COLUMNS = ("FlowVersion", "InputKey", "BuildRun")
LATER_TABLES = V12_TABLES + V13_TABLES + V14_TABLES + V15_TABLES
V13_INDEX = next(index for index in tables.WorkItem.indexes if index.name == "ix_workitem_replay_of")  # SQLite: partial
V12_INDEX = next(index for index in tables.PrunedWork.indexes if index.name == "ix_prunedwork_identity")
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
        if table in V2_TABLES + V6_TABLES + V7_TABLES + V8_TABLES + V10_TABLES + LATER_TABLES:
            continue
        if table is tables.WorkItem:
            sa.Table(
                table.name,
                v1,
                *(
                    column._copy()
                    for column in table.columns
                    if column.name not in (V2_COLUMN, V3_COLUMN, V5_COLUMN, *V11_COLUMNS, *V14_COLUMNS, *V15_COLUMNS)
                ),
                *(
                    sa.Index(index.name, *index.columns.keys(), unique=index.unique)
                    for index in table.indexes
                    if index.name not in (V7_INDEX, V14_INDEX.name)
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
            if index.name not in indexes and index is not V12_INDEX:
                index.create(connection)


def _apply_v10(connection: Connection) -> None:
    tables.metadata.create_all(connection, tables=list(V10_TABLES), checkfirst=True)


def _apply_v11(connection: Connection) -> None:
    _add_work_item_columns(connection, V11_COLUMNS)


def _add_work_item_columns(connection: Connection, names: tuple[str, ...]) -> None:
    """Add those of WorkItem's nullable columns ``names`` that the table lacks."""
    columns = {c["name"] for c in sa.inspect(connection).get_columns(tables.WorkItem.name)}
    operations = Operations(MigrationContext.configure(connection))
    for name in names:
        if name not in columns:
            operations.add_column(tables.WorkItem.name, tables.WorkItem.c[name]._copy())


def _apply_v12(connection: Connection) -> None:
    tables.metadata.create_all(connection, tables=list(V12_TABLES), checkfirst=True)
    if V12_INDEX.name not in {i["name"] for i in sa.inspect(connection).get_indexes(tables.PrunedWork.name)}:
        V12_INDEX.create(connection)


def _apply_v13(connection: Connection) -> None:
    tables.metadata.create_all(connection, tables=list(V13_TABLES), checkfirst=True)
    if connection.dialect.name == "sqlite":  # only SQLite has partial indexes; the others keep theirs
        (found,) = (i for i in sa.inspect(connection).get_indexes(tables.WorkItem.name) if i["name"] == V13_INDEX.name)
        if "sqlite_where" not in found.get("dialect_options", {}):
            V13_INDEX.drop(connection)
            V13_INDEX.create(connection)


def _apply_v14(connection: Connection) -> None:
    tables.metadata.create_all(connection, tables=list(V14_TABLES), checkfirst=True)
    _add_work_item_columns(connection, V14_COLUMNS)
    if V14_INDEX.name not in {i["name"] for i in sa.inspect(connection).get_indexes(tables.WorkItem.name)}:
        V14_INDEX.create(connection)


def _apply_v15(connection: Connection) -> None:
    tables.metadata.create_all(connection, tables=list(V15_TABLES), checkfirst=True)
    _add_work_item_columns(connection, V15_COLUMNS)


def _contract_empty_database(connection: Connection) -> None:
    set_contract(connection, SET_BY_EMPTY_DATABASE)


@dataclasses.dataclass(frozen=True)
class Step:
    """One schema version: the additive DDL that reaches it (it writes no existing row)."""

    version: int
    name: str
    apply: Callable[[Connection], None]
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
    Step(8, "v8_event_payload", _apply_v8),
    Step(9, "v9_duplicate_window", _apply_v9),
    Step(10, "v10_payload_contract", _apply_v10, on_empty=_contract_empty_database),
    Step(11, "v11_admitted_member_count", _apply_v11),
    Step(12, "v12_operating_projections", _apply_v12),
    Step(13, "v13_work_type_order_policy", _apply_v13),
    Step(14, "v14_recovery", _apply_v14),
    Step(15, "v15_flow_versions", _apply_v15),
)
if STEPS[-1].version != NEWEST_VERSION:  # the library defines the schema, the steps reach it
    raise RuntimeError(f"migrations end at version {STEPS[-1].version}, the schema library is at {NEWEST_VERSION}")


class SchemaNewerThanKnown(DomainError):
    """The database's schema comes from a newer release than this one: nothing is migrated."""

    def __init__(self, version: int) -> None:
        super().__init__(
            f"database at version {version}, this release knows up to {NEWEST_VERSION}: use the newer nexuscrm-schema"
        )
        self.version = version


class Observer:
    """Told of each step ``apply_schema`` runs; every method does nothing unless overridden.

    A method may raise to stop the apply where it is: each step committed stays, and the next
    apply resumes from there.
    """

    def step_started(self, step: Step) -> None:
        """``step`` begins."""

    def step_applied(self, step: Step) -> None:
        """``step``'s version is recorded."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    """What ``apply_schema`` would do to reach ``target`` from ``current``: the steps, in order."""

    current: int
    target: int
    steps: tuple[Step, ...]


def resolve_target(requested: int) -> int:
    """The version an apply aims at: ``requested``, or the newest for 0; ``InvalidArgument`` outside 1..newest."""
    target = requested or NEWEST_VERSION
    if not 0 < target <= NEWEST_VERSION:
        raise InvalidArgument(
            f"target_version must be between 1 and {NEWEST_VERSION}, got {requested}",
            field="target_version",
        )
    return target


def plan(engine: Engine, target: int = 0) -> Plan:
    """The steps ``apply_schema(engine, target)`` would run now, changing nothing.

    Raises ``InvalidArgument`` for a target outside 1..newest, and ``SchemaNewerThanKnown``
    for a database newer than this release knows (which ``apply_schema`` leaves alone).
    """
    aim = resolve_target(target)
    with engine.connect() as connection:
        start = _known_version(connection)
    return Plan(current=start, target=aim, steps=tuple(_pending(start, aim)))


def apply_schema(
    engine: Engine, target_version: int = 0, *, observer: Observer | None = None
) -> tuple[int, int, list[str]]:
    """Migrate forward to ``target_version`` (0 = newest); return (from, to, applied step names).

    Idempotent. Never migrates backwards: a target below the current version, or a database
    newer than this release knows, changes nothing (``plan`` refuses the latter with
    ``SchemaNewerThanKnown``; the service's schema gate refuses to serve it). Each step's DDL
    and its version commit together; no step writes an existing row. An apply that starts
    without an Event table (nothing ever served the database) also runs the steps'
    ``on_empty`` actions: v10 sets the payload contract at once. ``observer`` is told of each
    step, and may stop the apply between steps.
    """
    aim = resolve_target(target_version)
    seen = observer or Observer()
    with engine.connect() as connection:
        start = current_version(connection)
        empty = not sa.inspect(connection).has_table(tables.Event.name)
    applied: list[str] = []
    for step in _pending(start, aim):
        seen.step_started(step)
        with engine.begin() as connection:
            step.apply(connection)
            if empty and step.on_empty is not None:
                step.on_empty(connection)
            tables.SchemaVersion.create(connection, checkfirst=True)
            _record(connection, step)
        applied.append(step.name)
        seen.step_applied(step)
    with engine.connect() as connection:
        return start, current_version(connection), applied


def _known_version(connection: Connection) -> int:
    """The database's version, refused (``SchemaNewerThanKnown``) when newer than this release knows."""
    version = current_version(connection)
    if version > NEWEST_VERSION:
        raise SchemaNewerThanKnown(version)
    return version


def _pending(start: int, target: int) -> list[Step]:
    return [step for step in STEPS if start < step.version <= target]


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
