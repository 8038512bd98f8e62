"""WorkItem generations: new ones, the newest per identity, extension and successor links, replay's rows."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from nexuscrm_connectors.queries import DbRow
from nexuscrm_connectors.queries.rows import GenerationRow
from nexuscrm_runtime.bulk import insert_many
from nexuscrm_runtime.clock import NOW_PARAMETER, DatabaseClock
from nexuscrm_schema.relations import PREDECESSOR_STATUS
from nexuscrm_schema.tables import (
    Event,
    WorkItem,
)
from workqueue import WorkStatus
from workqueue.values import WorkItemRow

UNCLAIMED_STATUSES = (WorkStatus.PENDING, WorkStatus.BLOCKED)


# An instant to store or compare with: one the database clock gave this transaction, or the
# database clock itself (``DatabaseClock.now()``) for a statement that reads none first.
Instant = dt.datetime | sa.ColumnElement[dt.datetime]


class Generation(NamedTuple):
    """The columns of a generation that a duplicate's verdict reads (named as WorkItem's)."""

    WorkId: str
    InputStartOrdinal: int | None
    LaneOrdinal: int
    Status: str


@dataclasses.dataclass(frozen=True, slots=True)
class WorkRow:
    """A WorkItem row: every column, in the table's order (checked below), so ``WorkRow(*row)`` reads one."""

    WorkId: str
    PackInstallId: str
    ProjectionKey: str
    WorkType: str
    InputStartOrdinal: int | None
    LaneOrdinal: int
    ReplayOfWorkId: str | None
    Status: str
    Attempt: int
    MaxAttempts: int
    ClaimableAt: dt.datetime | None
    LeaseOwner: str | None
    LeaseToken: str | None
    LeaseExpiresAt: dt.datetime | None
    LastError: str | None
    CreatedAt: dt.datetime
    FinishedAt: dt.datetime | None
    SuccessorWorkId: str | None
    ClaimedMemberCount: int | None
    AdmittedMemberCount: int | None
    AdmittedThroughOrdinal: int | None
    RunsBeforeWorkId: str | None
    ClaimedAt: dt.datetime | None
    FlowVersion: str | None
    InputKey: str | None
    BuildRun: bool | None

    @property
    def member_key(self) -> str:
        """The projection key of its members: a Flow version's generation reads its inputs' key (decision 185)."""
        return self.InputKey or self.ProjectionKey


# The projection key of a WorkItem's members, in SQL (``WorkRow.member_key``).
MEMBER_KEY = sa.func.coalesce(WorkItem.c.InputKey, WorkItem.c.ProjectionKey)


if tuple(field.name for field in dataclasses.fields(WorkRow)) != tuple(WorkItem.c.keys()):
    raise RuntimeError("WorkRow's fields are not WorkItem's columns in table order")


@dataclasses.dataclass(frozen=True, slots=True)
class HeldWork(WorkRow):
    """A WorkItem row read with the database clock's now (``Now``): the instant its caller decides with."""

    Now: dt.datetime


class Positioned(Protocol):
    """A generation's place in its identity, what finishing it reads: a ``WorkRow`` or a claim candidate."""

    @property
    def WorkId(self) -> str: ...

    @property
    def PackInstallId(self) -> str: ...

    @property
    def ProjectionKey(self) -> str: ...

    @property
    def LaneOrdinal(self) -> int: ...

    @property
    def SuccessorWorkId(self) -> str | None: ...

    @property
    def BuildRun(self) -> bool | None: ...

    @property
    def member_key(self) -> str: ...

    @property
    def RunsBeforeWorkId(self) -> str | None: ...


class NewestGeneration(NamedTuple):
    """The newest generation of an identity, locked, with what admission decides on (``work_items_newest``).

    ``RunsBeforeWorkId`` set: a replay that runs before a held generation,
    never extended and never linked behind: admission goes on from ``work_items_tail``.
    """

    WorkId: str
    ProjectionKey: str
    Status: str
    Attempt: int
    RunsBeforeWorkId: str | None
    BuildRun: bool | None = None


GENERATION_COLUMNS = (WorkItem.c.WorkId, WorkItem.c.InputStartOrdinal, WorkItem.c.LaneOrdinal, WorkItem.c.Status)


