"""Every statement the native Connectors runtime runs on Events, WorkItems and receipts.

Builders are named noun + verb. Each states the index it relies on; each state change is
conditional on the state it expects and returns the affected row count for the caller to
check. All take the caller's connection (and so its transaction).
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row

from nexuscrm_connectors import order_queries, payload_contract
from nexuscrm_runtime.bulk import insert_many
from nexuscrm_runtime.clock import NOW_PARAMETER, DatabaseClock
from nexuscrm_schema.hints import probe_exists
from nexuscrm_schema.relations import EVENT_PAYLOAD, EVENT_WITH_PAYLOAD, PREDECESSOR_STATUS
from nexuscrm_schema.tables import (
    Event,
    EventPayload,
    IngressReceipt,
    PackInstall,
    PrunedReceipt,
    PrunedWork,
    WorkItem,
)
from workqueue import EventStatus, ReceiptState, WorkStatus
from workqueue.values import InputRow, WorkItemRow

UNCLAIMED_STATUSES = (WorkStatus.PENDING, WorkStatus.BLOCKED)

DbRow = Row[*tuple[Any, ...]]  # a result row of any shape
# The Payload of a receipt whose input has an Event: the payload is stored once, in the Event
# (the column is NOT NULL; the receipt's State says which receipts still carry theirs).
ADMITTED_RECEIPT_PAYLOAD = b""
# The Payload of an Event admitted under the payload contract: its payload is in EventPayload
# (the column is NOT NULL; Event.PayloadBytes set says where the payload is). Before the
# contract is set, admission also copies it into Event.Payload (decision 130).
EVENT_PAYLOAD_ELSEWHERE = b""
# What a status change leaves in Event.Payload under the contract: emptied once the payload is
# in EventPayload, so the new row version never carries payload bytes; kept when it is the only
# copy (decision 126). Before the contract, a status change leaves Event.Payload alone.
_PAYLOAD_AFTER_STATUS: dict[str, sa.ColumnElement[bytes]] = {
    "Payload": sa.case((Event.c.PayloadBytes.is_not(None), EVENT_PAYLOAD_ELSEWHERE), else_=Event.c.Payload)
}
# An instant to store or compare with: one the database clock gave this transaction, or the
# database clock itself (``DatabaseClock.now()``) for a statement that reads none first.
Instant = dt.datetime | sa.ColumnElement[dt.datetime]


def pack_namespace(connection: Connection, pack_install_id: str) -> str | None:
    """The namespace of the pack, None when no such pack exists."""
    statement = sa.select(PackInstall.c.Namespace).where(PackInstall.c.PackInstallId == pack_install_id)
    return connection.execute(statement).scalar_one_or_none()


def work_namespace(connection: Connection, work_id: str) -> str | None:
    """The namespace of the WorkItem's pack (or of its pack when it was pruned), None when the WorkId is unknown."""
    return work_namespaces(connection, [work_id]).get(work_id)


def work_namespaces(connection: Connection, work_ids: Collection[str]) -> dict[str, str]:
    """``work_namespace`` of many WorkIds in one statement: WorkId -> namespace, unknown ones left out."""
    statement = sa.union_all(
        *(
            sa.select(table.c.WorkId, PackInstall.c.Namespace)
            .join(table, table.c.PackInstallId == PackInstall.c.PackInstallId)
            .where(table.c.WorkId.in_(list(work_ids)))
            for table in (WorkItem, PrunedWork)
        )
    )
    return {row.WorkId: row.Namespace for row in connection.execute(statement)}


_RECEIPTS_GET = sa.select(
    IngressReceipt.c.ReceiptKey,
    IngressReceipt.c.PayloadHash,
    IngressReceipt.c.ProjectionKey,
    IngressReceipt.c.State,
).where(
    IngressReceipt.c.PackInstallId == sa.bindparam("pack_install_id"),
    IngressReceipt.c.ReceiptKey.in_(sa.bindparam("keys", expanding=True)),
)


def receipts_get(connection: Connection, pack_install_id: str, keys: Sequence[str]) -> dict[str, DbRow]:
    """Stored receipts of ``keys`` (primary key lookups)."""
    rows = connection.execute(_RECEIPTS_GET, {"pack_install_id": pack_install_id, "keys": list(keys)})
    return {row.ReceiptKey: row for row in rows}


