"""Read-only answers for operators: one generation, and why a receipt has (no) work.

``ReceiptExplanation`` and ``ReceiptSummary`` are shared values (``workqueue.values``): the
Connectors SDK returns the same types over ExplainReceipt and ListReceipts.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import NoReturn

from sqlalchemy.engine import Connection, Engine

from nexuscrm_connectors import page_tokens, pruned
from nexuscrm_connectors.context import Context
from nexuscrm_connectors.errors import UnknownPack, WorkNotFound
from nexuscrm_connectors.queries import DbRow
from nexuscrm_connectors.queries import events as events_sql
from nexuscrm_connectors.queries import operator_reads as operator_reads_sql
from nexuscrm_connectors.queries import packs as packs_sql
from nexuscrm_connectors.queries import receipts as receipts_sql
from nexuscrm_connectors.queries import retention as retention_sql
from nexuscrm_connectors.queries import work_attempts as work_attempts_sql
from nexuscrm_connectors.queries import work_items as work_items_sql
from nexuscrm_connectors.queue import retries
from nexuscrm_connectors.queue.duplicates import verify_duplicates
from nexuscrm_runtime.causal import causal_read
from nexuscrm_runtime.clock import iso_utc
from nexuscrm_wire import lookups
from workqueue import ReceiptState, decode_projection_key
from workqueue.errors import InvalidArgument
from workqueue.statuses import AttemptOutcome
from workqueue.values import Outcome, ReceiptExplanation, ReceiptSummary, Route, WorkAttemptRow, WorkDescription

PRUNED_STATE = "pruned"  # ExplainReceipt's receipt_state of a receipt retention replaced by its tombstone


ATTEMPTS_SHOWN = 50  # newest attempts GetWork answers (each up to TRACEBACK_MAX_BYTES of traceback)


def get_work(context: Context, work_id: str) -> WorkDescription:
    """Describe one WorkItem; raises ``WorkNotFound``, or ``WorkPruned`` saying when retention pruned it.

    Its max attempts are the effective ones (``retries.effective``), and it comes with its
    newest ``ATTEMPTS_SHOWN`` attempts that did not complete it, oldest first.
    """
    engine, settings = context.engine, context.settings
    if not work_id:
        raise InvalidArgument("work_id is required", field="work_id")
    with engine.connect() as connection:
        causal_read(connection)  # an operator acts on it: it sees every acknowledged write
        row = work_items_sql.work_item_get(connection, work_id)
        if row is None:
            pruned.refuse_if_pruned(connection, work_id)
        members = 0
        if row.InputStartOrdinal is not None:
            members = events_sql.event_range_count(
                connection, row.PackInstallId, row.member_key, row.InputStartOrdinal, row.LaneOrdinal
            )
        policy = retries.effective(connection, settings, row)
        attempts = work_attempts_sql.work_attempts_newest(connection, work_id, ATTEMPTS_SHOWN)
    return WorkDescription(
        work=dataclasses.replace(work_items_sql.work_item_value(row), max_attempts=policy.max_attempts),
        member_count=members,
        attempts=tuple(_attempt(a) for a in reversed(attempts)),
        attempt_count=attempts[0].Attempt if attempts else 0,
    )


def _attempt(row: DbRow) -> WorkAttemptRow:
    return WorkAttemptRow(
        attempt=row.Attempt,
        worker_id=row.WorkerId,
        started_at=row.StartedAt,
        finished_at=row.FinishedAt,
        outcome=AttemptOutcome(row.Outcome),
        error=row.Error,
        traceback=row.Traceback,
    )


def explain_receipt(engine: Engine, pack_install_id: str, receipt_key: str) -> ReceiptExplanation:
    """Say which generation covers a receipt's input, or why no work exists for it."""
    if not pack_install_id or not receipt_key:
        raise InvalidArgument("pack_install_id and receipt_key are required", field="receipt_key")
    with engine.connect() as connection:
        receipt = receipts_sql.receipt_get(connection, pack_install_id, receipt_key)
        if receipt is None:
            pruned = events_sql.events_by_receipt(connection, pack_install_id, [receipt_key]).get(receipt_key)
            if pruned is None or pruned.PrunedAt is None:
                _refuse_unknown_receipt(connection, pack_install_id, receipt_key)
            return ReceiptExplanation(
                receipt_state=PRUNED_STATE,
                enqueue_ordinal=pruned.EnqueueOrdinal,
                covered_by=None,
                explanation=f"pruned at {iso_utc(pruned.PrunedAt)} by the pack's retention policy: input "
                f"{pruned.EnqueueOrdinal} was a member of terminal generation {pruned.WorkId}; a duplicate delivery "
                "is acknowledged as pruned and creates no work",
            )
        event = events_sql.events_by_receipt(connection, pack_install_id, [receipt_key]).get(receipt_key)
        if event is None:
            return ReceiptExplanation(
                receipt_state=receipt.State,
                enqueue_ordinal=None,
                covered_by=None,
                explanation="stored durably but not admitted yet: an admission fence held the pack, or the "
                "pack has no protocol row yet; the materializer admits it once admission is possible",
            )
        protocol = packs_sql.protocol_get(connection, pack_install_id)
        if protocol is None:
            return ReceiptExplanation(
                receipt_state=receipt.State,
                enqueue_ordinal=event.EnqueueOrdinal,
                covered_by=None,
                explanation="admitted by the old protocol; the pack has not been cut over, so coverage is inferred",
            )
        verdict = verify_duplicates(connection, protocol, {receipt_key: event})[receipt_key]
        covering = work_items_sql.work_item_get(connection, verdict.work_id) if verdict.work_id else None
        explanation = verdict.message
        if verdict.outcome is Outcome.DUPLICATE_COVERED:
            explanation = f"input {event.EnqueueOrdinal} is a member of " + verdict.message.removeprefix(
                "duplicate covered by "
            )
        if receipt.State == ReceiptState.STORED and verdict.outcome is not Outcome.COVERAGE_MISSING:
            explanation += "; the receipt is not confirmed yet (the materializer confirms it)"
        return ReceiptExplanation(
            receipt_state=receipt.State,
            enqueue_ordinal=event.EnqueueOrdinal,
            covered_by=work_items_sql.work_item_value(covering) if covering is not None else None,
            explanation=explanation,
        )