def identity_generation(column: sa.Column[Any], *, covering: bool) -> sa.ScalarSelect[Any]:
    """``column`` of one generation of the outer Event's identity: one seek of ix_workitem_projection_order.

    The identity's newest generation (the top of its range), or with ``covering`` the first
    one ending at or above the Event's ordinal (a correlated range: SQLite plans it per Event,
    MariaDB does not, see ``work_items_covering``).
    """
    conditions = [WorkItem.c.PackInstallId == Event.c.PackInstallId, WorkItem.c.ProjectionKey == Event.c.ProjectionKey]
    if covering:
        conditions.append(WorkItem.c.LaneOrdinal >= Event.c.EnqueueOrdinal)
    order = WorkItem.c.LaneOrdinal if covering else WorkItem.c.LaneOrdinal.desc()
    return sa.select(column).where(*conditions).order_by(order).limit(1).correlate(Event).scalar_subquery()


# The newest generation of each identity that has an Event in an ordinal range of a pack
# (the Events of the batch being admitted, inserted before any generation of the batch): one
# correlated seek to the top of the identity's ix_workitem_projection_order range per Event.
_NEWEST_SEEK = (
    sa.select(
        sa.select(WorkItem.c.WorkId)
        .where(WorkItem.c.PackInstallId == Event.c.PackInstallId, WorkItem.c.ProjectionKey == Event.c.ProjectionKey)
        .order_by(WorkItem.c.LaneOrdinal.desc())
        .limit(1)
        .correlate(Event)
        .scalar_subquery()
    )
    .where(
        Event.c.PackInstallId == sa.bindparam("pack_install_id"),
        Event.c.EnqueueOrdinal.between(sa.bindparam("first_ordinal"), sa.bindparam("last_ordinal")),
        Event.c.ProjectionKey.in_(sa.bindparam("keys", expanding=True)),
    )
    .distinct()
)


# Locks the newest generations by primary key and reads what admission decides on.
_NEWEST_LOCK = (
    sa.select(
        WorkItem.c.WorkId,
        WorkItem.c.ProjectionKey,
        WorkItem.c.Status,
        WorkItem.c.Attempt,
        WorkItem.c.RunsBeforeWorkId,
        WorkItem.c.BuildRun,
    )
    .where(WorkItem.c.WorkId.in_(sa.bindparam("work_ids", expanding=True)))
    .with_for_update()
)


def work_items_newest(
    connection: Connection,
    pack_install_id: str,
    ordinals: range,
    projection_keys: Iterable[str],
    known: Mapping[str, str] | None = None,
) -> dict[str, NewestGeneration]:
    """The newest generation of each identity, locked: its WorkId, ProjectionKey, Status and Attempt.

    ``ordinals`` are the Events just inserted for ``projection_keys`` (a batch or a replay),
    before any generation of theirs. ``known`` maps identities to the WorkId of their newest
    generation when the caller knows it; the others are found by one statement of correlated
    seeks, one per Event of the range (``_NEWEST_SEEK``): the cost follows the batch, never
    the identities' retained history (a GROUP BY max reads every retained generation on
    engines without a loose index scan, such as TiDB and SQLite). Then all those rows FOR
    UPDATE by primary key: at most two statements, whatever the batch's size.
    """
    known = known or {}
    unknown = sorted(set(projection_keys) - known.keys())
    work_ids = list(known.values())
    if unknown:
        parameters = {
            "pack_install_id": pack_install_id,
            "first_ordinal": ordinals[0],
            "last_ordinal": ordinals[-1],
            "keys": unknown,
        }
        work_ids += (work_id for work_id in connection.execute(_NEWEST_SEEK, parameters).scalars() if work_id)
    if not work_ids:
        return {}
    rows = connection.execute(_NEWEST_LOCK, {"work_ids": work_ids})
    return {row.ProjectionKey: row for row in map(NewestGeneration._make, rows)}


