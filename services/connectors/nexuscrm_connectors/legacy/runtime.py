"""The legacy (v0) runtime: admission and work the way the old protocol did them (decision 010).

It builds old-protocol history for real (inferred inputs, coalesced Events, a WorkItem-only
handoff) so that it can be drained, audited and cut over; every write refuses a pack that has
a protocol row (``LegacyRefused``).
"""

from __future__ import annotations

import datetime as dt
import functools
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.engine import Connection, Engine

from nexuscrm_connectors import payload_contract
from nexuscrm_connectors.errors import LeaseLost, LegacyRefused, WorkNotFound
from nexuscrm_connectors.legacy import queries as legacy_sql
from nexuscrm_connectors.queries import DbRow
from nexuscrm_connectors.queries import claims as claims_sql
from nexuscrm_connectors.queries import events as events_sql
from nexuscrm_connectors.queries import packs as packs_sql
from nexuscrm_connectors.queries import receipts as receipts_sql
from nexuscrm_connectors.queries import work_items as work_items_sql
from nexuscrm_connectors.queries.rows import ReceiptRow
from nexuscrm_connectors.queries.work_items import HeldWork, WorkRow
from nexuscrm_connectors.queue.admission import check_call_bytes, check_payload
from nexuscrm_connectors.queue.claims import lease_values
from nexuscrm_connectors.queue.deliveries import Delivery, event_rows, payload_hash, receipt_row
from nexuscrm_connectors.settings import Settings
from nexuscrm_runtime.clock import DATABASE_CLOCK, DatabaseClock
from nexuscrm_runtime.database import run_transaction
from nexuscrm_schema.tables import RECEIPT_KEY_LENGTH
from workqueue import EventStatus, ReceiptState, WorkStatus
from workqueue.errors import InvalidArgument
from workqueue.identity import validate_text
from workqueue.values import Claim, IngestItem, IngestResult, InputRow, Outcome, WorkItemRow

MAX_ATTEMPTS = 3
RETRY_SECONDS = 60  # seconds between a failed attempt and the next one
LEASE_SECONDS = 30  # seconds a claim is held without completion
INPUT_PAGE = 1000  # Events per inference read

# --- the runtime ----------------------------------------------------------------------------


def _terminal(status: WorkStatus, now: dt.datetime) -> dict[str, Any]:
    return {"Status": status, "ClaimableAt": None, "FinishedAt": now}


def _refuse_if_cut_over(connection: Connection, pack_install_id: str, action: str) -> None:
    protocol = packs_sql.protocol_get(connection, pack_install_id)
    if protocol is not None:
        raise LegacyRefused(
            f"pack {pack_install_id} has been cut over to projection protocol {protocol.protocol_version} "
            f"(LegacyMaxOrdinal {protocol.legacy_max_ordinal}); the legacy runtime refuses to {action}: "
            "rollback to old writers after cutover is unsupported",
            field="pack_install_id",
        )


