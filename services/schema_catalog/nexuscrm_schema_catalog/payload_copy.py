"""Schema v8's data step: copy every Event's payload into EventPayload, in bounded batches.

The copy runs beside Connectors of the previous release (decision 126): it inserts the
EventPayload row and sets Event.PayloadBytes, and leaves Event.Payload as it is, because that
release still reads payloads from Event. Each batch is one transaction of at most
``COPY_BATCH_ROWS`` Events of one pack and ``MAX_TRANSACTION_BYTES`` of payload (TiDB's
transaction limit, decision 122). An Event is copied when its PayloadBytes is NULL and marked
by setting it in the same transaction, so an interrupted copy resumes where it stopped and a
repeated or concurrent one (two schema catalogs starting) copies nothing twice.

``event_batches`` is that loop for any pass over Events that marks what it changed (the
payload contract's emptying of old copies uses it too, decision 130).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from nexuscrm_runtime.budgets import MAX_TRANSACTION_BYTES, within_bytes
from nexuscrm_schema.tables import Event, EventPayload

log = logging.getLogger(__name__)

COPY_BATCH_ROWS = 500  # Events per copy transaction
FIRST_ORDINAL = -1  # a pass starts above it: legacy history may hold ordinal 0
PAYLOAD_BYTES = Event.c.PayloadBytes.name  # the column v8 adds, which marks an Event copied


@dataclasses.dataclass(frozen=True, kw_only=True)
class Batch:
    """One committed batch of a pass: ``rows`` Events of ``pack`` through ordinal ``through``, ``bytes`` in all."""

    pack: str
    through: int
    rows: int
    bytes: int


# A pass changes the Events of one batch (the condition selects them) and returns how many.
Change = Callable[[Connection, sa.ColumnElement[bool]], int]


def event_batches(
    engine: Engine,
    *,
    pending: sa.ColumnElement[bool],
    size: sa.ColumnElement[int],
    change: Change,
    start: tuple[str, int] = ("", FIRST_ORDINAL),
) -> Iterator[Batch]:
    """Run ``change`` over every Event matching ``pending``, one committed batch at a time, from ``start``.

    Packs in primary-key order, each in ordinal order (ranges of Event's clustered key), from
    (pack, ordinal) ``start`` exclusive. A batch is at most ``COPY_BATCH_ROWS`` Events and
    ``MAX_TRANSACTION_BYTES`` of ``size`` (at least one Event). ``change`` must make an Event
    stop matching ``pending``, so a pass interrupted anywhere resumes from the start by
    skipping what is done, and a concurrent pass waits on the batch's locks, then skips it.
    """
    pack, after = start
    while True:
        batch = _batch(engine, pending, size, change, pack, after) if pack else None
        if batch is None:
            following = _next_pack(engine, pack)
            if following is None:
                return
            pack, after = following, FIRST_ORDINAL
            continue
        after = batch.through
        yield batch


def copy_event_payloads(engine: Engine, on_batch: Callable[[Batch], None]) -> int:
    """Copy the payload of every Event whose PayloadBytes is NULL; return how many were copied.

    Logs its progress per batch, then calls ``on_batch`` with the committed batch: if it
    raises, the copy stops there (what committed stays, and the next copy skips it).
    """
    copied = 0
    for batch in event_batches(
        engine, pending=Event.c.PayloadBytes.is_(None), size=sa.func.length(Event.c.Payload), change=_copy_range
    ):
        copied += batch.rows
        log.info(
            "v8: copied %d payloads of pack %s through ordinal %d (%d in all)",
            batch.rows,
            batch.pack,
            batch.through,
            copied,
        )
        on_batch(batch)
    return copied


def copy_started(connection: Connection) -> bool:
    """Whether v8's DDL (EventPayload and Event.PayloadBytes) is in place, so a copy may have begun."""
    inspector = sa.inspect(connection)
    if not inspector.has_table(EventPayload.name):
        return False
    return PAYLOAD_BYTES in {c["name"] for c in inspector.get_columns(Event.name)}


def payloads_left(connection: Connection) -> int:
    """How many Events the copy would copy now: those whose PayloadBytes is NULL (every Event before v8's DDL)."""
    inspector = sa.inspect(connection)
    if not inspector.has_table(Event.name):
        return 0
    everything = sa.select(sa.func.count()).select_from(Event)
    if not copy_started(connection):
        return int(connection.execute(everything).scalar_one())
    return int(connection.execute(everything.where(Event.c.PayloadBytes.is_(None))).scalar_one())


def payloads_copied(connection: Connection) -> int:
    """How many Events the copy has marked copied (PayloadBytes set); 0 before v8's DDL."""
    if not copy_started(connection):
        return 0
    copied = sa.select(sa.func.count()).select_from(Event).where(Event.c.PayloadBytes.is_not(None))
    return int(connection.execute(copied).scalar_one())


def _next_pack(engine: Engine, after: str) -> str | None:
    with engine.connect() as connection:
        return connection.execute(
            sa.select(Event.c.PackInstallId)
            .where(Event.c.PackInstallId > after)
            .order_by(Event.c.PackInstallId)
            .limit(1)
        ).scalar_one_or_none()


def _batch(
    engine: Engine, pending: sa.ColumnElement[bool], size: sa.ColumnElement[int], change: Change, pack: str, after: int
) -> Batch | None:
    """Change the next batch of ``pack`` above ordinal ``after``; None when the pack has none left."""
    in_pack = sa.and_(Event.c.PackInstallId == pack, Event.c.EnqueueOrdinal > after, pending)
    with engine.begin() as connection:
        sizes = connection.execute(
            sa.select(Event.c.EnqueueOrdinal, size.label("Bytes"))
            .where(in_pack)
            .order_by(Event.c.EnqueueOrdinal)
            .limit(COPY_BATCH_ROWS)
            .with_for_update()  # a concurrent pass waits, then finds these changed and skips them
        ).all()
        if not sizes:
            return None
        through = within_bytes([(r.EnqueueOrdinal, r.Bytes) for r in sizes], MAX_TRANSACTION_BYTES)[-1]
        rows = change(connection, sa.and_(in_pack, Event.c.EnqueueOrdinal <= through))
        return Batch(
            pack=pack, through=through, rows=rows, bytes=sum(r.Bytes for r in sizes if r.EnqueueOrdinal <= through)
        )


def _copy_range(connection: Connection, batch: sa.ColumnElement[bool]) -> int:
    connection.execute(
        sa.insert(EventPayload).from_select(
            ["PackInstallId", "EnqueueOrdinal", "Payload"],
            sa.select(Event.c.PackInstallId, Event.c.EnqueueOrdinal, Event.c.Payload).where(batch),
        )
    )
    return int(
        connection.execute(sa.update(Event).where(batch).values(PayloadBytes=sa.func.length(Event.c.Payload))).rowcount
    )