def work_items_tail(
    connection: Connection, pack_install_id: str, projection_keys: Iterable[str]
) -> dict[str, NewestGeneration]:
    """The newest generation of each identity that is not a replay run first, locked.

    Read for the identities whose newest generation is such a replay (rare), and for the keys of
    Flow versions' tracks, which no Event carries: per identity one seek down
    ix_workitem_projection_order past those replays, then the rows FOR UPDATE.
    """
    seek = (
        sa.select(WorkItem.c.WorkId)
        .where(
            WorkItem.c.PackInstallId == pack_install_id,
            WorkItem.c.ProjectionKey == sa.bindparam("key"),
            WorkItem.c.RunsBeforeWorkId.is_(None),
        )
        .order_by(WorkItem.c.LaneOrdinal.desc())
        .limit(1)
    )
    work_ids = [
        work_id for key in sorted(projection_keys) if (work_id := connection.execute(seek, {"key": key}).scalar())
    ]
    if not work_ids:
        return {}
    rows = connection.execute(_NEWEST_LOCK, {"work_ids": work_ids})
    return {row.ProjectionKey: row for row in map(NewestGeneration._make, rows)}


def work_item_above(connection: Connection, work: WorkRow) -> DbRow | None:
    """The generation of ``work``'s identity just above it (WorkId, Status), replays run first aside; locked."""
    return connection.execute(
        sa.select(WorkItem.c.WorkId, WorkItem.c.Status)
        .where(
            WorkItem.c.PackInstallId == work.PackInstallId,
            WorkItem.c.ProjectionKey == work.ProjectionKey,
            WorkItem.c.LaneOrdinal > work.LaneOrdinal,
            WorkItem.c.RunsBeforeWorkId.is_(None),
        )
        .order_by(WorkItem.c.LaneOrdinal)
        .limit(1)
        .with_for_update()
    ).first()


def work_item_statuses(connection: Connection, work_ids: Sequence[str]) -> dict[str, str]:
    """The status of each of ``work_ids`` that exists (primary key)."""
    if not work_ids:
        return {}
    rows = connection.execute(sa.select(WorkItem.c.WorkId, WorkItem.c.Status).where(WorkItem.c.WorkId.in_(work_ids)))
    return {row.WorkId: row.Status for row in rows}


