"""Duplicate verification: is an already-admitted input acknowledged, or is coverage missing?

The protocol row is read by primary key first (by the caller, once per batch). An input at
or below LegacyMaxOrdinal is acknowledged without interpreting history: the cutoff is an
old-protocol boundary, not proof of business success. Above it, a generation of the same
identity must contain the ordinal, in any status (terminal included): then the duplicate is
covered. Otherwise coverage is missing: an explicit error. An input that retention pruned
(its receipt's tombstone) is acknowledged as expired: its generation was terminal when it
went (decision 123). With Flow versions, an input its own version no longer received is covered
by the live version's generation (decision 185). Nothing here reconstructs a task, replays a source or acknowledges
silently.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy.engine import Connection

from nexuscrm_connectors.queries import events as events_sql
from nexuscrm_connectors.queries.events import AdmittedInput
from nexuscrm_connectors.queries.flow_versions import Track
from nexuscrm_connectors.queries.packs import Protocol
from nexuscrm_connectors.queries.work_items import Generation
from nexuscrm_connectors.queue import tracks as version_tracks
from nexuscrm_runtime.clock import iso_utc
from workqueue.values import IngestResult, Outcome


def verify_duplicates(
    connection: Connection, protocol: Protocol, events: Mapping[str, AdmittedInput], tracks: Sequence[Track] = ()
) -> dict[str, IngestResult]:
    """Classify deliveries whose receipt keys already have Events; results by receipt key.

    ``events`` maps receipt keys to rows of ``events_sql.events_by_receipt``, which carry their
    identity's newest generation: when it holds the input, it is the covering generation
    (generations never overlap). Only the other inputs (older than their identity's newest
    generation) cost a statement, one however many they are: ``events_sql.work_items_covering``
    (decision 132). Inputs that no generation covers then cost one more, read again in case
    retention pruned them in between.
    """
    candidates: dict[str, Generation | None] = {}
    older: dict[str, AdmittedInput] = {}
    for key, event in events.items():
        if event.EnqueueOrdinal <= protocol.legacy_max_ordinal or event.PrunedAt is not None:
            continue
        newest = events_sql.carried_newest(event)
        if newest is not None and _holds(newest, int(event.EnqueueOrdinal)):
            candidates[key] = newest
        else:
            older[key] = event
    candidates.update(events_sql.work_items_covering(connection, protocol.pack_install_id, older))
    if tracks:  # an input admitted while its own version did not receive is covered by the live one's
        live = {
            key: event._replace(ProjectionKey=version_tracks.live_key(tracks, event.ProjectionKey))
            for key, event in older.items()
            if event.ProjectionKey and not _covers(candidates.get(key), int(event.EnqueueOrdinal))
        }
        candidates.update(events_sql.work_items_covering(connection, protocol.pack_install_id, live, as_given=True))
    uncovered = [key for key, event in older.items() if not _covers(candidates.get(key), int(event.EnqueueOrdinal))]
    if uncovered:
        # Each statement reads its own snapshot (READ COMMITTED): retention may have pruned
        # these inputs' generations since ``events`` was read. Read them again, so that a
        # pruned one is acknowledged as pruned, and only a real gap is coverage missing.
        events = {**events, **events_sql.events_by_receipt(connection, protocol.pack_install_id, uncovered)}
    return {key: _verdict(protocol, key, event, candidates.get(key)) for key, event in events.items()}


def _covers(generation: Generation | None, ordinal: int) -> bool:
    return generation is not None and _holds(generation, ordinal)


def _holds(generation: Generation, ordinal: int) -> bool:
    """Whether the input of ``ordinal`` is a member of ``generation`` (old-protocol work has no start)."""
    start = generation.InputStartOrdinal
    return start is not None and start <= ordinal <= generation.LaneOrdinal


def _verdict(protocol: Protocol, receipt_key: str, event: AdmittedInput, candidate: Generation | None) -> IngestResult:
    ordinal = int(event.EnqueueOrdinal)
    if event.PrunedAt is not None:
        return IngestResult(
            receipt_key=receipt_key,
            outcome=Outcome.DUPLICATE_PRUNED,
            enqueue_ordinal=ordinal,
            work_id=event.WorkId,
            message=f"duplicate of input {ordinal}, pruned at {iso_utc(event.PrunedAt)} by the pack's retention "
            f"policy with its terminal generation {event.WorkId}; acknowledged as expired, no work created",
        )
    if ordinal <= protocol.legacy_max_ordinal:
        return IngestResult(
            receipt_key=receipt_key,
            outcome=Outcome.DUPLICATE_LEGACY,
            enqueue_ordinal=ordinal,
            message=f"duplicate of an input admitted under the old protocol (ordinal {ordinal} <= "
            f"LegacyMaxOrdinal {protocol.legacy_max_ordinal})",
        )
    # The candidate is the identity's first generation ending at or above the ordinal (or its
    # newest, holding the input); it holds the input only if it also starts at or below it.
    if candidate is not None and _holds(candidate, ordinal):
        return IngestResult(
            receipt_key=receipt_key,
            outcome=Outcome.DUPLICATE_COVERED,
            enqueue_ordinal=ordinal,
            work_id=candidate.WorkId,
            message=f"duplicate covered by generation {candidate.WorkId} "
            f"[{candidate.InputStartOrdinal}, {candidate.LaneOrdinal}] ({candidate.Status})",
        )
    return IngestResult(
        receipt_key=receipt_key,
        outcome=Outcome.COVERAGE_MISSING,
        enqueue_ordinal=ordinal,
        message=f"coverage missing: no generation contains input {ordinal}; the receipt is not acknowledged "
        "and no task is reconstructed or replayed (a separately reviewed recovery decision is needed)",
    )
