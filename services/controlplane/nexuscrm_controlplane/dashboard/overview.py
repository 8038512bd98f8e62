"""What the operator dashboard shows, as JSON-ready dictionaries: read-only, bounded reads.

``packs_overview`` is the page's main view (per pack: protocol state, fences and overrides,
queue depth by state, oldest waiting work, lag, failures, receipts waiting or missing
coverage, the drain status while the pack has no protocol row yet, the cutover audit
report). ``pack_queue`` is the per-pack part the Prometheus collector shares.
``pack_timeline`` lists each projection identity's newest generations; ``receipts`` lists
receipts in one state and ``search`` explains a WorkId or a ReceiptKey, both by asking
Connectors over its RPCs (``dashboard.connectors``: GetWork, ExplainReceipt, ListReceipts), so
they raise ``ConnectorsUnavailable`` while it is down; the rest reads the canonical tables
directly (``dashboard.queries``, the one documented cross-owner read) and keeps working.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any

from sqlalchemy.engine import Connection, Engine

from nexuscrm_controlplane import drain, fences
from nexuscrm_controlplane import queries as cp_queries
from nexuscrm_controlplane.audit import SAMPLE_LIMIT
from nexuscrm_controlplane.dashboard import queries
from nexuscrm_controlplane.dashboard.connectors import ConnectorsReads, PrunedWork
from nexuscrm_runtime.clock import DatabaseClock
from nexuscrm_runtime.clock import iso_utc as iso
from nexuscrm_schema.tables import NAMESPACE_SCOPE, WORK_ID_LENGTH
from nexuscrm_wire import lookups
from workqueue import ReceiptState, WorkStatus, decode_projection_key
from workqueue.errors import InvalidArgument
from workqueue.statuses import NONTERMINAL_WORK_STATUSES as NONTERMINAL
from workqueue.values import WorkDescription, WorkItemRow

PACK_LIMIT = 50  # packs on the page, newest first
COUNT_CAP = 10_000  # counts of sets that grow with history stop here ("10000+")
IDENTITY_PAGE = 20  # projection identities per timeline page
GENERATIONS_PER_IDENTITY = 8  # newest generations drawn per identity
RECEIPT_PAGE = 50  # receipts per listing
SEARCH_MAX_LENGTH = 255  # a ReceiptKey's length; WorkIds are shorter
FAILURES_EXAMINED = 200  # newest failures of a pack its card's "Failed generations" picks dead letters from
QUEUE_STATES = tuple(s.value for s in NONTERMINAL)


@dataclasses.dataclass(frozen=True, kw_only=True)
class QueueStats:
    """The queue of one pack as of ``now``: depth by state, ages in seconds, capped counts."""

    depth: dict[str, int]
    oldest_unclaimed_work_id: str | None
    oldest_unclaimed_age_seconds: float | None
    end_to_end_lag_seconds: float | None
    oldest_open_ordinal: int | None
    leases_expired: int
    stranded: int
    failed: int
    dead_letters: int  # of the COUNT_CAP newest failures: neither replayed nor skipped
    receipts_waiting: int
    receipts_coverage_missing: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return dataclasses.asdict(self)


def pack_queue(connection: Connection, pack_install_id: str, now: dt.datetime) -> QueueStats:
    """Queue depth per nonterminal state, oldest unclaimed generation, lag and capped counts of one pack.

    End-to-end lag is the age of the oldest input that no finished generation has executed
    yet (0 when every input is executed). Receipts waiting are stored and not confirmed:
    behind a fence, or not materialized yet. Stranded generations are blocked behind a
    terminal or missing predecessor: only the Connectors liveness sweep moves them.
    """
    counts = queries.work_status_counts(connection, pack_install_id, QUEUE_STATES)
    oldest = queries.work_oldest_claimable(connection, pack_install_id)
    open_input = queries.work_oldest_open_input(connection, pack_install_id, NONTERMINAL)
    return QueueStats(
        depth={state: counts.get(state, 0) for state in QUEUE_STATES},
        oldest_unclaimed_work_id=None if oldest is None else oldest.WorkId,
        oldest_unclaimed_age_seconds=None if oldest is None else max(0.0, (now - oldest.ClaimableAt).total_seconds()),
        end_to_end_lag_seconds=0.0 if open_input is None else max(0.0, (now - open_input.CreatedAt).total_seconds()),
        oldest_open_ordinal=None if open_input is None else int(open_input.EnqueueOrdinal),
        leases_expired=queries.work_leases_expired_count(connection, pack_install_id, now),
        stranded=queries.work_stranded_count_capped(connection, pack_install_id, COUNT_CAP),
        failed=queries.work_status_count_capped(connection, pack_install_id, WorkStatus.FAILED, COUNT_CAP),
        dead_letters=queries.work_dead_letter_count(connection, pack_install_id, COUNT_CAP),
        receipts_waiting=queries.receipt_count_capped(connection, pack_install_id, ReceiptState.STORED, COUNT_CAP),
        receipts_coverage_missing=queries.receipt_count_capped(
            connection, pack_install_id, ReceiptState.COVERAGE_MISSING, COUNT_CAP
        ),
    )


def _protocol_state(row: Any) -> dict[str, Any]:
    if row.Origin is None:
        return {"state": "none", "label": "no protocol row: old protocol or not activated"}
    if row.Origin == "greenfield":
        return {"state": "greenfield", "label": "greenfield (LegacyMaxOrdinal 0)", "since": iso(row.ProtocolCreatedAt)}
    return {
        "state": "cutover",
        "label": f"cut over at LegacyMaxOrdinal {row.LegacyMaxOrdinal}",
        "legacy_max_ordinal": int(row.LegacyMaxOrdinal),
        "since": iso(row.ProtocolCreatedAt),
    }


def _fence(fence: fences.FenceRow, pack_install_id: str, now: dt.datetime) -> dict[str, Any]:
    released = any(o.pack_install_id == pack_install_id for o in fence.active_overrides(now))
    return {**fence.to_dict(now), "holds_pack": fence.active(now) and not released}


def packs_overview(engine: Engine, clock: DatabaseClock) -> dict[str, Any]:
    """Everything the page's pack cards show, for the newest ``PACK_LIMIT`` packs; ages on the database's clock."""
    with engine.connect() as connection:
        now = clock.read(connection)
        packs = queries.packs_list(connection, PACK_LIMIT)
        namespace_fences = {
            namespace: fences.with_overrides(connection, cp_queries.fences_list(connection, namespace))
            for namespace in sorted({row.Namespace for row in packs})
        }
        cards = []
        for row in packs:
            pack_fences = [
                f for f in namespace_fences[row.Namespace] if f.scope in (NAMESPACE_SCOPE, row.PackInstallId)
            ]
            cards.append(
                {
                    "pack_install_id": row.PackInstallId,
                    "namespace": row.Namespace,
                    "pack_name": row.PackName,
                    "pack_version": row.PackVersion,
                    "ordinal_counter": int(row.LastOrdinal),
                    "created_at": iso(row.CreatedAt),
                    "protocol": _protocol_state(row),
                    "fences": [_fence(f, row.PackInstallId, now) for f in pack_fences],
                    "queue": pack_queue(connection, row.PackInstallId, now).to_dict(),
                    "failures": [
                        {
                            "work_id": f.WorkId,
                            "range": [f.InputStartOrdinal, f.LaneOrdinal],
                            "attempt": f.Attempt,
                            "last_error": (f.LastError or "")[:500],
                            "finished_at": iso(f.FinishedAt),
                        }
                        for f in queries.work_dead_letters_newest(connection, row.PackInstallId, FAILURES_EXAMINED)[
                            :SAMPLE_LIMIT
                        ]
                    ],
                    # Old-protocol work matters only until the protocol row is written (the
                    # cutover checks that it drained), so only such packs pay for the drain reads.
                    "drain": None
                    if row.Origin is not None
                    else drain.drain_status_read(connection, row.PackInstallId, clock).to_dict(),
                    "audit_report": json.loads(row.AuditReport) if row.AuditReport else None,
                }
            )
    return {"now": iso(now), "count_cap": COUNT_CAP, "packs": cards}


def _operated(row: Any) -> dict[str, Any]:
    """What operators decided of a generation (``queries.work_operated``'s columns), as the page shows it.

    ``held_behind``: the WorkId a pending generation the "block" policy holds waits for;
    ``resolution``: "replayed" or "skipped" for a failed one that is no longer a dead letter;
    ``skip``: who skipped it, when and why.
    """
    skipped = row.SkippedAt is not None
    return {
        "held_behind": row.HeldBehind,
        "resolution": "replayed" if row.Replayed else "skipped" if skipped else None,
        "skip": {"skipped_by": row.SkippedBy, "reason": row.SkipReason, "skipped_at": iso(row.SkippedAt)}
        if skipped
        else None,
    }


def _generation(row: Any) -> dict[str, Any]:
    return {
        "work_id": row.WorkId,
        "start": row.InputStartOrdinal,
        "end": int(row.LaneOrdinal),
        "status": row.Status,
        "attempt": int(row.Attempt),
        "max_attempts": int(row.MaxAttempts),
        "replay_of": row.ReplayOfWorkId,
        **_operated(row),
    }


def pack_timeline(engine: Engine, pack_install_id: str, after: str = "") -> dict[str, Any]:
    """A page of the pack's projection identities, each with its newest generations (oldest first).

    ``next`` is the ``after`` of the following page ("" at the end).
    """
    with engine.connect() as connection:
        keys = queries.work_identities_page(connection, pack_install_id, after, IDENTITY_PAGE)
        identities = []
        for key in keys:
            identity = decode_projection_key(key)
            rows = queries.identity_generations_newest(connection, pack_install_id, key, GENERATIONS_PER_IDENTITY)
            identities.append(
                {
                    "projection_key": key,
                    "label": f"{identity.source_lane} · {identity.work_type} · {identity.event_kind}",
                    "generations": [_generation(row) for row in reversed(rows)],
                }
            )
    following = keys[-1] if len(keys) == IDENTITY_PAGE else ""
    return {"pack_install_id": pack_install_id, "identities": identities, "next": following}


def receipts(connectors: ConnectorsReads, state: str, pack_install_id: str = "") -> list[dict[str, Any]]:
    """The oldest ``RECEIPT_PAGE`` receipts in ``state`` (of one pack, or all), via Connectors' ListReceipts."""
    listed = connectors.list_receipts(state, pack_install_id, RECEIPT_PAGE)
    return [
        {
            "pack_install_id": r.pack_install_id,
            "receipt_key": r.receipt_key,
            "state": r.state,
            "lane": r.route.source_lane,
            "work_type": r.route.work_type,
            "received_at": iso(r.received_at),
        }
        for r in listed
    ]


_WAITING = {
    WorkStatus.PENDING: "claimable; waits for a worker of its pack and work type",
    WorkStatus.BLOCKED: "waits for its predecessor of the same identity to finish (invariant X)",
    WorkStatus.PROCESSING: "leased to a worker",
    WorkStatus.RETRY: "an attempt failed; waits for its next attempt time",
    WorkStatus.COMPLETED: "executed: every member was loaded and the Flow completed",
    WorkStatus.FAILED: "failed for good; an operator may replay it",
}


def _work(work: WorkItemRow, member_count: int | None) -> dict[str, Any]:
    return {
        "work_id": work.work_id,
        "pack_install_id": work.pack_install_id,
        "identity": decode_projection_key(work.projection_key).source_lane,
        "range": [work.input_start_ordinal, work.lane_ordinal],
        "members": member_count,
        "status": work.status.value,
        "status_detail": _WAITING[work.status],
        "attempt": work.attempt,
        "max_attempts": work.max_attempts,
        "lease_owner": work.lease_owner,
        "lease_expires_at": iso(work.lease_expires_at),
        "claimable_at": iso(work.claimable_at),
        "last_error": work.last_error,
        "replay_of": work.replay_of_work_id,
    }


def _attempts(described: WorkDescription) -> dict[str, Any]:
    """A generation's attempts that did not complete it, oldest first, and the newest traceback.

    The Flow's messages and traceback, shown as LastError is: to operators, never logged.
    """
    attempts = [
        {
            "attempt": a.attempt,
            "worker_id": a.worker_id,
            "started_at": iso(a.started_at),
            "finished_at": iso(a.finished_at),
            "outcome": a.outcome.value,
            "error": a.error,
        }
        for a in described.attempts
    ]
    traceback = next((a.traceback for a in reversed(described.attempts) if a.traceback), None)
    return {"attempts": attempts, "attempt_count": described.attempt_count, "last_traceback": traceback}


def _operated_of(engine: Engine, work_id: str) -> dict[str, Any]:
    """``_operated`` of one generation (one primary-key read); nothing for a WorkId not in the table."""
    with engine.connect() as connection:
        row = queries.work_operated(connection, work_id)
    return {} if row is None else _operated(row)


def search(engine: Engine, connectors: ConnectorsReads, text: str) -> list[dict[str, Any]]:
    """Explain ``text`` as a WorkId and as a ReceiptKey of every listed pack; every match found.

    A WorkId match names its range, member count and what it waits for; a receipt match
    names its ordinal, the generation covering it, or why there is none; no match is one
    ``none`` entry saying so in the words ``nexuscrm why`` uses (``nexuscrm_wire.lookups``). One
    GetWork and one ExplainReceipt per listed pack (primary-key reads in Connectors); the pack
    list, and what operators decided of each generation found (held, replayed, skipped, as the
    timeline shows it), are read here.
    """
    text = text.strip()
    if not text or len(text) > SEARCH_MAX_LENGTH:
        raise InvalidArgument(f"search for a WorkId or a ReceiptKey of 1 to {SEARCH_MAX_LENGTH} characters", field="q")
    found: list[dict[str, Any]] = []
    # Connectors refuses a WorkId longer than its column: no such work exists.
    described = connectors.get_work(text) if len(text) <= WORK_ID_LENGTH else None
    if isinstance(described, PrunedWork):
        found.append({"kind": "pruned", "work_id": described.work_id, "explanation": described.explanation})
    elif described is not None:
        found.append(
            {
                "kind": "work",
                **_work(described.work, described.member_count),
                **_attempts(described),
                **_operated_of(engine, described.work.work_id),
            }
        )
    with engine.connect() as connection:
        pack_ids = [row.PackInstallId for row in queries.packs_list(connection, PACK_LIMIT)]
    for pack_install_id in pack_ids:
        explained = connectors.explain_receipt(pack_install_id, text)
        if explained is None:
            continue
        covered = explained.covered_by
        found.append(
            {
                "kind": "receipt",
                "pack_install_id": pack_install_id,
                "receipt_key": text,
                "receipt_state": explained.receipt_state,
                "enqueue_ordinal": explained.enqueue_ordinal,
                "explanation": explained.explanation,
                "covered_by": None
                if covered is None
                else {**_work(covered, None), **_operated_of(engine, covered.work_id)},
            }
        )
    return found or [{"kind": "none", "explanation": lookups.nothing_found(text, "the listed packs")}]