def work_items_insert(connection: Connection, rows: Sequence[GenerationRow] | Sequence[Mapping[str, Any]]) -> None:
    """Insert new generations: one multi-row INSERT per set of columns the rows have, in any order.

    Admission and replay pass ``GenerationRow``s (a Flow version's carry three more columns);
    seeds of history pass rows with more columns.
    """
    groups: dict[frozenset[str], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(frozenset(row), []).append(row)
    for columns, same in groups.items():
        # The table's column order, which the INSERT's parameters follow (``insert_many``).
        insert_many(connection, WorkItem, tuple(name for name in WorkItem.c.keys() if name in columns), same)


@functools.lru_cache(maxsize=16)
def _extend_statement(size: int) -> sa.Update:
    """The extension UPDATE of ``size`` generations; built once per size.

    Parameters: ``pack_install_id``, ``first_ordinal``, ``last_ordinal``, and ``work_<n>`` /
    ``bound_<n>`` / ``added_<n>`` for n < ``size`` (per-call statements are built once:
    docs/performance.md, "Tuning notes formerly in docs/decisions").

    The admitted count grows by the members added only while it is trusted (LaneOrdinal at or
    below AdmittedThroughOrdinal), and then counts through the batch's last
    ordinal (one parameter for every row: no third CASE); otherwise a release that knows only
    schema v10 extended the range and both count columns become NULL (unknown). The
    assignments are ordered so that each reads only columns not yet assigned: MySQL and
    MariaDB evaluate SET left to right with the values already assigned, SQLite and TiDB with
    the old ones; both then agree.
    """
    pairs: list[tuple[sa.BindParameter[Any], sa.BindParameter[Any]]] = [
        (sa.bindparam(f"work_{n}"), sa.bindparam(f"bound_{n}")) for n in range(size)
    ]
    added: list[tuple[sa.BindParameter[Any], sa.BindParameter[Any]]] = [
        (work_id, sa.bindparam(f"added_{n}")) for n, (work_id, _) in enumerate(pairs)
    ]
    counted = WorkItem.c.LaneOrdinal <= WorkItem.c.AdmittedThroughOrdinal
    return (
        sa.update(WorkItem)
        .where(
            WorkItem.c.WorkId.in_([work_id for work_id, _ in pairs]),
            WorkItem.c.PackInstallId == sa.bindparam("pack_install_id"),
            WorkItem.c.Status.in_(UNCLAIMED_STATUSES),
            WorkItem.c.Attempt == 0,
            WorkItem.c.LaneOrdinal < sa.bindparam("first_ordinal"),
        )
        .ordered_values(
            (
                WorkItem.c.AdmittedMemberCount,
                sa.case((counted, WorkItem.c.AdmittedMemberCount + sa.case(*added, value=WorkItem.c.WorkId))),
            ),
            (WorkItem.c.AdmittedThroughOrdinal, sa.case((counted, sa.bindparam("last_ordinal")))),
            (WorkItem.c.LaneOrdinal, sa.case(*pairs, value=WorkItem.c.WorkId)),
        )
    )


def work_items_extend(
    connection: Connection,
    pack_install_id: str,
    new_bounds: Mapping[str, tuple[int, int]],
    first_ordinal: int,
    last_ordinal: int,
) -> int:
    """Raise the upper bounds of unclaimed attempt-zero generations in one statement (invariant B).

    ``new_bounds`` maps WorkId to its new LaneOrdinal (its identity's newest input of the
    batch) and the number of the batch's inputs it gains; ``first_ordinal`` and
    ``last_ordinal`` are the batch's first and last allocated ordinals. A generation changes
    only if it is still pending or blocked at attempt zero with a bound below the batch; its
    admitted member count grows with it (``_extend_statement``). Primary-key lookups; the
    statement's only per-generation parts are two CASEs. Returns how many changed; the caller
    expects all.

    The pairs are padded to a power of two by repeating the last one (a repeated WorkId
    changes nothing twice), so a few cached statements serve every batch size.
    """
    if not new_bounds:
        return 0
    pairs = list(new_bounds.items())
    size = 1 << (len(pairs) - 1).bit_length()
    pairs += pairs[-1:] * (size - len(pairs))
    parameters: dict[str, Any] = {
        "pack_install_id": pack_install_id,
        "first_ordinal": first_ordinal,
        "last_ordinal": last_ordinal,
    }
    for n, (work_id, (bound, added)) in enumerate(pairs):
        parameters[f"work_{n}"] = work_id
        parameters[f"bound_{n}"] = bound
        parameters[f"added_{n}"] = added
    return connection.execute(_extend_statement(size), parameters).rowcount


@functools.lru_cache(maxsize=16)
def _link_statement(size: int) -> sa.Update:
    """The successor-link UPDATE of ``size`` predecessors; built once per size (see ``_extend_statement``)."""
    pairs: list[tuple[sa.BindParameter[Any], sa.BindParameter[Any]]] = [
        (sa.bindparam(f"work_{n}"), sa.bindparam(f"successor_{n}")) for n in range(size)
    ]
    return (
        sa.update(WorkItem)
        .where(
            WorkItem.c.WorkId.in_([work_id for work_id, _ in pairs]),
            WorkItem.c.Status.not_in([WorkStatus.COMPLETED, WorkStatus.FAILED]),
            WorkItem.c.SuccessorWorkId.is_(None),
        )
        .values(SuccessorWorkId=sa.case(*pairs, value=WorkItem.c.WorkId))
    )


def work_items_link_successors(connection: Connection, successors: Mapping[str, str]) -> int:
    """Record on each nonterminal predecessor the blocked generation just created behind it; one statement.

    ``successors`` maps predecessor WorkId to successor WorkId. This is the write that makes
    the blocking decision safe on a multi-primary engine (decision 106): the predecessor row
    is the row its completion (or failure) writes, so the admission that read it as
    nonterminal and the transaction that makes it terminal write the same row and cannot
    both commit; on one server the admission's row lock serializes them already. A
    predecessor changes only while it is not terminal and has no successor yet. Primary-key
    lookups; returns how many changed, the caller expects all. Padded like ``work_items_extend``.
    """
    if not successors:
        return 0
    pairs = list(successors.items())
    size = 1 << (len(pairs) - 1).bit_length()
    pairs += pairs[-1:] * (size - len(pairs))
    parameters: dict[str, Any] = {}
    for n, (work_id, successor) in enumerate(pairs):
        parameters[f"work_{n}"] = work_id
        parameters[f"successor_{n}"] = successor
    return connection.execute(_link_statement(size), parameters).rowcount


def work_item_get(connection: Connection, work_id: str, *, lock: bool = False) -> WorkRow | None:
    """One WorkItem by primary key, optionally locked."""
    row = connection.execute(_work_item_statement(lock, False), {"work_id": work_id}).first()
    return None if row is None else WorkRow(*row)


def work_item_held(
    connection: Connection, work_id: str, clock: DatabaseClock, *, lock: bool = False
) -> HeldWork | None:
    """``work_item_get`` with ``clock``'s now as ``Now``."""
    statement = _work_item_statement(lock, True)
    row = connection.execute(statement, {"work_id": work_id, **clock.parameters()}).first()
    return None if row is None else HeldWork(*row)


@functools.lru_cache(maxsize=4)
def _work_item_statement(lock: bool, clocked: bool) -> sa.Select[Any]:
    """``work_item_get``'s statement; built once per shape. Parameters: ``work_id`` (and the clock's)."""
    columns: list[Any] = [WorkItem, NOW_PARAMETER.label("Now")] if clocked else [WorkItem]
    statement = sa.select(*columns).where(WorkItem.c.WorkId == sa.bindparam("work_id"))
    return statement.with_for_update() if lock else statement


def work_item_value(row: WorkRow) -> WorkItemRow:
    """The value of a WorkItem row."""
    return WorkItemRow(
        work_id=row.WorkId,
        pack_install_id=row.PackInstallId,
        projection_key=row.ProjectionKey,
        work_type=row.WorkType,
        input_start_ordinal=row.InputStartOrdinal,
        lane_ordinal=row.LaneOrdinal,
        replay_of_work_id=row.ReplayOfWorkId,
        status=WorkStatus(row.Status),
        attempt=row.Attempt,
        max_attempts=row.MaxAttempts,
        claimable_at=row.ClaimableAt,
        lease_owner=row.LeaseOwner,
        lease_token=row.LeaseToken,
        lease_expires_at=row.LeaseExpiresAt,
        last_error=row.LastError,
        created_at=row.CreatedAt,
        finished_at=row.FinishedAt,
        flow_version=row.FlowVersion,
        build_run=bool(row.BuildRun),
    )


def work_items_get(connection: Connection, work_ids: Collection[str]) -> dict[str, WorkRow]:
    """WorkItems by primary key (one statement), keyed by WorkId."""
    if not work_ids:
        return {}
    rows = connection.execute(sa.select(WorkItem).where(WorkItem.c.WorkId.in_(work_ids)))
    return {row.WorkId: WorkRow(*row) for row in rows}


_SUCCESSOR = (
    sa.select(WorkItem.c.WorkId, WorkItem.c.Status)
    .where(
        WorkItem.c.PackInstallId == sa.bindparam("pack_install_id"),
        WorkItem.c.ProjectionKey == sa.bindparam("projection_key"),
        WorkItem.c.LaneOrdinal > sa.bindparam("lane_ordinal"),
    )
    .order_by(WorkItem.c.LaneOrdinal)
    .limit(1)
)


@functools.lru_cache(maxsize=16)
def _successor_seeks(size: int) -> sa.CompoundSelect[*tuple[Any, ...]]:
    """UNION ALL of ``size`` next-generation seeks (ix_workitem_projection_order); built once per size.

    Parameters ``work_<n>``, ``pack_<n>``, ``identity_<n>``, ``ordinal_<n>``. Each seek is a
    derived table, so its ORDER BY and LIMIT hold on every engine (SQLite refuses them on a
    compound's members).
    """
    return sa.union_all(
        *(
            sa.select(sa.bindparam(f"work_{n}", type_=sa.String()).label("PredecessorId"), WorkItem.c.WorkId)
            .where(
                WorkItem.c.PackInstallId == sa.bindparam(f"pack_{n}"),
                WorkItem.c.ProjectionKey == sa.bindparam(f"identity_{n}"),
                WorkItem.c.LaneOrdinal > sa.bindparam(f"ordinal_{n}"),
            )
            .order_by(WorkItem.c.LaneOrdinal)
            .limit(1)
            .subquery()
            .select()
            for n in range(size)
        )
    )


def work_items_successors(connection: Connection, rows: Sequence[Positioned]) -> dict[str, str]:
    """The next generation of each row's identity after its LaneOrdinal: predecessor WorkId -> successor WorkId.

    One statement whatever ``len(rows)``: a UNION ALL of index seeks, padded to a power of two
    by repeating the last row (a few cached statements serve every size). A row whose
    identity has no later generation has no entry.
    """
    if not rows:
        return {}
    padded = list(rows)
    size = 1 << (len(padded) - 1).bit_length()
    padded += padded[-1:] * (size - len(padded))
    parameters: dict[str, Any] = {}
    for n, row in enumerate(padded):
        parameters |= {
            f"work_{n}": row.WorkId,
            f"pack_{n}": row.PackInstallId,
            f"identity_{n}": row.ProjectionKey,
            f"ordinal_{n}": row.LaneOrdinal,
        }
    return {found.PredecessorId: found.WorkId for found in connection.execute(_successor_seeks(size), parameters)}


def work_item_successor(
    connection: Connection, pack_install_id: str, projection_key: str, lane_ordinal: int
) -> DbRow | None:
    """The next generation of an identity after ``lane_ordinal`` (ix_workitem_projection_order)."""
    parameters = {"pack_install_id": pack_install_id, "projection_key": projection_key, "lane_ordinal": lane_ordinal}
    return connection.execute(_SUCCESSOR, parameters).first()


def work_items_blocked_page(connection: Connection, pack_install_id: str, after: str, limit: int) -> list[DbRow]:
    """A page of a pack's blocked native generations after WorkId ``after``, with their predecessor's status.

    Keyset pagination by WorkId over ix_workitem_claim's (pack, 'blocked') range (blocked rows
    have no ClaimableAt, so InnoDB reads them in primary-key order), one seek of
    ix_workitem_projection_order per row for the predecessor. ``PredecessorStatus`` is None
    when the identity has no earlier generation.
    """
    return list(
        connection.execute(
            sa.select(WorkItem.c.WorkId, PREDECESSOR_STATUS.label("PredecessorStatus"))
            .where(
                WorkItem.c.PackInstallId == pack_install_id,
                WorkItem.c.Status == WorkStatus.BLOCKED,
                WorkItem.c.InputStartOrdinal.is_not(None),
                WorkItem.c.WorkId > after,
            )
            .order_by(WorkItem.c.WorkId)
            .limit(limit)
        )
    )


# Blocked generations made claimable at ``now`` (``work_items_unblock``).
_UNBLOCK = (
    sa.update(WorkItem)
    .where(WorkItem.c.WorkId.in_(sa.bindparam("work_ids", expanding=True)), WorkItem.c.Status == WorkStatus.BLOCKED)
    .values(Status=WorkStatus.PENDING, ClaimableAt=sa.bindparam("now"))
)


def work_items_unblock(connection: Connection, work_ids: Sequence[str], now: dt.datetime) -> int:
    """Make blocked generations claimable (one UPDATE by primary key); returns how many moved.

    Every completion that has successors runs it: built once (docs/performance.md, "Tuning
    notes formerly in docs/decisions").
    """
    if not work_ids:
        return 0
    return connection.execute(_UNBLOCK, {"work_ids": list(work_ids), "now": now}).rowcount


def work_item_unblock(connection: Connection, work_id: str, now: Instant) -> int:
    """Make a blocked generation claimable: its predecessor became terminal."""
    return connection.execute(
        sa.update(WorkItem)
        .where(WorkItem.c.WorkId == work_id, WorkItem.c.Status == WorkStatus.BLOCKED)
        .values(Status=WorkStatus.PENDING, ClaimableAt=now)
    ).rowcount


def work_item_replay_newest(connection: Connection, work_id: str) -> DbRow | None:
    """The newest replay of ``work_id`` (WorkId, Status), if any (ix_workitem_replay_of).

    Replays of one WorkId never overlap in time, so the newest is the only one that may be live.
    """
    return connection.execute(
        sa.select(WorkItem.c.WorkId, WorkItem.c.Status)
        .where(WorkItem.c.ReplayOfWorkId == work_id)
        .order_by(WorkItem.c.LaneOrdinal.desc())
        .limit(1)
    ).first()
