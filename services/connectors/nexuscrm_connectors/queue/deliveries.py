"""A delivery as admission, replay, legacy admission and the benchmarks share it, and the rows it becomes.

A leaf: it imports no other module of the service but the receipts' SQL constants, so that
admission, replay and the legacy runtime build their receipt, Event and generation rows the
same way without importing each other (decision 155).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
from collections.abc import Iterable, Mapping, Sequence

from nexuscrm_connectors.queries import receipts as receipts_sql
from nexuscrm_connectors.queries.rows import EventRow, GenerationRow, ReceiptRow
from workqueue import EventStatus, ReceiptState, WorkStatus, decode_projection_key
from workqueue.values import IngestItem, IngestResult, Outcome


@dataclasses.dataclass(frozen=True, kw_only=True)
class Delivery:
    """A validated delivery with its projection key and payload digest (shared with the legacy runtime)."""

    item: IngestItem
    projection_key: str
    payload_hash: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class RefusedItem:
    """A delivery whose fields the transport could not read (an out-of-range Timestamp, an over-long key).

    It stands in its batch for its REJECTED outcome, so that one bad delivery never holds
    back the others of its call (``nexuscrm_runtime.requests``, item messages).
    """

    receipt_key: str
    message: str


def payload_hash(payload: bytes) -> str:
    """The stored digest of a payload (sha256, hex)."""
    return hashlib.sha256(payload).hexdigest()


def receipt_row(pack_install_id: str, delivery: Delivery, now: dt.datetime, *, state: ReceiptState) -> ReceiptRow:
    """The IngressReceipt row of a newly received delivery, written in ``state``.

    Only a stored receipt (not admitted yet) keeps the payload: an admitted input's payload
    is stored once, in its Event.
    """
    return {
        "PackInstallId": pack_install_id,
        "ReceiptKey": delivery.item.receipt_key,
        "ProjectionKey": delivery.projection_key,
        "PayloadHash": delivery.payload_hash,
        "Payload": delivery.item.payload if state is ReceiptState.STORED else receipts_sql.ADMITTED_RECEIPT_PAYLOAD,
        "SourceTime": delivery.item.source_time,
        "State": state,
        "ReceivedAt": now,
        "ConfirmedAt": now if state is ReceiptState.CONFIRMED else None,
    }


def event_row(
    pack_install_id: str,
    *,
    ordinal: int,
    projection_key: str,
    receipt_key: str | None,
    payload: bytes,
    digest: str,
    source_time: dt.datetime | None,
    is_replay: bool,
    now: dt.datetime,
) -> EventRow:
    """A new pending Event row: a fresh input (admission) or a replay Event (``replay``, no receipt).

    ``digest`` is ``payload_hash(payload)``, which admission has computed already.
    """
    return {
        "PackInstallId": pack_install_id,
        "EnqueueOrdinal": ordinal,
        "ProjectionKey": projection_key,
        "ReceiptKey": receipt_key,
        "PayloadHash": digest,
        "Payload": payload,
        "SourceTime": source_time,
        "Status": EventStatus.PENDING,
        "IsReplay": is_replay,
        "CreatedAt": now,
    }


def event_rows(
    pack_install_id: str, ordinals: Iterable[int], deliveries: Sequence[Delivery], now: dt.datetime
) -> list[EventRow]:
    """The Event rows of fresh deliveries, one ordinal each, in arrival order."""
    return [
        event_row(
            pack_install_id,
            ordinal=ordinal,
            projection_key=delivery.projection_key,
            receipt_key=delivery.item.receipt_key,
            payload=delivery.item.payload,
            digest=delivery.payload_hash,
            source_time=delivery.item.source_time,
            is_replay=False,
            now=now,
        )
        for ordinal, delivery in zip(ordinals, deliveries, strict=True)
    ]


def generation_row(
    *,
    work_id: str,
    pack_install_id: str,
    projection_key: str,
    start: int,
    end: int,
    members: int,
    blocked: bool,
    now: dt.datetime,
    max_attempts: int,
    replay_of_work_id: str | None = None,
    runs_before_work_id: str | None = None,
) -> GenerationRow:
    """A new generation [start, end] of ``members`` inputs; blocked while its predecessor is not terminal (X).

    The row records ``members`` as counted through ``end`` (AdmittedMemberCount and
    AdmittedThroughOrdinal): claim and LoadInputs refuse the range when its members come to
    differ. ``runs_before_work_id``: a replay that runs before that held generation (decision
    174); only such a row has the column.
    """
    row = GenerationRow(
        WorkId=work_id,
        PackInstallId=pack_install_id,
        ProjectionKey=projection_key,
        WorkType=decode_projection_key(projection_key).work_type,
        InputStartOrdinal=start,
        LaneOrdinal=end,
        ReplayOfWorkId=replay_of_work_id,
        Status=WorkStatus.BLOCKED if blocked else WorkStatus.PENDING,
        Attempt=0,
        MaxAttempts=max_attempts,
        ClaimableAt=None if blocked else now,
        CreatedAt=now,
        AdmittedMemberCount=members,
        AdmittedThroughOrdinal=end,
    )
    if runs_before_work_id:
        row["RunsBeforeWorkId"] = runs_before_work_id
    return row


def same_key_again(first: Delivery, again: Delivery, admitted: dict[str, IngestResult]) -> IngestResult:
    """A later delivery of a receipt key that an earlier delivery of the same transaction carried."""
    result = admitted[first.item.receipt_key]
    if again.item.payload != first.item.payload or again.item.route != first.item.route:
        return IngestResult(
            receipt_key=again.item.receipt_key,
            outcome=Outcome.REJECTED,
            message="receipt_key was delivered twice in one admission with a different payload or route",
        )
    if result.outcome is Outcome.ADMITTED:
        return IngestResult(
            receipt_key=again.item.receipt_key,
            outcome=Outcome.DUPLICATE_COVERED,
            enqueue_ordinal=result.enqueue_ordinal,
            work_id=result.work_id,
            message="duplicate of a delivery admitted in the same transaction",
        )
    return result


def first_of_each_key(deliveries: Iterable[Delivery]) -> dict[str, Delivery]:
    """The first delivery of each receipt key, in arrival order: what one admission transaction admits."""
    first: dict[str, Delivery] = {}
    for delivery in deliveries:
        first.setdefault(delivery.item.receipt_key, delivery)
    return first


def result_of(first: Mapping[str, Delivery], delivery: Delivery, admitted: dict[str, IngestResult]) -> IngestResult:
    """The result of ``delivery`` in a transaction that admitted ``first``: its own, or ``same_key_again``'s."""
    key = delivery.item.receipt_key
    return admitted[key] if first[key] is delivery else same_key_again(first[key], delivery, admitted)