def _refuse_unknown_receipt(connection: Connection, pack_install_id: str, receipt_key: str) -> NoReturn:
    """Raise why the pack has no receipt ``receipt_key``: no such pack, a WorkId given as the key, or neither.

    Said in the words of the dashboard's search (``nexuscrm_wire.lookups``).
    """
    if operator_reads_sql.pack_namespace(connection, pack_install_id) is None:
        raise UnknownPack(f"pack_install_id {pack_install_id!r} is not installed", field="pack_install_id")
    if (
        work_items_sql.work_item_get(connection, receipt_key) is not None
        or retention_sql.pruned_work_get(connection, receipt_key) is not None
    ):
        raise WorkNotFound(lookups.work_id_not_receipt(receipt_key), field="receipt_key")
    raise WorkNotFound(
        lookups.nothing_found(receipt_key, f"pack {pack_install_id}") + _expired_hint(connection, pack_install_id),
        field="receipt_key",
    )


def _expired_hint(connection: Connection, pack_install_id: str) -> str:
    """What an unknown key may be in a pack whose duplicate window expired tombstones."""
    protocol = packs_sql.protocol_get(connection, pack_install_id)
    if protocol is None or protocol.horizon_source_time is None:
        return ""
    return (
        f"; the pack's duplicate window has expired the records of inputs with source time at or below "
        f"{iso_utc(protocol.horizon_source_time)}: a delivery at or below it is acknowledged as expired, no work"
    )


def list_receipts(
    context: Context, state: str, pack_install_id: str = "", page_size: int = 0, page_token: str = ""
) -> tuple[list[ReceiptSummary], str]:
    """One page of receipts in ``state``, oldest first per pack, and the next page's token ("" at the end).

    Raises ``UnknownPack`` when ``pack_install_id`` names no installed pack.
    """
    engine, settings = context.engine, context.settings
    try:
        wanted = ReceiptState(state)
    except ValueError:
        known = ", ".join(s.value for s in ReceiptState)
        raise InvalidArgument(f"state must be one of {known}, got {state!r}", field="state") from None
    size = settings.page_size(page_size)
    with engine.connect() as connection:
        if pack_install_id and operator_reads_sql.pack_namespace(connection, pack_install_id) is None:
            raise UnknownPack(f"pack_install_id {pack_install_id!r} is not installed", field="pack_install_id")
        rows = operator_reads_sql.receipts_in_state(
            connection,
            wanted,
            pack_install_id or None,
            page_tokens.decode_token(page_token, "ListReceipts", _receipt_position),
            size,
        )
    receipts = [
        ReceiptSummary(
            pack_install_id=row.PackInstallId,
            receipt_key=row.ReceiptKey,
            state=row.State,
            route=Route.of(decode_projection_key(row.ProjectionKey)),
            received_at=row.ReceivedAt,
        )
        for row in rows
    ]
    last = receipts[-1] if len(receipts) == size else None
    token = (
        page_tokens.encode_token((last.pack_install_id, last.received_at.isoformat(), last.receipt_key)) if last else ""
    )
    return receipts, token


def _receipt_position(values: list[object]) -> tuple[str, dt.datetime, str]:
    pack, received_at, key = values
    return page_tokens.string(pack), dt.datetime.fromisoformat(page_tokens.string(received_at)), page_tokens.string(key)
