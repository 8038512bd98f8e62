"""Schema v8's data step: copy every Event's payload into EventPayload, in bounded batches.

The copy runs beside Connectors of the previous release (decision 126): it inserts the
EventPayload row and sets Event.PayloadBytes, and leaves Event.Payload as it is, because that
release still reads payloads from Event. Each batch is one transaction of at most
``COPY_BATCH_ROWS`` Events of one pack and ``MAX_TRANSACTION_BYTES`` of payload (TiDB's
transaction limit, decision 122). An Event is copied when its PayloadBytes is NULL and marked
by setting it in the same transaction, so an interrupted copy resumes where it stopped and a
repeated or concurrent one (two schema catalogs starting) copies nothing twice.
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from nexuscrm_runtime.budgets import MAX_TRANSACTION_BYTES, within_bytes
from nexuscrm_schema.tables import Event, EventPayload

log = logging.getLogger(__name__)

COPY_BATCH_ROWS = 500  # Events per copy transaction


def copy_event_payloads(engine: Engine) -> int:
    """Copy the payload of every Event whose PayloadBytes is NULL; return how many were copied.

    Packs in primary-key order, each in ordinal order (ranges of Event's clustered key); logs
    its progress per batch.
    """
    copied = 0
    pack = ""
    while (found := _next_pack(engine, pack)) is not None:
        pack, after = found, -1  # legacy history may hold ordinal 0  # legacy history may hold ordinal 0
        while (batch := _copy_batch(engine, pack, after)) is not None:
            count, after = batch
            copied += count
            log.info("v8: copied %d payloads of pack %s through ordinal %d (%d in all)", count, pack, after, copied)
    return copied


def _next_pack(engine: Engine, after: str) -> str | None:
    with engine.connect() as connection:
        return connection.execute(
            sa.select(Event.c.PackInstallId)
            .where(Event.c.PackInstallId > after)
            .order_by(Event.c.PackInstallId)
            .limit(1)
        ).scalar_one_or_none()


def _copy_batch(engine: Engine, pack: str, after: int) -> tuple[int, int] | None:
    """Copy the next batch of ``pack`` above ordinal ``after``: (how many, last ordinal), None when done."""
    with engine.begin() as connection:
        sizes = connection.execute(
            sa.select(Event.c.EnqueueOrdinal, sa.func.length(Event.c.Payload).label("Bytes"))
            .where(_uncopied(pack, after))
            .order_by(Event.c.EnqueueOrdinal)
            .limit(COPY_BATCH_ROWS)
            .with_for_update()  # a concurrent copy waits, then finds these copied and skips them
        ).all()
        if not sizes:
            return None
        through = within_bytes([(r.EnqueueOrdinal, r.Bytes) for r in sizes], MAX_TRANSACTION_BYTES)[-1]
        return _copy_range(connection, pack, after, through), through


def _uncopied(pack: str, after: int, through: int | None = None) -> sa.ColumnElement[bool]:
    condition = sa.and_(Event.c.PackInstallId == pack, Event.c.EnqueueOrdinal > after, Event.c.PayloadBytes.is_(None))
    return condition if through is None else sa.and_(condition, Event.c.EnqueueOrdinal <= through)


def _copy_range(connection: Connection, pack: str, after: int, through: int) -> int:
    batch = _uncopied(pack, after, through)
    connection.execute(
        sa.insert(EventPayload).from_select(
            ["PackInstallId", "EnqueueOrdinal", "Payload"],
            sa.select(Event.c.PackInstallId, Event.c.EnqueueOrdinal, Event.c.Payload).where(batch),
        )
    )
    return int(
        connection.execute(sa.update(Event).where(batch).values(PayloadBytes=sa.func.length(Event.c.Payload))).rowcount
    )