def receipts_insert(connection: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Insert new receipts (one multi-row INSERT)."""
    if rows:
        connection.execute(sa.insert(IngressReceipt), list(rows))


# Receipts of Events admitted in this transaction, copied from the Events (see
# ``receipts_insert_admitted``); a key that already has a receipt (stored earlier) is skipped.
_RECEIPTS_FROM_EVENTS = sa.insert(IngressReceipt).from_select(
    [
        "PackInstallId",
        "ReceiptKey",
        "ProjectionKey",
        "PayloadHash",
        "Payload",
        "SourceTime",
        "State",
        "ReceivedAt",
        "ConfirmedAt",
    ],
    sa.select(
        Event.c.PackInstallId,
        Event.c.ReceiptKey,
        Event.c.ProjectionKey,
        Event.c.PayloadHash,
        sa.bindparam("payload", type_=IngressReceipt.c.Payload.type),
        Event.c.SourceTime,
        sa.bindparam("state", type_=IngressReceipt.c.State.type),
        sa.bindparam("received_at", type_=IngressReceipt.c.ReceivedAt.type),
        sa.bindparam("confirmed_at", type_=IngressReceipt.c.ConfirmedAt.type),
    ).where(
        Event.c.PackInstallId == sa.bindparam("pack_install_id"),
        Event.c.EnqueueOrdinal.between(sa.bindparam("first_ordinal"), sa.bindparam("last_ordinal")),
        ~probe_exists(
            sa.select(IngressReceipt.c.ReceiptKey).where(
                IngressReceipt.c.PackInstallId == Event.c.PackInstallId,
                IngressReceipt.c.ReceiptKey == Event.c.ReceiptKey,
            )
        ),
    ),
)


def receipts_insert_admitted(connection: Connection, pack_install_id: str, ordinals: range, now: dt.datetime) -> int:
    """Insert the confirmed receipts of the deliveries admitted as ``ordinals``, copied from their Events.

    Every Event in the range came from a delivery of this transaction, and its receipt row is
    all in the Event (key, identity, digest, source time) but for the times and the state: the
    database copies it (a primary-key range of Event, one primary-key probe of IngressReceipt
    per row) instead of the client sending every value again. Keys that already have a
    receipt (stored while fenced) are left to ``receipts_set_state``. Returns how many.
    """
    return connection.execute(
        _RECEIPTS_FROM_EVENTS,
        {
            "pack_install_id": pack_install_id,
            "first_ordinal": ordinals[0],
            "last_ordinal": ordinals[-1],
            "payload": ADMITTED_RECEIPT_PAYLOAD,
            "state": ReceiptState.CONFIRMED,
            "received_at": now,
            "confirmed_at": now,
        },
    ).rowcount


# The states a verdict moves a receipt from: a confirmation applies to stored receipts only;
# coverage missing applies over a confirmation too (a confirmed input whose generation has
# since gone missing must become visible to operators) and is never left.
RECEIPT_VERDICT_FROM: dict[ReceiptState, tuple[ReceiptState, ...]] = {
    ReceiptState.CONFIRMED: (ReceiptState.STORED,),
    ReceiptState.COVERAGE_MISSING: (ReceiptState.STORED, ReceiptState.CONFIRMED),
}


def receipts_set_state(
    connection: Connection,
    pack_install_id: str,
    keys: Sequence[str],
    state: ReceiptState,
    now: dt.datetime,
) -> int:
    """Record a verdict (CONFIRMED or COVERAGE_MISSING) on receipts in ``RECEIPT_VERDICT_FROM[state]``.

    Both verdicts are about an input that has an Event, so the receipt's payload copy is
    dropped. Returns how many receipts moved.
    """
    if not keys:
        return 0
    # An acknowledged input's payload lives in its Event: the receipt keeps only its digest.
    values: dict[str, Any] = {"State": state, "Payload": ADMITTED_RECEIPT_PAYLOAD}
    if state is ReceiptState.CONFIRMED:
        values["ConfirmedAt"] = now
    return connection.execute(
        sa.update(IngressReceipt)
        .where(
            IngressReceipt.c.PackInstallId == pack_install_id,
            IngressReceipt.c.ReceiptKey.in_(keys),
            IngressReceipt.c.State.in_(RECEIPT_VERDICT_FROM[state]),
        )
        .values(**values)
    ).rowcount


def receipt_pack_stored_after(connection: Connection, after: str) -> str | None:
    """The first pack above ``after`` that has stored, unconfirmed receipts; None when there is none.

    One seek of ix_ingressreceipt_state (State, PackInstallId): called once per pack, it lists
    the packs in as many seeks as there are packs with a backlog. A GROUP BY would read every
    stored receipt on TiDB, which has no loose index scan, on every materializer pass.
    """
    return connection.execute(
        sa.select(IngressReceipt.c.PackInstallId)
        .where(IngressReceipt.c.State == ReceiptState.STORED, IngressReceipt.c.PackInstallId > after)
        .order_by(IngressReceipt.c.PackInstallId)
        .limit(1)
    ).scalar_one_or_none()


def receipts_stored_sizes(connection: Connection, pack_install_id: str, limit: int) -> list[DbRow]:
    """A pack's oldest stored receipts as ReceiptKey and PayloadBytes, for the materializer's byte budget.

    A range of ix_ingressreceipt_state; the payloads are measured by the server, never sent.
    """
    return list(
        connection.execute(
            sa.select(IngressReceipt.c.ReceiptKey, sa.func.length(IngressReceipt.c.Payload).label("PayloadBytes"))
            .where(IngressReceipt.c.State == ReceiptState.STORED, IngressReceipt.c.PackInstallId == pack_install_id)
            .order_by(IngressReceipt.c.ReceivedAt)
            .limit(limit)
        )
    )


def receipts_stored_list(connection: Connection, pack_install_id: str, keys: Sequence[str]) -> list[DbRow]:
    """The receipts of ``keys`` that are still stored, whole, in the order of ``keys`` (primary key lookups)."""
    rows = connection.execute(
        sa.select(IngressReceipt).where(
            IngressReceipt.c.PackInstallId == pack_install_id,
            IngressReceipt.c.ReceiptKey.in_(keys),
            IngressReceipt.c.State == ReceiptState.STORED,
        )
    )
    position = {key: index for index, key in enumerate(keys)}
    return sorted(rows, key=lambda row: position[row.ReceiptKey])


def receipt_get(connection: Connection, pack_install_id: str, receipt_key: str) -> DbRow | None:
    """One receipt by primary key."""
    return connection.execute(
        sa.select(IngressReceipt).where(
            IngressReceipt.c.PackInstallId == pack_install_id, IngressReceipt.c.ReceiptKey == receipt_key
        )
    ).first()


class Generation(NamedTuple):
    """The columns of a generation that a duplicate's verdict reads (named as WorkItem's)."""

    WorkId: str
    InputStartOrdinal: int | None
    LaneOrdinal: int
    Status: str


_GENERATION = (WorkItem.c.WorkId, WorkItem.c.InputStartOrdinal, WorkItem.c.LaneOrdinal, WorkItem.c.Status)


def _event_generation(column: sa.Column[Any], *, covering: bool) -> sa.ScalarSelect[Any]:
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


_NEWEST_PREFIX = "Newest"  # the newest generation beside a retained Event: NewestWorkId, NewestStatus, ...


# Inputs already admitted for some receipt keys: retained Events (with their identity's newest
# generation), then tombstones of pruned ones (``events_by_receipt``).
_EVENTS_BY_RECEIPT = sa.union_all(
    sa.select(
        Event.c.ReceiptKey,
        Event.c.EnqueueOrdinal,
        Event.c.ProjectionKey,
        Event.c.PayloadHash,
        sa.cast(sa.null(), PrunedReceipt.c.WorkId.type).label("WorkId"),
        sa.cast(sa.null(), PrunedReceipt.c.PrunedAt.type).label("PrunedAt"),  # typed: SQLite takes the first branch's
        *(_event_generation(column, covering=False).label(_NEWEST_PREFIX + column.name) for column in _GENERATION),
    ).where(
        Event.c.PackInstallId == sa.bindparam("pack_install_id"),
        Event.c.ReceiptKey.in_(sa.bindparam("keys", expanding=True)),
    ),
    sa.select(
        PrunedReceipt.c.ReceiptKey,
        PrunedReceipt.c.EnqueueOrdinal,
        PrunedWork.c.ProjectionKey,
        PrunedReceipt.c.PayloadHash,
        PrunedReceipt.c.WorkId,
        PrunedReceipt.c.PrunedAt,
        *(sa.cast(sa.null(), column.type) for column in _GENERATION),
    )
    .outerjoin(PrunedWork, PrunedWork.c.WorkId == PrunedReceipt.c.WorkId)
    .where(
        PrunedReceipt.c.PackInstallId == sa.bindparam("pack_install_id"),
        PrunedReceipt.c.ReceiptKey.in_(sa.bindparam("keys", expanding=True)),
    ),
)


def events_by_receipt(connection: Connection, pack_install_id: str, keys: Sequence[str]) -> dict[str, DbRow]:
    """Inputs already admitted for ``keys``: ReceiptKey, EnqueueOrdinal, ProjectionKey, PayloadHash, WorkId, PrunedAt.

    WorkId and PrunedAt come from the tombstone of an input that retention pruned (NULL for a
    retained Event); its ProjectionKey from the pruned generation's record, NULL when that
    record expired with the duplicate window first (decision 127): the tombstone still counts.
    A retained Event also carries its identity's newest generation (``newest_generation``),
    which holds most duplicates' inputs, so verifying them needs no further statement
    (decision 132).

    One statement (uq_event_receipt, a top-of-range seek of ix_workitem_projection_order per
    Event and column, and PrunedReceipt's primary key): it reads one snapshot, so an input
    pruned concurrently shows up exactly once, as Event or as tombstone (decision 123).
    """
    rows = connection.execute(_EVENTS_BY_RECEIPT, {"pack_install_id": pack_install_id, "keys": list(keys)})
    return {row.ReceiptKey: row for row in rows}


def newest_generation(event: DbRow) -> Generation | None:
    """The newest generation of a retained Event's identity as ``events_by_receipt`` read it; None for a tombstone."""
    values = [getattr(event, _NEWEST_PREFIX + column.name) for column in _GENERATION]
    return None if values[0] is None else Generation(*values)


# Per Event of the given receipt keys, its candidate covering generation's columns: correlated
# top-of-range seeks of ix_workitem_projection_order (SQLite).
_COVERING_CORRELATED = sa.select(
    Event.c.ReceiptKey, *(_event_generation(column, covering=True).label(column.name) for column in _GENERATION)
).where(
    Event.c.PackInstallId == sa.bindparam("pack_install_id"),
    Event.c.ReceiptKey.in_(sa.bindparam("keys", expanding=True)),
)


@functools.lru_cache(maxsize=16)
def _covering_seeks(size: int) -> sa.CompoundSelect[*tuple[Any, ...]]:
    """UNION ALL of ``size`` parameterized covering seeks (MySQL protocol); built once per size.

    Parameters: ``pack_install_id`` and ``key_<n>`` / ``identity_<n>`` / ``ordinal_<n>``.
    """
    return sa.union_all(
        *(
            sa.select(sa.bindparam(f"key_{n}", type_=sa.String()).label("ReceiptKey"), *_GENERATION)
            .where(
                WorkItem.c.PackInstallId == sa.bindparam("pack_install_id"),
                WorkItem.c.ProjectionKey == sa.bindparam(f"identity_{n}"),
                WorkItem.c.LaneOrdinal >= sa.bindparam(f"ordinal_{n}"),
            )
            .order_by(WorkItem.c.LaneOrdinal)
            .limit(1)
            for n in range(size)
        )
    )


def work_items_covering(
    connection: Connection, pack_install_id: str, events: Mapping[str, DbRow]
) -> dict[str, Generation]:
    """The candidate covering generation of each admitted input, by receipt key: one statement.

    ``events`` maps receipt keys to their Events (``events_by_receipt``). The candidate is the
    first generation of the Event's identity whose LaneOrdinal is at or above its ordinal:
    generations of one identity never overlap, so it is the only one whose range can hold
    the input, and the caller checks its lower bound. One index seek per input, whatever the
    retained history. SQLite plans the correlated form's range per Event; MariaDB does not (it
    reads the identity's generations from the first, so the cost grew with history), so
    MySQL-protocol servers get one UNION ALL of seeks with the ordinals as parameters, padded
    to a power of two by repeating the last input (a few cached statements serve every size).
    """
    if not events:
        return {}
    if connection.dialect.name == "sqlite":
        rows = connection.execute(_COVERING_CORRELATED, {"pack_install_id": pack_install_id, "keys": list(events)})
    else:
        inputs = list(events.items())
        size = 1 << (len(inputs) - 1).bit_length()
        inputs += inputs[-1:] * (size - len(inputs))
        parameters: dict[str, Any] = {"pack_install_id": pack_install_id}
        for n, (key, event) in enumerate(inputs):
            parameters |= {f"key_{n}": key, f"identity_{n}": event.ProjectionKey, f"ordinal_{n}": event.EnqueueOrdinal}
        rows = connection.execute(_covering_seeks(size), parameters)
    return {
        row.ReceiptKey: Generation(row.WorkId, row.InputStartOrdinal, row.LaneOrdinal, row.Status)
        for row in rows
        if row.WorkId is not None
    }


def events_insert(connection: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Insert new Events and their payloads (two multi-row INSERTs: Event, then EventPayload).

    Each row carries its payload as ``Payload``: it goes to EventPayload, written once and
    never updated, and the Event row keeps its length and an empty payload, so a status
    change writes a small row (decision 126). Until the payload contract is set (the
    engine's cached flag, ``payload_contract``), the Event row keeps a copy too, for a v7
    Connectors serving the same database (decision 130).
    """
    if rows:
        dual_write = not payload_contract.held(connection.engine)
        events = [
            {
                **row,
                "Payload": row["Payload"] if dual_write else EVENT_PAYLOAD_ELSEWHERE,
                "PayloadBytes": len(row["Payload"]),
            }
            for row in rows
        ]
        insert_many(connection, Event, tuple(events[0]), events)
        insert_many(connection, EventPayload, ("PackInstallId", "EnqueueOrdinal", "Payload"), rows)


def _payload_after_status(contracted: bool) -> dict[str, sa.ColumnElement[bytes]]:
    return _PAYLOAD_AFTER_STATUS if contracted else {}


def event_set_status(
    connection: Connection, pack_install_id: str, ordinal: int, status: EventStatus, projection_key: str
) -> int:
    """Set the status of the selected Event of a generation (primary key)."""
    parameters = {"pack_0": pack_install_id, "ordinal_0": ordinal, "key_0": projection_key, "status": status}
    statement = _selected_status_statement(1, payload_contract.held(connection.engine))
    return connection.execute(statement, parameters).rowcount


class EventRange(NamedTuple):
    """The members of an identity with ``after < EnqueueOrdinal <= through``."""

    pack_install_id: str
    projection_key: str
    after: int
    through: int


# The bytes of an Event's payload: its PayloadBytes, or for an Event whose payload is still in
# Event.Payload (admitted by a release older than schema v8, decision 126) that payload's length.
_PAYLOAD_BYTES = sa.func.coalesce(Event.c.PayloadBytes, sa.func.length(Event.c.Payload))
_KEPT = Event.alias("Kept")  # the Event again, for a payload still kept in Event.Payload
# What a page's byte budget reads of each member (no payload is read), and what a page carries.
_SIZE_COLUMNS = (Event.c.EnqueueOrdinal, _PAYLOAD_BYTES.label("PayloadBytes"))
_PAGE_COLUMNS = (Event.c.EnqueueOrdinal, Event.c.ReceiptKey, EVENT_PAYLOAD, Event.c.SourceTime, Event.c.IsReplay)


def _event_range(
    columns: Sequence[sa.ColumnElement[Any]],
    pack_install_id: Any,
    projection_key: Any,
    after: Any,
    through: Any,
    limit: Any,
    source: sa.FromClause = Event,
) -> sa.Select[Any]:
    """``columns`` of ``source`` for the first ``limit`` members of an identity with ``after < ordinal <= through``.

    In ordinal order; the bounds are values or bind parameters.
    """
    return (
        sa.select(*columns)
        .select_from(source)
        .where(
            Event.c.PackInstallId == pack_install_id,
            Event.c.ProjectionKey == projection_key,
            Event.c.EnqueueOrdinal > after,
            Event.c.EnqueueOrdinal <= through,
        )
        .order_by(Event.c.EnqueueOrdinal)
        .limit(limit)
    )


@functools.lru_cache(maxsize=256)
def _event_ranges_statement(
    columns: tuple[sa.ColumnElement[Any], ...], source: sa.FromClause, count: int
) -> sa.Select[Any] | sa.CompoundSelect[Any]:
    """``columns`` of the first ``limit`` members of ``count`` ranges, built once per shape.

    Each range is one range scan of ix_event_source_lane (parameters ``pack_<n>``,
    ``identity_<n>``, ``after_<n>``, ``through_<n>``); several are a UNION ALL of those scans,
    each a derived table (SQLite takes no LIMIT in a compound's member) tagged with its place.
    """
    scans = [
        _event_range(
            columns,
            sa.bindparam(f"pack_{n}"),
            sa.bindparam(f"identity_{n}"),
            sa.bindparam(f"after_{n}"),
            sa.bindparam(f"through_{n}"),
            sa.bindparam("limit", type_=sa.Integer()),
            source,
        )
        for n in range(count)
    ]
    if count == 1:
        return scans[0]
    return sa.union_all(
        *(sa.select(sa.literal(n).label("RangeIndex"), *scan.subquery().c) for n, scan in enumerate(scans))
    )


def _range_parameters(ranges: Sequence[EventRange]) -> dict[str, Any]:
    """The bind parameters of ``ranges``: ``pack_<n>``, ``identity_<n>``, ``after_<n>``, ``through_<n>``."""
    parameters: dict[str, Any] = {}
    for n, members in enumerate(ranges):
        parameters |= {
            f"pack_{n}": members.pack_install_id,
            f"identity_{n}": members.projection_key,
            f"after_{n}": members.after,
            f"through_{n}": members.through,
        }
    return parameters


def _event_ranges(
    connection: Connection,
    columns: tuple[sa.ColumnElement[Any], ...],
    source: sa.FromClause,
    ranges: Sequence[EventRange],
    limit: int,
) -> list[list[DbRow]]:
    """``columns`` of the first ``limit`` members of each range, in order, in one statement whatever their number.

    The union's row order is not guaranteed: each range's rows are put in ordinal order here.
    """
    if not ranges:
        return []
    parameters = {"limit": limit, **_range_parameters(ranges)}
    result = connection.execute(_event_ranges_statement(columns, source, len(ranges)), parameters)
    if len(ranges) == 1:
        return [list(result)]
    found: list[list[DbRow]] = [[] for _ in ranges]
    for row in result:
        found[row.RangeIndex].append(row)
    for rows in found:
        rows.sort(key=lambda row: row.EnqueueOrdinal)
    return found


def event_ranges_sizes(connection: Connection, ranges: Sequence[EventRange], limit: int) -> list[list[DbRow]]:
    """EnqueueOrdinal and PayloadBytes of the first ``limit`` members of each range, for a claim's inline inputs.

    The same ranges of ix_event_source_lane as ``event_ranges_members``; sizes from Event.PayloadBytes.
    """
    return _event_ranges(connection, _SIZE_COLUMNS, Event, ranges, limit)


@functools.lru_cache(maxsize=64)
def _event_ranges_members_statement(count: int) -> sa.Select[Any]:
    """Every member of ``count`` ranges with its payload, in one scan of their intervals; built once per count.

    One ``WHERE`` of ``count`` OR-ed intervals of ix_event_source_lane (parameters ``pack_<n>``,
    ``identity_<n>``, ``after_<n>``, ``through_<n>``): no derived table, no UNION and no ORDER
    BY, so a MySQL-protocol server builds no temporary table for the payloads (MariaDB puts a
    temporary table with a BLOB column on disk).
    """
    intervals = [
        sa.and_(
            Event.c.PackInstallId == sa.bindparam(f"pack_{n}"),
            Event.c.ProjectionKey == sa.bindparam(f"identity_{n}"),
            Event.c.EnqueueOrdinal > sa.bindparam(f"after_{n}"),
            Event.c.EnqueueOrdinal <= sa.bindparam(f"through_{n}"),
        )
        for n in range(count)
    ]
    return (
        sa.select(Event.c.PackInstallId, Event.c.ProjectionKey, *_PAGE_COLUMNS)
        .select_from(EVENT_WITH_PAYLOAD)
        .where(sa.or_(*intervals))
    )


def _holds(members: EventRange, row: DbRow) -> bool:
    """Whether ``row`` (an Event) is one of ``members``."""
    ordinal: int = row.EnqueueOrdinal
    identity = (row.PackInstallId, row.ProjectionKey)
    return identity == (members.pack_install_id, members.projection_key) and members.after < ordinal <= members.through


def event_ranges_members(connection: Connection, ranges: Sequence[EventRange]) -> list[list[DbRow]]:
    """Every member of each range with its payload, in ordinal order, in one statement: a claim's inline inputs.

    For ranges the caller knows to be small (``event_ranges_sizes`` counted them under the
    claim's locks; their bounds are frozen): nothing limits how many rows a range returns.
    """
    if not ranges:
        return []
    found: list[list[DbRow]] = [[] for _ in ranges]
    for row in connection.execute(_event_ranges_members_statement(len(ranges)), _range_parameters(ranges)):
        found[next(n for n, members in enumerate(ranges) if _holds(members, row))].append(row)
    for rows in found:
        rows.sort(key=lambda row: row.EnqueueOrdinal)
    return found


def event_range_page(
    connection: Connection,
    pack_install_id: str,
    projection_key: str,
    after: int,
    through: int,
    limit: int,
    max_bytes: int,
) -> list[DbRow]:
    """The next members of an identity after ``after`` (up to ``through``), in ordinal order, within a byte budget.

    The first ``limit`` members are the candidates; the page is their longest prefix whose
    payloads add up to at most ``max_bytes`` (at least one member; ``within_bytes``'
    semantics, decision 122). Each row carries EnqueueOrdinal, ReceiptKey, Payload,
    SourceTime, IsReplay and ``Candidates``: fewer candidates than ``limit``, all in the page,
    means no member follows.

    One statement: the candidates are a range of ix_event_source_lane sized from
    Event.PayloadBytes (no payload read), a window sum cuts the prefix, and each member's
    payload is one primary-key lookup of EventPayload (or, for a payload kept in Event, of
    Event). Rows are ordered here, not by the server: an ORDER BY over the derived table would
    add a sort.
    """
    candidates = _event_range(
        [
            Event.c.EnqueueOrdinal,
            Event.c.ReceiptKey,
            Event.c.SourceTime,
            Event.c.IsReplay,
            Event.c.PayloadBytes.label("Stored"),
            _PAYLOAD_BYTES.label("Bytes"),
        ],
        pack_install_id,
        projection_key,
        after,
        through,
        limit,
    ).subquery("Candidates")
    order = candidates.c.EnqueueOrdinal
    sized = sa.select(
        candidates,
        sa.func.sum(candidates.c.Bytes).over(order_by=order).label("Through"),
        sa.func.row_number().over(order_by=order).label("Position"),
        sa.func.count().over().label("Candidates"),
    ).subquery("Sized")
    payload = EventPayload.c.PackInstallId == pack_install_id, EventPayload.c.EnqueueOrdinal == sized.c.EnqueueOrdinal
    kept = _KEPT.c.PackInstallId == pack_install_id, _KEPT.c.EnqueueOrdinal == sized.c.EnqueueOrdinal
    statement = (
        sa.select(
            sized.c.EnqueueOrdinal,
            sized.c.ReceiptKey,
            sa.func.coalesce(EventPayload.c.Payload, _KEPT.c.Payload).label("Payload"),
            sized.c.SourceTime,
            sized.c.IsReplay,
            sized.c.Candidates,
        )
        .select_from(
            sized.outerjoin(EventPayload, sa.and_(sized.c.Stored.is_not(None), *payload)).outerjoin(
                _KEPT, sa.and_(sized.c.Stored.is_(None), *kept)
            )
        )
        .where(sa.or_(sized.c.Through <= max_bytes, sized.c.Position == 1))
    )
    return sorted(connection.execute(statement), key=lambda row: row.EnqueueOrdinal)


def input_value(row: Any) -> InputRow:
    """The value of an ``event_range_page`` row: one member as a worker (or a reader) sees it."""
    return InputRow(
        enqueue_ordinal=row.EnqueueOrdinal,
        receipt_key=row.ReceiptKey,
        payload=row.Payload,
        source_time=row.SourceTime,
        is_replay=bool(row.IsReplay),
    )


def event_range_count(connection: Connection, pack_install_id: str, projection_key: str, start: int, end: int) -> int:
    """Number of members of an identity in ``[start, end]`` (ix_event_source_lane)."""
    return int(
        connection.execute(
            sa.select(sa.func.count())
            .select_from(Event)
            .where(
                Event.c.PackInstallId == pack_install_id,
                Event.c.ProjectionKey == projection_key,
                Event.c.EnqueueOrdinal.between(start, end),
            )
        ).scalar_one()
    )


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
    sa.select(WorkItem.c.WorkId, WorkItem.c.ProjectionKey, WorkItem.c.Status, WorkItem.c.Attempt)
    .where(WorkItem.c.WorkId.in_(sa.bindparam("work_ids", expanding=True)))
    .with_for_update()
)


def work_items_newest(
    connection: Connection,
    pack_install_id: str,
    ordinals: range,
    projection_keys: Iterable[str],
    known: Mapping[str, str] | None = None,
) -> dict[str, DbRow]:
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
    return {row.ProjectionKey: row for row in connection.execute(_NEWEST_LOCK, {"work_ids": work_ids})}


def work_items_insert(connection: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Insert new generations (one multi-row INSERT; every row has the first row's columns, in any order)."""
    if rows:
        # The table's column order, which the INSERT's parameters follow (``insert_many``).
        insert_many(connection, WorkItem, tuple(name for name in WorkItem.c.keys() if name in rows[0]), rows)


@functools.lru_cache(maxsize=16)
def _extend_statement(size: int) -> sa.Update:
    """The extension UPDATE of ``size`` generations; built once per size.

    Parameters: ``pack_install_id``, ``first_ordinal``, ``last_ordinal``, and ``work_<n>`` /
    ``bound_<n>`` / ``added_<n>`` for n < ``size`` (per-call statements are built once:
    docs/performance.md, "Tuning notes formerly in docs/decisions").

    The admitted count grows by the members added only while it is trusted (LaneOrdinal at or
    below AdmittedThroughOrdinal, decision 149), and then counts through the batch's last
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


def work_item_get(
    connection: Connection, work_id: str, *, lock: bool = False, clock: DatabaseClock | None = None
) -> DbRow | None:
    """One WorkItem by primary key, optionally locked; with ``clock``'s now as column ``Now``."""
    parameters: dict[str, Any] = {"work_id": work_id, **(clock.parameters() if clock else {})}
    return connection.execute(_work_item_statement(lock, clock is not None), parameters).first()


@functools.lru_cache(maxsize=4)
def _work_item_statement(lock: bool, clocked: bool) -> sa.Select[Any]:
    """``work_item_get``'s statement; built once per shape. Parameters: ``work_id`` (and the clock's)."""
    columns: list[Any] = [WorkItem, NOW_PARAMETER.label("Now")] if clocked else [WorkItem]
    statement = sa.select(*columns).where(WorkItem.c.WorkId == sa.bindparam("work_id"))
    return statement.with_for_update() if lock else statement


def work_item_value(row: Any) -> WorkItemRow:
    """The value of a WorkItem result row."""
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
    )


def work_items_get(connection: Connection, work_ids: Collection[str]) -> dict[str, DbRow]:
    """WorkItems by primary key (one statement), keyed by WorkId."""
    if not work_ids:
        return {}
    return {row.WorkId: row for row in connection.execute(sa.select(WorkItem).where(WorkItem.c.WorkId.in_(work_ids)))}


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


# ``work_items_lock``'s statement, built once. Parameters: ``work_ids`` (expanding) and the clock's.
_LOCK_HELD = (
    sa.select(WorkItem, NOW_PARAMETER.label("Now"))
    .where(WorkItem.c.WorkId.in_(sa.bindparam("work_ids", expanding=True)))
    .with_for_update()
)


def work_items_lock(connection: Connection, work_ids: Collection[str], clock: DatabaseClock) -> dict[str, DbRow]:
    """WorkItems by primary key, locked (FOR UPDATE), each with ``clock``'s now as ``Now``; one statement.

    The lock keeps the leases read unchanged until the caller's compare-and-set in the same
    transaction (``work_items_complete``), so its row count is exact.
    """
    rows = connection.execute(_LOCK_HELD, {"work_ids": list(work_ids), **clock.parameters()})
    return {row.WorkId: row for row in rows}


@functools.lru_cache(maxsize=16)
def _complete_statement(size: int) -> sa.Update:
    """``work_items_complete``'s UPDATE of ``size`` leases; built once per size (padded, as ``_link_statement``)."""
    leases = [
        sa.and_(
            WorkItem.c.WorkId == sa.bindparam(f"work_{n}"),
            WorkItem.c.LeaseToken == sa.bindparam(f"token_{n}"),
            WorkItem.c.LeaseExpiresAt == sa.bindparam(f"expires_{n}"),
        )
        for n in range(size)
    ]
    return (
        sa.update(WorkItem)
        .where(sa.or_(*leases), WorkItem.c.Status == WorkStatus.PROCESSING)
        .values(Status=WorkStatus.COMPLETED, ClaimableAt=None, FinishedAt=sa.bindparam("finished_at"))
    )


def work_items_complete(connection: Connection, held: Sequence[DbRow], now: dt.datetime) -> int:
    """Complete the generations ``held`` (rows as read), each only if it still holds the lease read; one UPDATE.

    The compare-and-set of each row is its WorkId, lease token and lease expiry as read, and
    processing; an OR of primary-key conjunctions (as ``selected_events_set_status``), padded to
    a power of two by repeating the last row. Returns the row count for the caller to compare
    with ``len(held)``.
    """
    if not held:
        return 0
    padded = list(held)
    size = 1 << (len(padded) - 1).bit_length()
    padded += padded[-1:] * (size - len(padded))
    parameters: dict[str, Any] = {"finished_at": now}
    for n, row in enumerate(padded):
        parameters |= {f"work_{n}": row.WorkId, f"token_{n}": row.LeaseToken, f"expires_{n}": row.LeaseExpiresAt}
    return connection.execute(_complete_statement(size), parameters).rowcount


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


def work_items_successors(connection: Connection, rows: Sequence[DbRow]) -> dict[str, str]:
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


def packs_list(connection: Connection) -> list[str]:
    """Every PackInstallId (primary key order)."""
    return list(
        connection.execute(sa.select(PackInstall.c.PackInstallId).order_by(PackInstall.c.PackInstallId)).scalars()
    )


def work_item_unblock(connection: Connection, work_id: str, now: Instant) -> int:
    """Make a blocked generation claimable: its predecessor became terminal."""
    return connection.execute(
        sa.update(WorkItem)
        .where(WorkItem.c.WorkId == work_id, WorkItem.c.Status == WorkStatus.BLOCKED)
        .values(Status=WorkStatus.PENDING, ClaimableAt=now)
    ).rowcount


@functools.lru_cache(maxsize=64)
def _claimable_statement(operated: tuple[bool, ...], by_work_type: bool) -> sa.CompoundSelect[Any]:
    """The candidate read of ``work_items_claimable`` for one pack per item of ``operated``; built once per shape.

    Parameters: ``pack_<n>`` for each pack, ``limit``, the clock's offset
    (``DatabaseClock.parameters``) and, if ``by_work_type``, ``work_types``. A pack whose item
    is True carries the operator's conditions (pauses, order policy).
    """
    selects = []
    for n, decided in enumerate(operated):
        for status in (WorkStatus.PENDING, WorkStatus.RETRY, WorkStatus.PROCESSING):
            statement = (
                sa.select(
                    WorkItem.c.WorkId,
                    WorkItem.c.PackInstallId,
                    WorkItem.c.ProjectionKey,
                    WorkItem.c.Status,
                    WorkItem.c.ClaimableAt,
                    WorkItem.c.LeaseToken,
                    WorkItem.c.Attempt,
                    WorkItem.c.MaxAttempts,
                    WorkItem.c.InputStartOrdinal,
                    WorkItem.c.LaneOrdinal,
                    WorkItem.c.SuccessorWorkId,
                    NOW_PARAMETER.label("Now"),
                )
                .where(
                    WorkItem.c.PackInstallId == sa.bindparam(f"pack_{n}"),
                    WorkItem.c.Status == status,
                    WorkItem.c.ClaimableAt <= NOW_PARAMETER,
                )
                .order_by(WorkItem.c.ClaimableAt)
                .limit(sa.bindparam("limit", type_=sa.Integer()))
            )
            if by_work_type:
                statement = statement.where(WorkItem.c.WorkType.in_(sa.bindparam("work_types", expanding=True)))
            if decided:
                statement = statement.where(order_queries.candidate_operable(sa.bindparam(f"pack_{n}"), NOW_PARAMETER))
            selects.append(statement.subquery().select())
    return sa.union_all(*selects)


def work_items_claimable(
    connection: Connection,
    pack_install_ids: Sequence[str],
    work_types: Sequence[str],
    clock: DatabaseClock,
    limit: int,
    operated: Collection[str] | None = None,
) -> list[DbRow]:
    """The ``limit`` oldest claim candidates: pending, due retry and lease-expired processing work.

    ``operated``: the packs an operator's pause or order policy may apply to
    (``order_queries.pack_operated``); only their reads carry those conditions. None: every pack.

    Due at ``clock``'s now, which each row carries as column ``Now``: the instant the claim
    transaction decides with.

    One ordered, limited range scan of ix_workitem_claim per (pack, status), combined with
    UNION ALL, so a large backlog is never sorted as a whole; the branches' rows are merged
    by ClaimableAt with a stable sort (ties keep each branch's index order). Each row carries
    what a claim decides on: its state, attempts, range and identity. The statement is built
    once per number of packs (docs/performance.md, "Tuning notes formerly in docs/decisions").
    """
    if not pack_install_ids:
        return []
    parameters: dict[str, Any] = {"limit": limit, **clock.parameters()}
    parameters |= {f"pack_{n}": pack_install_id for n, pack_install_id in enumerate(pack_install_ids)}
    if work_types:
        parameters["work_types"] = list(work_types)
    decided = tuple(operated is None or pack in operated for pack in pack_install_ids)
    statement = _claimable_statement(decided, bool(work_types))
    rows = connection.execute(statement, parameters).all()
    return sorted(rows, key=lambda row: row.ClaimableAt)[:limit]


def work_items_claim(
    connection: Connection, work_ids: Sequence[str], now: dt.datetime, grant: Mapping[str, Any]
) -> int:
    """Lease every generation of ``work_ids`` that is still claimable at ``now``, in one UPDATE.

    The compare-and-set is the claimability condition itself, evaluated on each row's current
    version under its row lock: pending or retry, or processing with an expired lease and an
    attempt left, and ClaimableAt <= ``now``. A row another claim took meanwhile carries a
    future ClaimableAt and is skipped, so ``grant`` (``LeaseToken`` and the other lease
    columns) marks exactly the rows this statement won: the caller reads them back by token.
    An expired lease counts as a failed attempt (Attempt + 1). Primary-key lookups; returns
    the row count.
    """
    if not work_ids:
        return 0
    parameters = {"work_ids": list(work_ids), "now": now, **{f"grant_{name}": value for name, value in grant.items()}}
    return connection.execute(_claim_statement(tuple(grant)), parameters).rowcount


@functools.lru_cache(maxsize=4)
def _claim_statement(granted: tuple[str, ...]) -> sa.Update:
    """The lease UPDATE of ``work_items_claim`` setting the ``granted`` columns; built once.

    Parameters: ``work_ids``, ``now`` and ``grant_<column>`` for each granted column.
    """
    expired = WorkItem.c.Status == WorkStatus.PROCESSING
    claimable = sa.or_(
        WorkItem.c.Status.in_([WorkStatus.PENDING, WorkStatus.RETRY]),
        sa.and_(expired, WorkItem.c.Attempt + 1 < WorkItem.c.MaxAttempts),
    )
    # Attempt first: MySQL evaluates SET assignments left to right, so the CASE must see the
    # old Status (SQLite and TiDB read old values anyway).
    attempt = WorkItem.c.Attempt + sa.case((expired, 1), else_=0)
    assignments = [
        (WorkItem.c.Attempt, attempt),
        *((WorkItem.c[name], sa.bindparam(f"grant_{name}", type_=WorkItem.c[name].type)) for name in granted),
    ]
    return (
        sa.update(WorkItem)
        .where(
            WorkItem.c.WorkId.in_(sa.bindparam("work_ids", expanding=True)),
            WorkItem.c.ClaimableAt <= sa.bindparam("now", type_=WorkItem.c.ClaimableAt.type),
            claimable,
        )
        .ordered_values(*assignments)
    )


_MEMBER_COUNT_RECORD = (
    sa.update(WorkItem)
    .where(
        WorkItem.c.WorkId.in_(sa.bindparam("work_ids", expanding=True)),
        WorkItem.c.LeaseToken == sa.bindparam("lease_token"),
        WorkItem.c.ClaimedMemberCount.is_(None),
    )
    .values(
        ClaimedMemberCount=sa.select(sa.func.count())
        .select_from(Event)
        .where(
            Event.c.PackInstallId == WorkItem.c.PackInstallId,
            Event.c.ProjectionKey == WorkItem.c.ProjectionKey,
            Event.c.EnqueueOrdinal.between(WorkItem.c.InputStartOrdinal, WorkItem.c.LaneOrdinal),
        )
        .with_hint(Event, "FORCE INDEX (ix_event_source_lane)", dialect_name="mysql")
        .correlate(WorkItem)
        .scalar_subquery()
    )
)


def work_items_record_member_count(connection: Connection, work_ids: Sequence[str], lease_token: str) -> int:
    """Record the member count of each generation of ``work_ids`` that ``lease_token`` leased for the first time.

    ``ClaimedMemberCount`` is the number of the identity's Events in the generation's range,
    counted on ix_event_source_lane; the range is frozen from the first claim, so LoadInputs
    can detect a lost member (decision 110); later claims keep the first count. A statement
    of its own, after the lease UPDATE: an UPDATE that waited for the row lock of an
    admission extending the generation re-reads the row, but on MySQL-protocol servers its
    subqueries keep the read view taken before the wait and would miss the extension's
    Events. A new statement reads them (READ COMMITTED). Primary-key lookups, and the count
    named to ix_event_source_lane (``FORCE INDEX`` on MySQL-protocol servers): with the
    statistics InnoDB keeps by itself MariaDB counted on the primary key by PackInstallId
    alone, reading every Event of the pack for each claimed generation.
    """
    return connection.execute(_MEMBER_COUNT_RECORD, {"work_ids": list(work_ids), "lease_token": lease_token}).rowcount


_LEASED = (
    sa.select(WorkItem, Event.c.EnqueueOrdinal.label("SelectedOrdinal"))
    .select_from(
        WorkItem.outerjoin(
            Event,
            sa.and_(
                Event.c.PackInstallId == WorkItem.c.PackInstallId,
                Event.c.EnqueueOrdinal == WorkItem.c.LaneOrdinal,
                Event.c.ProjectionKey == WorkItem.c.ProjectionKey,
            ),
        )
    )
    .where(
        WorkItem.c.WorkId.in_(sa.bindparam("work_ids", expanding=True)),
        WorkItem.c.LeaseToken == sa.bindparam("lease_token"),
    )
)


def work_items_leased(connection: Connection, work_ids: Sequence[str], lease_token: str) -> list[DbRow]:
    """The generations of ``work_ids`` that hold ``lease_token``, each with its selected Event's ordinal.

    ``SelectedOrdinal`` is None when the Event at the generation's LaneOrdinal (its selected
    Event, of its identity) is missing. Primary-key lookups of WorkItem and Event.
    """
    return list(connection.execute(_LEASED, {"work_ids": list(work_ids), "lease_token": lease_token}))


def selected_events_set_status(
    connection: Connection, selected: Sequence[tuple[str, int, str]], status: EventStatus
) -> int:
    """Set the status of many generations' selected Events, in one UPDATE (primary-key lookups).

    ``selected`` holds (PackInstallId, EnqueueOrdinal, ProjectionKey) triples; returns the row
    count for the caller to compare with their number. Spelled as an OR of primary-key
    equalities: SQLite scans the table for a row-value IN.
    """
    if not selected:
        return 0
    parameters: dict[str, Any] = {"status": status}
    for n, (pack, ordinal, key) in enumerate(selected):
        parameters |= {f"pack_{n}": pack, f"ordinal_{n}": ordinal, f"key_{n}": key}
    statement = _selected_status_statement(len(selected), payload_contract.held(connection.engine))
    return connection.execute(statement, parameters).rowcount


@functools.lru_cache(maxsize=256)
def _selected_status_statement(size: int, contracted: bool) -> sa.Update:
    """The UPDATE of ``selected_events_set_status`` for ``size`` Events; built once per size and contract state.

    Parameters: ``status`` and ``pack_<n>``, ``ordinal_<n>``, ``key_<n>`` for n < ``size``.
    """
    keys = [
        sa.and_(
            Event.c.PackInstallId == sa.bindparam(f"pack_{n}"),
            Event.c.EnqueueOrdinal == sa.bindparam(f"ordinal_{n}"),
            Event.c.ProjectionKey == sa.bindparam(f"key_{n}"),
        )
        for n in range(size)
    ]
    return (
        sa.update(Event).where(sa.or_(*keys)).values(Status=sa.bindparam("status"), **_payload_after_status(contracted))
    )


def work_item_update_if(connection: Connection, work_id: str, expect: dict[str, Any], values: dict[str, Any]) -> int:
    """Compare-and-set one WorkItem; return the row count (0 or 1).

    The update applies only if every column in ``expect`` still holds its value (None
    compares with IS NULL).
    """
    compared = tuple((column, value is None) for column, value in expect.items())
    parameters = {
        "work_id": work_id,
        **{f"expect_{column}": value for column, value in expect.items() if value is not None},
        **{f"value_{column}": value for column, value in values.items()},
    }
    return connection.execute(_update_if_statement(compared, tuple(values)), parameters).rowcount


@functools.lru_cache(maxsize=64)
def _update_if_statement(compared: tuple[tuple[str, bool], ...], written: tuple[str, ...]) -> sa.Update:
    """``work_item_update_if``'s statement; built once per shape.

    ``compared``: (column, whether it must be NULL); ``written``: the columns set. Parameters:
    ``work_id``, ``expect_<column>`` for each compared column not NULL, ``value_<column>``.
    """
    conditions = [WorkItem.c.WorkId == sa.bindparam("work_id")]
    for column, null in compared:
        expected = sa.bindparam(f"expect_{column}", type_=WorkItem.c[column].type)
        conditions.append(WorkItem.c[column].is_(None) if null else WorkItem.c[column] == expected)
    assignments = {column: sa.bindparam(f"value_{column}", type_=WorkItem.c[column].type) for column in written}
    return sa.update(WorkItem).where(*conditions).values(assignments)


def work_item_live_replay(connection: Connection, work_id: str) -> DbRow | None:
    """A nonterminal replay of ``work_id``, if any (ix_workitem_replay_of)."""
    return connection.execute(
        sa.select(WorkItem.c.WorkId, WorkItem.c.Status)
        .where(
            WorkItem.c.ReplayOfWorkId == work_id,
            WorkItem.c.Status.not_in([WorkStatus.COMPLETED, WorkStatus.FAILED]),
        )
        .limit(1)
    ).first()


def receipts_in_state(
    connection: Connection,
    state: ReceiptState,
    pack_install_id: str | None,
    after: tuple[str, dt.datetime, str] | None,
    limit: int,
) -> list[DbRow]:
    """Receipts in ``state`` (of one pack, or all), in (pack, ReceivedAt, key) order after ``after``.

    A range of ix_ingressreceipt_state read in index order up to ``limit`` rows: InnoDB's
    entries end with the primary key, so the order needs no sort (SQLite's end with the rowid:
    it sorts the receipts of one batch, which share ReceivedAt). Keyset pagination by the
    last row's (pack, time, key). MariaDB needs three nudges: the index is forced (for one
    pack whose receipts are mostly in ``state`` it prefers the primary key and a sort of all
    of them), the constant pack column stays out of the order (it sorts when it is there),
    and the keyset is spelled out (it does not seek on a row-value comparison).
    """
    statement = (
        sa.select(
            IngressReceipt.c.PackInstallId,
            IngressReceipt.c.ReceiptKey,
            IngressReceipt.c.ProjectionKey,
            IngressReceipt.c.State,
            IngressReceipt.c.ReceivedAt,
        )
        .with_hint(IngressReceipt, "FORCE INDEX (ix_ingressreceipt_state)", dialect_name="mysql")
        .where(IngressReceipt.c.State == state)
    )
    order = (IngressReceipt.c.PackInstallId, IngressReceipt.c.ReceivedAt, IngressReceipt.c.ReceiptKey)
    constant = 0  # leading order columns fixed by the filter
    if pack_install_id:
        statement = statement.where(IngressReceipt.c.PackInstallId == pack_install_id)
        constant = 1
    if after is not None:
        statement = statement.where(after_keyset(order[constant:], after[constant:]))
    return list(connection.execute(statement.order_by(*order[constant:]).limit(limit)))


def after_keyset(
    columns: Sequence[sa.ColumnElement[Any]], values: Sequence[Any], *, descending: bool = False
) -> sa.ColumnElement[bool]:
    """``(columns) > (values)`` in row order, as an OR of index seeks (c1 > v1, c1 = v1 AND c2 > v2, ...).

    ``descending``: ``(columns) < (values)``, the position after ``values`` in descending order.
    """
    return sa.or_(
        *(
            sa.and_(
                *(column == value for column, value in zip(columns[:i], values[:i], strict=True)),
                columns[i] < values[i] if descending else columns[i] > values[i],
            )
            for i in range(len(columns))
        )
    )


# --- Operator reads: the native queue of a pack, an identity's generations ---------------

WAITING_STATUSES = (WorkStatus.PENDING, WorkStatus.BLOCKED, WorkStatus.RETRY)
QUEUED_STATUSES = (*WAITING_STATUSES, WorkStatus.PROCESSING)


def work_queue_counts(connection: Connection, pack_install_id: str) -> dict[str, int]:
    """Native (ranged) nonterminal generations of a pack per status.

    A range of ix_workitem_claim over the pack's nonterminal statuses: at most two rows per
    identity (a claimed generation and its unclaimed successor), never the terminal history.
    """
    rows = connection.execute(
        sa.select(WorkItem.c.Status, sa.func.count().label("Count"))
        .where(
            WorkItem.c.PackInstallId == pack_install_id,
            WorkItem.c.Status.in_(QUEUED_STATUSES),
            WorkItem.c.InputStartOrdinal.is_not(None),
        )
        .group_by(WorkItem.c.Status)
    )
    return {row.Status: int(row.Count) for row in rows}


def work_oldest_waiting(connection: Connection, pack_install_id: str) -> DbRow | None:
    """The waiting native generation with the pack's lowest InputStartOrdinal: its oldest waiting input.

    Ordinals increase in commit order, so that generation waits longest. Two ranges of
    ix_workitem_claim over the waiting statuses (the MIN, then the row with it), no sort.
    """
    lowest = (
        sa.select(sa.func.min(WorkItem.c.InputStartOrdinal))
        .where(WorkItem.c.PackInstallId == pack_install_id, WorkItem.c.Status.in_(WAITING_STATUSES))
        .scalar_subquery()
    )
    return connection.execute(
        sa.select(WorkItem.c.WorkId, WorkItem.c.CreatedAt)
        .where(
            WorkItem.c.PackInstallId == pack_install_id,
            WorkItem.c.Status.in_(WAITING_STATUSES),
            WorkItem.c.InputStartOrdinal == lowest,
        )
        .limit(1)
    ).first()


def receipt_count_capped(connection: Connection, pack_install_id: str, state: ReceiptState, cap: int) -> int:
    """Receipts of a pack in ``state``, counted up to ``cap`` (ix_ingressreceipt_state range, LIMIT)."""
    limited = (
        sa.select(IngressReceipt.c.ReceiptKey)
        .where(IngressReceipt.c.State == state, IngressReceipt.c.PackInstallId == pack_install_id)
        .limit(cap)
        .subquery()
    )
    return int(connection.execute(sa.select(sa.func.count()).select_from(limited)).scalar_one())


def work_items_of_identity(
    connection: Connection, pack_install_id: str, projection_key: str, below: int | None, limit: int
) -> list[DbRow]:
    """Generations of one identity with LaneOrdinal below ``below``, newest (highest LaneOrdinal) first.

    ix_workitem_projection_order read backwards, up to ``limit`` rows: keyset pagination by the
    previous page's last LaneOrdinal, which is unique within an identity (each generation's is
    its own selected Event; old-protocol work has one WorkItem per selected Event).
    """
    statement = sa.select(WorkItem).where(
        WorkItem.c.PackInstallId == pack_install_id, WorkItem.c.ProjectionKey == projection_key
    )
    if below is not None:
        statement = statement.where(WorkItem.c.LaneOrdinal < below)
    return list(connection.execute(statement.order_by(WorkItem.c.LaneOrdinal.desc()).limit(limit)))


def work_items_of_pack(
    connection: Connection, pack_install_id: str, before: tuple[str, int] | None, limit: int
) -> list[DbRow]:
    """Generations of a pack, identity after identity (ProjectionKey descending), newest first in each.

    ix_workitem_projection_order read backwards from the position ``before`` (the previous
    page's last ProjectionKey and LaneOrdinal), up to ``limit`` rows; the keyset is spelled out
    as index seeks (``after_keyset``).
    """
    order = (WorkItem.c.ProjectionKey, WorkItem.c.LaneOrdinal)
    statement = sa.select(WorkItem).where(WorkItem.c.PackInstallId == pack_install_id)
    if before is not None:
        statement = statement.where(after_keyset(order, before, descending=True))
    return list(connection.execute(statement.order_by(*(column.desc() for column in order)).limit(limit)))
