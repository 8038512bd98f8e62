"""The operator's payload move (decision 150): every payload into EventPayload only, in bounded batches.

Applying the schema writes no existing row, so an Event admitted before schema v8 (or by a
release older than v8 since) keeps its payload in Event.Payload with PayloadBytes NULL, and
every reader finds it there for as long as the Event is retained. An Event a v10 or later
Connectors admitted before the payload contract was set holds its payload in EventPayload
and a copy in Event.Payload (decision 130). The move leaves each of them as admission leaves
an Event today: the EventPayload row (inserted when missing), PayloadBytes set, Event.Payload
empty. It runs only as ``nexuscrm schema contract-payloads`` (``payload_contract``), after the
contract is set, never as a step of applying the schema.

Each batch is one transaction of at most ``MOVE_BATCH_ROWS`` Events of one pack and
``MAX_TRANSACTION_BYTES`` of payload (TiDB's transaction limit, decision 122), packs in key
order and each in ordinal order (ranges of Event's clustered key). A moved Event no longer
matches ``PENDING``, so an interrupted move resumes from anywhere by skipping what is done,
and a concurrent one waits on the batch's row locks, then skips it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from nexuscrm_runtime.budgets import MAX_TRANSACTION_BYTES, within_bytes
from nexuscrm_schema.tables import Event, EventPayload

log = logging.getLogger(__name__)

MOVE_BATCH_ROWS = 500  # Events per move transaction
FIRST_ORDINAL = -1  # a pass starts above it: legacy history may hold ordinal 0
EMPTY_PAYLOAD = b""  # what Event.Payload holds once the payload is in EventPayload only
ONLY_IN_EVENT = Event.c.PayloadBytes.is_(None)  # no EventPayload row: the payload is in Event.Payload
# The Events the move changes: payload only in Event.Payload, or an old copy there.
PENDING = sa.or_(ONLY_IN_EVENT, Event.c.Payload != EMPTY_PAYLOAD)
_BYTES = sa.func.length(Event.c.Payload)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Batch:
    """One committed batch: ``emptied`` Events of ``pack`` through ``through``, ``moved`` of them copied, ``bytes``."""

    pack: str
    through: int
    emptied: int  # Events whose Event.Payload the batch emptied
    moved: int  # of them, those whose payload it copied into EventPayload (it was in Event only)
    bytes: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class Pending:
    """What a move would change now: ``events`` to empty, ``moves`` of them to copy first, ``bytes`` in all."""

    events: int
    moves: int
    bytes: int


def pending(connection: Connection) -> Pending:
    """Count what a move would change now, over the whole database (one read; changes nothing)."""
    found = connection.execute(
        sa.select(
            sa.func.count(),
            sa.func.coalesce(sa.func.sum(sa.case((ONLY_IN_EVENT, 1), else_=0)), 0),
            sa.func.coalesce(sa.func.sum(_BYTES), 0),
        ).where(PENDING)
    ).one()
    return Pending(events=int(found[0]), moves=int(found[1]), bytes=int(found[2]))


def move_batches(engine: Engine, start: tuple[str, int] = ("", FIRST_ORDINAL)) -> Iterator[Batch]:
    """Move every pending Event after (pack, ordinal) ``start``, one committed batch per item yielded.

    Logs each batch. Stopping the iteration between items leaves every batch committed or
    not begun.
    """
    pack, after = start
    while True:
        batch = _batch(engine, pack, after) if pack else None
        if batch is None:
            following = _next_pack(engine, pack)
            if following is None:
                return
            pack, after = following, FIRST_ORDINAL
            continue
        after = batch.through
        log.info(
            "payload move: emptied %d Events of pack %s through ordinal %d (%d copied into EventPayload)",
            batch.emptied,
            batch.pack,
            batch.through,
            batch.moved,
        )
        yield batch


def _next_pack(engine: Engine, after: str) -> str | None:
    with engine.connect() as connection:
        return connection.execute(
            sa.select(Event.c.PackInstallId)
            .where(Event.c.PackInstallId > after)
            .order_by(Event.c.PackInstallId)
            .limit(1)
        ).scalar_one_or_none()


def _batch(engine: Engine, pack: str, after: int) -> Batch | None:
    """Move the next batch of ``pack`` above ordinal ``after``; None when the pack has none left."""
    in_pack = sa.and_(Event.c.PackInstallId == pack, Event.c.EnqueueOrdinal > after, PENDING)
    with engine.begin() as connection:
        sizes = connection.execute(
            sa.select(Event.c.EnqueueOrdinal, _BYTES.label("Bytes"))
            .where(in_pack)
            .order_by(Event.c.EnqueueOrdinal)
            .limit(MOVE_BATCH_ROWS)
            .with_for_update()  # a concurrent move waits, then finds these moved and skips them
        ).all()
        if not sizes:
            return None
        through = within_bytes([(r.EnqueueOrdinal, r.Bytes) for r in sizes], MAX_TRANSACTION_BYTES)[-1]
        emptied, moved = _move(connection, sa.and_(in_pack, Event.c.EnqueueOrdinal <= through))
        size = sum(r.Bytes for r in sizes if r.EnqueueOrdinal <= through)
        return Batch(pack=pack, through=through, emptied=emptied, moved=moved, bytes=size)


def _move(connection: Connection, batch: sa.ColumnElement[bool]) -> tuple[int, int]:
    """Copy the batch's payloads kept only in Event, then empty every Event.Payload of it; (emptied, moved)."""
    moved = connection.execute(
        sa.insert(EventPayload).from_select(
            ["PackInstallId", "EnqueueOrdinal", "Payload"],
            sa.select(Event.c.PackInstallId, Event.c.EnqueueOrdinal, Event.c.Payload).where(batch, ONLY_IN_EVENT),
        )
    ).rowcount
    emptied = connection.execute(
        # PayloadBytes first: MySQL assigns left to right, a later SET seeing the earlier ones' values.
        sa.update(Event)
        .where(batch)
        .ordered_values(
            (Event.c.PayloadBytes, sa.func.coalesce(Event.c.PayloadBytes, _BYTES)),
            (Event.c.Payload, EMPTY_PAYLOAD),
        )
    ).rowcount
    return int(emptied), int(moved)
