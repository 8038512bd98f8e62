"""IngressReceipt: the stored receipts admission reads and writes, and the materializer's backlog."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from nexuscrm_connectors.queries import DbRow
from nexuscrm_connectors.queries.rows import ReceiptRow
from nexuscrm_schema.hints import probe_exists
from nexuscrm_schema.tables import (
    Event,
    IngressReceipt,
)
from workqueue import ReceiptState

# The Payload of a receipt whose input has an Event: the payload is stored once, in the Event
# (the column is NOT NULL; the receipt's State says which receipts still carry theirs).
ADMITTED_RECEIPT_PAYLOAD = b""


class StoredReceipt(NamedTuple):
    """What admission compares a delivery with in its stored receipt (``receipts_get``)."""

    ReceiptKey: str
    PayloadHash: str
    ProjectionKey: str | None
    State: str


_RECEIPTS_GET = sa.select(
    IngressReceipt.c.ReceiptKey,
    IngressReceipt.c.PayloadHash,
    IngressReceipt.c.ProjectionKey,
    IngressReceipt.c.State,
).where(
    IngressReceipt.c.PackInstallId == sa.bindparam("pack_install_id"),
    IngressReceipt.c.ReceiptKey.in_(sa.bindparam("keys", expanding=True)),
)


def receipts_get(connection: Connection, pack_install_id: str, keys: Sequence[str]) -> dict[str, StoredReceipt]:
    """Stored receipts of ``keys`` (primary key lookups)."""
    rows = connection.execute(_RECEIPTS_GET, {"pack_install_id": pack_install_id, "keys": list(keys)})
    return {row.ReceiptKey: row for row in map(StoredReceipt._make, rows)}


def receipts_insert(connection: Connection, rows: Sequence[ReceiptRow] | Sequence[Mapping[str, Any]]) -> None:
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
