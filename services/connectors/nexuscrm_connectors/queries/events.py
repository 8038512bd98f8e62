"""Event and EventPayload: inserting inputs, their status, duplicates' lookups and the payload ranges workers read."""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from nexuscrm_connectors import payload_contract
from nexuscrm_connectors.queries import DbRow
from nexuscrm_connectors.queries.rows import EventRow
from nexuscrm_connectors.queries.work_items import GENERATION_COLUMNS, Generation, identity_generation
from nexuscrm_runtime.bulk import insert_many
from nexuscrm_schema.relations import EVENT_PAYLOAD, EVENT_WITH_PAYLOAD
from nexuscrm_schema.tables import (
    Event,
    EventPayload,
    PrunedReceipt,
    PrunedWork,
    WorkItem,
)
from workqueue import EventStatus
from workqueue.values import InputRow

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


_NEWEST_PREFIX = "Newest"  # the newest generation beside a retained Event: NewestWorkId, NewestStatus, ...


class AdmittedInput(NamedTuple):
    """A row of ``events_by_receipt``: a retained Event (with its identity's newest generation) or a tombstone."""

    ReceiptKey: str
    EnqueueOrdinal: int
    ProjectionKey: str | None
    PayloadHash: str
    WorkId: str | None
    PrunedAt: dt.datetime | None
    NewestWorkId: str | None
    NewestInputStartOrdinal: int | None
    NewestLaneOrdinal: int | None
    NewestStatus: str | None


if AdmittedInput._fields[6:] != tuple(_NEWEST_PREFIX + column.name for column in GENERATION_COLUMNS):
    raise RuntimeError("AdmittedInput's Newest fields are not the generation columns events_by_receipt reads")


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
        *(
            identity_generation(column, covering=False).label(_NEWEST_PREFIX + column.name)
            for column in GENERATION_COLUMNS
        ),
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
        *(sa.cast(sa.null(), column.type) for column in GENERATION_COLUMNS),
    )
    .outerjoin(PrunedWork, PrunedWork.c.WorkId == PrunedReceipt.c.WorkId)
    .where(
        PrunedReceipt.c.PackInstallId == sa.bindparam("pack_install_id"),
        PrunedReceipt.c.ReceiptKey.in_(sa.bindparam("keys", expanding=True)),
    ),
)


def events_by_receipt(connection: Connection, pack_install_id: str, keys: Sequence[str]) -> dict[str, AdmittedInput]:
    """Inputs already admitted for ``keys``: ReceiptKey, EnqueueOrdinal, ProjectionKey, PayloadHash, WorkId, PrunedAt.

    WorkId and PrunedAt come from the tombstone of an input that retention pruned (NULL for a
    retained Event); its ProjectionKey from the pruned generation's record, NULL when that
    record expired with the duplicate window first (decision 127): the tombstone still counts.
    A retained Event also carries its identity's newest generation (``carried_newest``),
    which holds most duplicates' inputs, so verifying them needs no further statement
    (decision 132).

    One statement (uq_event_receipt, a top-of-range seek of ix_workitem_projection_order per
    Event and column, and PrunedReceipt's primary key): it reads one snapshot, so an input
    pruned concurrently shows up exactly once, as Event or as tombstone (decision 123).
    """
    rows = connection.execute(_EVENTS_BY_RECEIPT, {"pack_install_id": pack_install_id, "keys": list(keys)})
    return {row.ReceiptKey: row for row in map(AdmittedInput._make, rows)}


def carried_newest(event: AdmittedInput) -> Generation | None:
    """The newest generation of a retained Event's identity as ``events_by_receipt`` read it; None for a tombstone."""
    if event.NewestWorkId is None or event.NewestLaneOrdinal is None or event.NewestStatus is None:
        return None
    return Generation(event.NewestWorkId, event.NewestInputStartOrdinal, event.NewestLaneOrdinal, event.NewestStatus)


# Per Event of the given receipt keys, its candidate covering generation's columns: correlated
# top-of-range seeks of ix_workitem_projection_order (SQLite).
_COVERING_CORRELATED = sa.select(
    Event.c.ReceiptKey,
    *(identity_generation(column, covering=True).label(column.name) for column in GENERATION_COLUMNS),
).where(
    Event.c.PackInstallId == sa.bindparam("pack_install_id"),
    Event.c.ReceiptKey.in_(sa.bindparam("keys", expanding=True)),
)


def _covering_seek(n: int) -> sa.Select[Any]:
    """One input's covering seek: parameters ``pack_install_id``, ``key_<n>``, ``identity_<n>``, ``ordinal_<n>``."""
    return (
        sa.select(sa.bindparam(f"key_{n}", type_=sa.String()).label("ReceiptKey"), *GENERATION_COLUMNS)
        .where(
            WorkItem.c.PackInstallId == sa.bindparam("pack_install_id"),
            WorkItem.c.ProjectionKey == sa.bindparam(f"identity_{n}"),
            WorkItem.c.LaneOrdinal >= sa.bindparam(f"ordinal_{n}"),
        )
        .order_by(WorkItem.c.LaneOrdinal)
        .limit(1)
    )


@functools.lru_cache(maxsize=16)
def _covering_seeks(size: int) -> sa.CompoundSelect[*tuple[Any, ...]]:
    """UNION ALL of ``size`` parameterized covering seeks (MySQL protocol); built once per size.

    Parameters: ``pack_install_id`` and ``key_<n>`` / ``identity_<n>`` / ``ordinal_<n>``.
    """
    return sa.union_all(*(_covering_seek(n) for n in range(size)))


def work_items_covering(
    connection: Connection, pack_install_id: str, events: Mapping[str, AdmittedInput], *, as_given: bool = False
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
    ``as_given``: seek each input's ``ProjectionKey`` as given (a Flow version's key), not its
    Event's, so the seeks on every engine.
    """
    if not events:
        return {}
    rows: Iterable[Any]
    if connection.dialect.name == "sqlite" and not as_given:
        rows = connection.execute(_COVERING_CORRELATED, {"pack_install_id": pack_install_id, "keys": list(events)})
    elif connection.dialect.name == "sqlite":  # SQLite has no ORDER BY and LIMIT in a UNION's members: one seek each
        rows = [
            row
            for key, event in events.items()
            for row in connection.execute(
                _covering_seek(0),
                {
                    "pack_install_id": pack_install_id,
                    "key_0": key,
                    "identity_0": event.ProjectionKey,
                    "ordinal_0": event.EnqueueOrdinal,
                },
            )
        ]
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


def events_insert(connection: Connection, rows: Sequence[EventRow] | Sequence[Mapping[str, Any]]) -> None:
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


def input_value(row: Any, *, replayed_work_id: str | None = None) -> InputRow:
    """The value of an ``event_range_page`` row: one member as a worker (or a reader) sees it.

    ``replayed_work_id``: the replayed generation the row is a member of, when read for a replay.
    """
    return InputRow(
        enqueue_ordinal=row.EnqueueOrdinal,
        receipt_key=row.ReceiptKey,
        payload=row.Payload,
        source_time=row.SourceTime,
        is_replay=bool(row.IsReplay),
        replayed_work_id=replayed_work_id,
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