class LegacyRuntime:
    """The old-protocol writer and worker over one database (see the module docstring)."""

    def __init__(
        self, engine: Engine, clock: DatabaseClock = DATABASE_CLOCK, *, settings: Settings | None = None
    ) -> None:
        self.engine = engine
        self.clock = clock
        # The byte limits of native Ingest and LoadInputs; the rest is not used.
        self.settings = settings or Settings()
        # Read at start only: an unset flag keeps the dual write (the safe side).
        payload_contract.refresh(engine)

    def record_work_item_handoff(self, pack_install_id: str) -> dt.datetime:
        """Switch a pack to WorkItem-only execution and record it (``PackInstall.WorkItemHandoffAt``).

        Idempotent: returns the first recorded time. Refused after the cutover.
        """

        def record(connection: Connection) -> dt.datetime:
            pack = packs_sql.pack_lock(connection, pack_install_id, self.clock)
            _refuse_if_cut_over(connection, pack.pack_install_id, "record a handoff")
            legacy_sql.legacy_handoff_set(connection, pack.pack_install_id, pack.now)
            recorded = legacy_sql.legacy_handoff_get(connection, pack.pack_install_id)
            if recorded is None:  # set in this transaction or before
                raise RuntimeError(f"the legacy handoff of {pack.pack_install_id} vanished inside its transaction")
            return recorded

        return run_transaction(self.engine, record, name="legacy handoff")

    def ingest(self, pack_install_id: str, items: Sequence[IngestItem]) -> list[IngestResult]:
        """Admit deliveries the old way, in one transaction; one result per item, in order.

        Fenced: new receipts are stored (``fenced``) for the native materializer. A receipt
        key with an Event is a duplicate and is acknowledged without looking further
        (``duplicate_legacy``); with a different payload it is ``rejected``. Raises
        ``UnknownPack``, ``LegacyRefused`` and ``InvalidArgument`` (malformed item, a payload
        above ``max_payload_bytes``, or more payload than ``max_transaction_bytes``: native
        Ingest's limits), for the whole call before anything is written.
        """
        check_call_bytes(self.settings, items)
        deliveries = [self._validate(self.settings, pack_install_id, item) for item in items]
        return run_transaction(
            self.engine, lambda connection: self._admit(connection, pack_install_id, deliveries), name="legacy ingest"
        )

    @staticmethod
    def _validate(settings: Settings, pack_install_id: str, item: IngestItem) -> Delivery:
        validate_text("receipt_key", item.receipt_key, RECEIPT_KEY_LENGTH)
        check_payload(settings, item)
        return Delivery(
            item=item,
            projection_key=item.route.identity(pack_install_id).key,
            payload_hash=payload_hash(item.payload),
        )

    def _admit(self, connection: Connection, pack_install_id: str, deliveries: list[Delivery]) -> list[IngestResult]:
        pack = packs_sql.pack_lock(connection, pack_install_id, self.clock)
        now = pack.now
        _refuse_if_cut_over(connection, pack.pack_install_id, "admit")
        fenced = packs_sql.fence_active(connection, pack, now)
        work_item_only = legacy_sql.legacy_handoff_get(connection, pack.pack_install_id) is not None
        keys = [d.item.receipt_key for d in deliveries]
        if len(set(keys)) != len(keys):
            raise InvalidArgument("a legacy batch may not repeat a receipt key", field="items")
        stored = receipts_sql.receipts_get(connection, pack.pack_install_id, keys)
        events = events_sql.events_by_receipt(connection, pack.pack_install_id, keys)
        results: dict[str, IngestResult] = {}
        fresh: list[Delivery] = []
        new_receipts: list[ReceiptRow] = []
        for delivery in deliveries:
            key = delivery.item.receipt_key
            receipt = stored.get(key)
            if receipt is not None and receipt.PayloadHash != delivery.payload_hash:
                results[key] = IngestResult(receipt_key=key, outcome=Outcome.REJECTED, message="payload differs")
            elif key in events:
                results[key] = IngestResult(
                    receipt_key=key, outcome=Outcome.DUPLICATE_LEGACY, enqueue_ordinal=events[key].EnqueueOrdinal
                )
            else:
                if receipt is None:
                    new_receipts.append(receipt_row(pack.pack_install_id, delivery, now, state=ReceiptState.STORED))
                if fenced:
                    results[key] = IngestResult(receipt_key=key, outcome=Outcome.FENCED, message="stored; fenced")
                else:
                    fresh.append(delivery)
        receipts_sql.receipts_insert(connection, new_receipts)
        ordinals = packs_sql.ordinals_allocate(connection, pack, len(fresh)) if fresh else range(0)
        packs_sql.allocated_events_insert(
            connection, pack.pack_install_id, event_rows(pack.pack_install_id, ordinals, fresh, now)
        )
        for ordinal, delivery in zip(ordinals, fresh, strict=True):
            work_id = (
                self._direct_task(connection, pack.pack_install_id, delivery, ordinal, now) if work_item_only else None
            )
            results[delivery.item.receipt_key] = IngestResult(
                receipt_key=delivery.item.receipt_key,
                outcome=Outcome.ADMITTED,
                enqueue_ordinal=ordinal,
                work_id=work_id,
            )
        acknowledged = [k for k, r in results.items() if r.outcome in (Outcome.ADMITTED, Outcome.DUPLICATE_LEGACY)]
        receipts_sql.receipts_set_state(connection, pack.pack_install_id, acknowledged, ReceiptState.CONFIRMED, now)
        return [results[key] for key in keys]

    @staticmethod
    def _direct_task(
        connection: Connection, pack_install_id: str, delivery: Delivery, ordinal: int, now: dt.datetime
    ) -> str | None:
        """Give the Event its direct task, or coalesce it (None) into the identity's unclaimed one."""
        if legacy_sql.legacy_work_unclaimed(connection, pack_install_id, delivery.projection_key) is not None:
            return None  # coalesced: a later task infers it
        blocked = legacy_sql.legacy_work_live(connection, pack_install_id, delivery.projection_key, None)
        work_id = str(uuid.uuid4())
        work_items_sql.work_items_insert(
            connection,
            [
                {
                    "WorkId": work_id,
                    "PackInstallId": pack_install_id,
                    "ProjectionKey": delivery.projection_key,
                    "WorkType": delivery.item.route.work_type,
                    "InputStartOrdinal": None,
                    "LaneOrdinal": ordinal,
                    "ReplayOfWorkId": None,
                    "Status": WorkStatus.BLOCKED if blocked else WorkStatus.PENDING,
                    "Attempt": 0,
                    "MaxAttempts": MAX_ATTEMPTS,
                    "ClaimableAt": None if blocked else now,
                    "CreatedAt": now,
                }
            ],
        )
        return work_id

    def claim(self, worker_id: str, pack_install_id: str, *, lease_seconds: int = LEASE_SECONDS) -> Claim | None:
        """Lease the oldest claimable old-protocol WorkItem of a pack, or None.

        Claimable: pending, a retry whose time has come, or processing whose lease expired
        (a failed attempt; failed for good when attempts run out). The selected Event moves
        to processing. Raises ``LegacyRefused`` for a cut-over pack.
        """
        validate_text("worker_id", worker_id, 128)
        with self.engine.connect() as connection:
            _refuse_if_cut_over(connection, pack_install_id, "claim")
            candidates = legacy_sql.legacy_work_claimable(connection, pack_install_id, self.clock.now(), 10)
        for candidate in candidates:
            claimed = run_transaction(
                self.engine,
                functools.partial(
                    self._claim_one, candidate=candidate, worker_id=worker_id, lease_seconds=lease_seconds
                ),
                name="legacy claim",
            )
            if claimed is not None:
                return claimed
        return None

    def _claim_one(
        self, connection: Connection, *, candidate: DbRow, worker_id: str, lease_seconds: int
    ) -> Claim | None:
        row = work_items_sql.work_item_held(connection, candidate.WorkId, self.clock, lock=True)
        if row is None:
            return None
        now = row.Now
        _refuse_if_cut_over(connection, row.PackInstallId, "claim")
        expect = {"Status": candidate.Status, "LeaseToken": candidate.LeaseToken, "ClaimableAt": candidate.ClaimableAt}
        attempt = row.Attempt + (1 if candidate.Status == WorkStatus.PROCESSING else 0)
        if attempt >= row.MaxAttempts:
            values = {
                **_terminal(WorkStatus.FAILED, now),
                "Attempt": attempt,
                "LastError": "lease expired on the last attempt",
            }
            if claims_sql.work_item_update_if(connection, row.WorkId, expect, values) == 1:
                self._settle(connection, row, EventStatus.FAILED, now)
            return None
        token, values = lease_values(worker_id, attempt, now, dt.timedelta(seconds=lease_seconds))
        if claims_sql.work_item_update_if(connection, row.WorkId, expect, values) != 1:
            return None
        events_sql.event_set_status(
            connection, row.PackInstallId, row.LaneOrdinal, EventStatus.PROCESSING, row.ProjectionKey
        )
        return Claim(work=self._reread(connection, row.WorkId), lease_token=token)

    def load_inputs(self, work_id: str, lease_token: str) -> list[InputRow]:
        """Infer a held WorkItem's inputs the old way, in ordinal order.

        The Events of its identity above the previous retained old-protocol WorkItem's
        LaneOrdinal, up to its own: membership comes from retained history, which is
        exactly what the native protocol no longer trusts.
        """
        with self.engine.connect() as connection:
            row = self._held(connection, work_id, lease_token)
            after = legacy_sql.legacy_work_previous_lane(
                connection, row.PackInstallId, row.ProjectionKey, row.LaneOrdinal
            )
            after = -1 if after is None else after  # old history may hold ordinal 0
            inputs: list[InputRow] = []
            while page := events_sql.event_range_page(
                connection,
                row.PackInstallId,
                row.ProjectionKey,
                after,
                row.LaneOrdinal,
                INPUT_PAGE,
                self.settings.max_page_bytes,
            ):
                inputs.extend(events_sql.input_value(e) for e in page)
                after = int(page[-1].EnqueueOrdinal)
            return inputs

    def complete(self, work_id: str, lease_token: str) -> WorkItemRow:
        """Finish a held WorkItem: it and its selected Event settle; a blocked successor becomes pending."""
        return self._transition(work_id, lease_token, lambda _row, now: _terminal(WorkStatus.COMPLETED, now))

    def fail(self, work_id: str, lease_token: str, error: str, *, retryable: bool = True) -> WorkItemRow:
        """Record a failed attempt: retry after ``RETRY_SECONDS`` or, attempts exhausted, failed."""

        def decide(row: HeldWork, now: dt.datetime) -> dict[str, Any]:
            attempt = row.Attempt + 1
            values: dict[str, Any] = {"Attempt": attempt, "LastError": error[:4000]}
            if retryable and attempt < row.MaxAttempts:
                return {**values, "Status": WorkStatus.RETRY, "ClaimableAt": now + dt.timedelta(seconds=RETRY_SECONDS)}
            return {**values, **_terminal(WorkStatus.FAILED, now)}

        return self._transition(work_id, lease_token, decide)

    def wait_for_dependency(self, work_id: str, lease_token: str, dependency: str) -> WorkItemRow:
        """Park a held WorkItem as blocked until ``resolve_dependency``: an external dependency wait."""
        values = {
            "Status": WorkStatus.BLOCKED,
            "ClaimableAt": None,
            "LastError": f"waiting for dependency {dependency}",
        }
        return self._transition(work_id, lease_token, lambda _row, _now: values)

    def resolve_dependency(self, work_id: str) -> WorkItemRow:
        """The dependency resolver: make a dependency-blocked WorkItem pending again.

        Refuses work that is not blocked, or is blocked behind a live predecessor (that wait
        ends when the predecessor finishes). Raises ``WorkNotFound``, ``LegacyRefused``.
        """

        def resolve(connection: Connection) -> WorkItemRow:
            row = work_items_sql.work_item_get(connection, work_id, lock=True)
            if row is None:
                raise WorkNotFound(f"work {work_id} does not exist", field="work_id")
            _refuse_if_cut_over(connection, row.PackInstallId, "resolve a dependency")
            if row.Status != WorkStatus.BLOCKED or legacy_sql.legacy_work_live(
                connection, row.PackInstallId, row.ProjectionKey, row.LaneOrdinal
            ):
                raise LeaseLost(f"work {work_id} is not waiting for a dependency ({row.Status})", field="work_id")
            if work_items_sql.work_item_unblock(connection, work_id, self.clock.now()) != 1:
                raise LeaseLost(f"work {work_id} changed concurrently", field="work_id")
            return self._reread(connection, work_id)

        return run_transaction(self.engine, resolve, name="legacy resolve dependency")

    # --- helpers -------------------------------------------------------------------------

    def _held(self, connection: Connection, work_id: str, lease_token: str) -> HeldWork:
        row = work_items_sql.work_item_held(connection, work_id, self.clock)
        if row is None:
            raise WorkNotFound(f"work {work_id} does not exist", field="work_id")
        if row.Status != WorkStatus.PROCESSING or row.LeaseToken != lease_token:
            raise LeaseLost(f"lease of work {work_id} is not held by this token ({row.Status})", field="lease_token")
        return row

    def _transition(
        self, work_id: str, lease_token: str, decide: Callable[[HeldWork, dt.datetime], dict[str, Any]]
    ) -> WorkItemRow:
        """Move a held WorkItem out of processing to the values ``decide`` returns, releasing the lease."""

        def move(connection: Connection) -> WorkItemRow:
            row = self._held(connection, work_id, lease_token)
            now = row.Now
            _refuse_if_cut_over(connection, row.PackInstallId, "finish work")
            values = decide(row, now)
            expect = {"Status": WorkStatus.PROCESSING, "LeaseToken": lease_token}
            released = {"LeaseToken": None, "LeaseExpiresAt": None, **values}
            if claims_sql.work_item_update_if(connection, work_id, expect, released) != 1:
                raise LeaseLost(f"lease of work {work_id} changed concurrently", field="lease_token")
            if values["Status"] == WorkStatus.COMPLETED:
                self._settle(connection, row, EventStatus.PROCESSED, now)
            elif values["Status"] == WorkStatus.FAILED:
                self._settle(connection, row, EventStatus.FAILED, now)
            return self._reread(connection, work_id)

        return run_transaction(self.engine, move, name="legacy transition")

    @staticmethod
    def _settle(connection: Connection, row: WorkRow, event_status: EventStatus, now: dt.datetime) -> None:
        """A WorkItem became terminal: settle its selected Event, release the next blocked one."""
        events_sql.event_set_status(connection, row.PackInstallId, row.LaneOrdinal, event_status, row.ProjectionKey)
        successor = work_items_sql.work_item_successor(
            connection, row.PackInstallId, row.ProjectionKey, row.LaneOrdinal
        )
        if successor is not None and successor.Status == WorkStatus.BLOCKED:
            work_items_sql.work_item_unblock(connection, successor.WorkId, now)

    @staticmethod
    def _reread(connection: Connection, work_id: str) -> WorkItemRow:
        row = work_items_sql.work_item_get(connection, work_id)
        if row is None:  # changed in this transaction
            raise RuntimeError(f"work {work_id} vanished inside the transaction that changed it")
        return work_items_sql.work_item_value(row)
