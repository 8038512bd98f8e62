"""Duplicate verification: is an already-admitted input acknowledged, or is coverage missing?

The protocol row is read by primary key first (by the caller, once per batch). An input at
or below LegacyMaxOrdinal is acknowledged without interpreting history: the cutoff is an
old-protocol boundary, not proof of business success. Above it, a generation of the same
identity must contain the ordinal, in any status (terminal included): then the duplicate is
covered. Otherwise coverage is missing: an explicit error. Nothing here reconstructs a task,
replays a source or acknowledges silently.
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from nexuscrm_connectors import queries
from nexuscrm_connectors.models import IngestResult, Outcome
from nexuscrm_connectors.packs import Protocol
from nexuscrm_connectors.queries import DbRow


def verify_duplicate(connection: Connection, protocol: Protocol, receipt_key: str, event: DbRow) -> IngestResult:
    """Classify a delivery whose receipt key already has ``event`` (EnqueueOrdinal, ProjectionKey)."""
    ordinal = int(event.EnqueueOrdinal)
    if ordinal <= protocol.legacy_max_ordinal:
        return IngestResult(
            receipt_key=receipt_key,
            outcome=Outcome.DUPLICATE_LEGACY,
            enqueue_ordinal=ordinal,
            message=f"duplicate of an input admitted under the old protocol (ordinal {ordinal} <= "
            f"LegacyMaxOrdinal {protocol.legacy_max_ordinal})",
        )
    covering = queries.work_item_covering(connection, protocol.pack_install_id, event.ProjectionKey, ordinal)
    if covering is not None:
        return IngestResult(
            receipt_key=receipt_key,
            outcome=Outcome.DUPLICATE_COVERED,
            enqueue_ordinal=ordinal,
            work_id=covering.WorkId,
            message=f"duplicate covered by generation {covering.WorkId} "
            f"[{covering.InputStartOrdinal}, {covering.LaneOrdinal}] ({covering.Status})",
        )
    return IngestResult(
        receipt_key=receipt_key,
        outcome=Outcome.COVERAGE_MISSING,
        enqueue_ordinal=ordinal,
        message=f"coverage missing: no generation contains input {ordinal}; the receipt is not acknowledged "
        "and no task is reconstructed or replayed (a separately reviewed recovery decision is needed)",
    )
