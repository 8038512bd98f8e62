"""Admission: a batch of deliveries of one pack becomes receipts, Events and generations in one transaction.

One transaction per batch (concurrent calls grouped, ``grouping``), a constant number of
statements whatever its size, every receipt written with its verdict; a retried delivery
after a crash takes the duplicate path (decisions 003 and 085; the newest-generation memory:
070).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import logging
import threading
import uuid
from collections.abc import Iterable, Mapping, Sequence

from sqlalchemy.engine import Connection, Engine

from nexuscrm_connectors import metrics
from nexuscrm_connectors.errors import LimitExceeded, ProtocolMissing
from nexuscrm_connectors.queries import events as events_sql
from nexuscrm_connectors.queries import flow_versions as flow_versions_sql
from nexuscrm_connectors.queries import packs as packs_sql
from nexuscrm_connectors.queries import receipts as receipts_sql
from nexuscrm_connectors.queries import work_items as work_items_sql
from nexuscrm_connectors.queries.events import AdmittedInput
from nexuscrm_connectors.queries.receipts import StoredReceipt
from nexuscrm_connectors.queries.rows import GenerationRow, ReceiptRow
from nexuscrm_connectors.queries.work_items import NewestGeneration
from nexuscrm_connectors.queue import tracks as version_tracks
from nexuscrm_connectors.queue.deliveries import (
    Delivery,
    RefusedItem,
    event_rows,
    first_of_each_key,
    generation_row,
    payload_hash,
    receipt_row,
    result_of,
)
from nexuscrm_connectors.queue.duplicates import verify_duplicates
from nexuscrm_connectors.queue.grouping import GroupCommit
from nexuscrm_connectors.queue.tracks import Target, track_row
from nexuscrm_connectors.settings import Settings
from nexuscrm_runtime import sqlite_writer
from nexuscrm_runtime.clock import DatabaseClock, iso_utc
from nexuscrm_runtime.database import follow_up, run_transaction
from nexuscrm_schema.tables import RECEIPT_KEY_LENGTH
from nexuscrm_wire.timestamps import naive_utc
from workqueue import ReceiptState, WorkStatus
from workqueue.errors import DomainError, InvalidArgument
from workqueue.identity import FIELD_MAX_LENGTHS, validate_text
from workqueue.statuses import TERMINAL_WORK_STATUSES
from workqueue.values import (
    ACKNOWLEDGED_OUTCOMES,
    IngestItem,
    IngestResult,
    Outcome,
    Route,
)

log = logging.getLogger(__name__)

IDENTITY_CACHE_SIZE = 65_536  # distinct (pack, route) pairs whose projection key is remembered
NEWEST_CACHE_SIZE = 65_536  # identities whose newest generation one engine's admissions remember


def check_call_bytes(settings: Settings, items: Sequence[IngestItem]) -> None:
    """Refuse a call whose payloads add up to more than one admission transaction may write.

    A call is always admitted in one transaction, so it is refused whole (``InvalidArgument``
    on ``items``), before anything is written. Native and legacy Ingest both call it.
    """
    payload_bytes = sum(len(item.payload) for item in items)
    if payload_bytes > settings.max_transaction_bytes:
        raise InvalidArgument(
            f"items carry {payload_bytes} payload bytes; the limit per call is {settings.max_transaction_bytes} "
            "(max_transaction_bytes: one admission transaction); send fewer items per call",
            field="items",
        )


def check_payload(settings: Settings, item: IngestItem) -> None:
    """Refuse a payload above ``max_payload_bytes`` (``InvalidArgument`` on ``payload``, naming the limit)."""
    if len(item.payload) > settings.max_payload_bytes:
        raise InvalidArgument(
            f"payload is {len(item.payload)} bytes; the limit is {settings.max_payload_bytes} (max_payload_bytes)",
            field="payload",
        )


def _validate(settings: Settings, pack_install_id: str, item: IngestItem) -> Delivery:
    validate_text("receipt_key", item.receipt_key, RECEIPT_KEY_LENGTH)
    projection_key = _projection_key(pack_install_id, item.route)
    check_payload(settings, item)
    return Delivery(item=item, projection_key=projection_key, payload_hash=payload_hash(item.payload))


@functools.lru_cache(maxsize=IDENTITY_CACHE_SIZE)
def _projection_key(pack_install_id: str, route: Route) -> str:
    """The validated projection key of ``route`` in a pack.

    A pure function of its arguments, memoized (bounded): sources deliver to the same lanes
    over and over, and validating every field character by character dominated admission's
    CPU time. Invalid routes raise and are never cached.
    """
    return route.identity(pack_install_id).key


class NewestMemory:
    """The newest generation of the identities this process admitted to, per pack (never its status).

    Only admission and replay create generations, and both allocate ordinals under the pack
    lock. So while a pack's LastOrdinal, read under that lock, is still the one this process's
    last admission left, every identity recorded then still has the same newest generation,
    and admission locks it by primary key instead of seeking it (the seeks were the largest
    statement of a batch). Any other writer moves LastOrdinal, and the next admission seeks
    every identity again. Only committed admissions are recorded.
    """

    def __init__(self, limit: int = NEWEST_CACHE_SIZE) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._packs: dict[str, tuple[int, dict[str, str]]] = {}  # pack -> (LastOrdinal, identity -> WorkId)

    def known(self, pack_install_id: str, last_ordinal: int, projection_keys: Iterable[str]) -> dict[str, str]:
        """The recorded newest WorkIds of ``projection_keys``, if the pack's LastOrdinal is still ``last_ordinal``."""
        with self._lock:
            recorded_at, work_ids = self._packs.get(pack_install_id, (-1, {}))
            if recorded_at != last_ordinal:
                return {}
            return {key: work_ids[key] for key in projection_keys if key in work_ids}

    def record(self, pack_install_id: str, before: int, after: int, work_ids: Mapping[str, str]) -> None:
        """Record a committed admission that moved LastOrdinal from ``before`` to ``after``.

        ``work_ids`` holds the newest generation of each identity of the batch. What was
        recorded at ``before`` stays true for the other identities; an older record is
        replaced, a newer one (a later admission recorded first) is kept.
        """
        with self._lock:
            recorded_at, known = self._packs.get(pack_install_id, (-1, {}))
            if recorded_at == before:
                merged = {**known, **work_ids}
            elif recorded_at < after:
                merged = dict(work_ids)
            else:
                return
            self._packs[pack_install_id] = (after, merged)
            if sum(len(ids) for _, ids in self._packs.values()) > self._limit:
                self._packs = {pack_install_id: (after, dict(work_ids))}  # forgetting only costs seeks


@dataclasses.dataclass(frozen=True)
class _Admitted:
    """What one admission transaction decided, and the newest generations it left (for ``NewestMemory``)."""

    results: dict[str, IngestResult]
    ordinals: range = range(0)  # allocated to fresh inputs
    newest: dict[str, str] = dataclasses.field(default_factory=dict)  # identity -> WorkId


class Admission:
    """One service's admission: its group commit and the newest generations it remembers.

    Both live as long as the ``Connectors`` that owns this object; two services on one
    database stay correct apart (the pack lock orders them, and either one's admission
    moves the LastOrdinal the other's ``NewestMemory`` checks).
    """

    def __init__(self, engine: Engine, settings: Settings, clock: DatabaseClock) -> None:
        self.engine = engine
        self.settings = settings
        self.clock = clock
        self.newest = NewestMemory()
        self.groups: GroupCommit[Delivery, IngestResult] = GroupCommit(
            self._admit_group, lambda delivery: len(delivery.item.payload), committed=metrics.ADMISSION_CALLS.inc
        )

    def ingest(self, pack_install_id: str, items: Sequence[IngestItem | RefusedItem]) -> list[IngestResult]:
        """Store and admit a batch of deliveries of one pack; one result per item, in order.

        Raises ``UnknownPack``, ``LimitExceeded`` (too many items), ``InvalidArgument`` (more
        payload bytes than one transaction may write, ``max_transaction_bytes``) and
        ``ProtocolMissing`` (an unfenced pack without a protocol row) for the whole batch,
        before writing anything. Concurrent calls of one pack share admission transactions
        (``grouping``); a receipt key repeated in the batch (or in a concurrent one) is
        admitted once.
        """
        settings = self.settings
        validate_text("pack_install_id", pack_install_id, FIELD_MAX_LENGTHS["pack_install_id"])
        if len(items) > settings.max_batch_items:
            raise LimitExceeded(
                f"items has {len(items)} deliveries; the limit is {settings.max_batch_items}", field="items"
            )
        check_call_bytes(settings, [item for item in items if isinstance(item, IngestItem)])
        results: dict[int, IngestResult] = {}
        validated: dict[int, Delivery] = {}
        for index, item in enumerate(items):
            if isinstance(item, RefusedItem):
                results[index] = IngestResult(
                    receipt_key=item.receipt_key, outcome=Outcome.REJECTED, message=item.message
                )
                continue
            try:
                validated[index] = _validate(settings, pack_install_id, item)
            except DomainError as error:
                results[index] = IngestResult(
                    receipt_key=item.receipt_key, outcome=Outcome.REJECTED, message=str(error)
                )
        first = first_of_each_key(validated.values())
        with sqlite_writer.urgent():  # a client waits on this transaction; the workers' can wait
            grouped = self.groups.submit(
                pack_install_id,
                list(first.values()),
                max_items=settings.admission_group_items,
                max_weight=settings.max_transaction_bytes,
            )
        admitted = {result.receipt_key: result for result in grouped}
        for index, delivery in validated.items():
            results[index] = result_of(first, delivery, admitted)
        return [results[index] for index in range(len(items))]

    def _admit_group(self, pack_install_id: str, deliveries: Sequence[Delivery]) -> list[IngestResult]:
        """One group's deliveries admitted in one ``admit_batch``: a result per delivery, in order."""
        first = first_of_each_key(deliveries)
        admitted = self.admit_batch(pack_install_id, list(first.values()))
        metrics.ADMISSION_TRANSACTIONS.observe(len(first))
        return [result_of(first, delivery, admitted) for delivery in deliveries]

    def admit_batch(self, pack_install_id: str, deliveries: Sequence[Delivery]) -> dict[str, IngestResult]:
        """Run one batch's admission transaction (receipts written with their verdicts); results by key.

        ``deliveries`` have unique receipt keys: the ingest of a group, or the materializer's
        stored receipts of one pack.
        """
        newest = self.newest
        admitted = run_transaction(
            self.engine,
            lambda connection: _batch_transaction(
                connection, self.settings, self.clock, newest, pack_install_id, deliveries
            ),
            name="admission",
            unique_keys_conflict=True,  # a twin committed through another primary: run again, answer duplicate
        )
        if admitted.ordinals:  # committed: a failure here only costs the next admission its seeks
            ordinals = admitted.ordinals
            follow_up(
                "admission", lambda: newest.record(pack_install_id, ordinals[0] - 1, ordinals[-1], admitted.newest)
            )
        return admitted.results


def _batch_transaction(
    connection: Connection,
    settings: Settings,
    clock: DatabaseClock,
    newest: NewestMemory,
    pack_install_id: str,
    deliveries: Sequence[Delivery],
) -> _Admitted:
    """The admission transaction of one batch: lock the pack, check fences and the protocol, decide, write.

    The PackInstall row lock serializes admission and replay of the pack. Duplicates are
    verified in one statement whatever their number; new inputs get ordinals in arrival
    order, their Events, and each identity's newest generation extended or succeeded
    (``_new_generations``); every receipt is written with its verdict (``_record_receipts``).
    """
    pack = packs_sql.pack_lock(connection, pack_install_id, clock)
    now = pack.now  # the database's time: every instant this admission stores or decides with
    guard = packs_sql.admission_guard(connection, pack)
    fenced, protocol = guard.fenced, guard.protocol
    if protocol is None and not fenced:
        raise ProtocolMissing(
            f"pack {pack_install_id} has no projection protocol row: activate it (greenfield) or run "
            "the cutover before native admission",
            field="pack_install_id",
        )
    results: dict[str, IngestResult] = {}
    tracks = flow_versions_sql.tracks_of(connection, pack_install_id) if guard.has_versions else []
    stored = receipts_sql.receipts_get(connection, pack_install_id, [d.item.receipt_key for d in deliveries])
    accepted: list[Delivery] = []
    for delivery in deliveries:
        receipt = stored.get(delivery.item.receipt_key)
        if receipt is not None and _differs(receipt, delivery):
            results[delivery.item.receipt_key] = _rejected(delivery)
        else:
            accepted.append(delivery)
    if protocol is not None:  # else fenced, and not yet cut over: store only
        events = events_sql.events_by_receipt(connection, pack_install_id, [d.item.receipt_key for d in accepted])
        # A pruned input's receipt is gone: its tombstone holds the payload hash and route instead.
        for delivery in accepted:
            event = events.get(delivery.item.receipt_key)
            if event is not None and event.PrunedAt is not None and _differs(event, delivery):
                results[delivery.item.receipt_key] = _rejected(delivery)
                del events[delivery.item.receipt_key]
        results.update(verify_duplicates(connection, protocol, events, tracks))
        results.update(_outside_window(protocol, [d for d in accepted if d.item.receipt_key not in results], stored))
    fresh: list[Delivery] = []
    for delivery in accepted:
        if delivery.item.receipt_key in results:
            continue  # a duplicate, verified
        if tracks and (refused := version_tracks.refusal(tracks, delivery.projection_key)):
            results[delivery.item.receipt_key] = IngestResult(
                receipt_key=delivery.item.receipt_key, outcome=Outcome.REJECTED, message=refused
            )
        elif fenced:
            results[delivery.item.receipt_key] = _fenced(delivery)
        else:
            fresh.append(delivery)
    admitted = _new_generations(connection, settings, newest, pack, fresh, now, tracks) if fresh else _Admitted({})
    results.update(admitted.results)
    _record_receipts(connection, pack_install_id, accepted, stored, results, admitted.ordinals, now)
    return dataclasses.replace(admitted, results=results)


def _differs(recorded: StoredReceipt | AdmittedInput, delivery: Delivery) -> bool:
    # A tombstone whose generation record expired first has no route: its payload still decides.
    route_differs = recorded.ProjectionKey is not None and recorded.ProjectionKey != delivery.projection_key
    return bool(recorded.PayloadHash != delivery.payload_hash or route_differs)


def _outside_window(
    protocol: packs_sql.Protocol, unknown: Sequence[Delivery], stored: Mapping[str, StoredReceipt]
) -> dict[str, IngestResult]:
    """The verdicts of the duplicate window on deliveries of keys with no Event and no tombstone.

    A pack with a window needs every delivery's SourceTime (rejected without one). One at or
    below the horizon may repeat an input whose tombstone expired: it is acknowledged as
    expired and never admitted. A key already stored as a receipt (fenced) was
    received inside the window and is admitted whatever its SourceTime.
    """
    window, horizon = protocol.duplicate_window_seconds, protocol.horizon_source_time
    results: dict[str, IngestResult] = {}
    if window is None and horizon is None:
        return results
    for delivery in unknown:
        key, source_time = delivery.item.receipt_key, delivery.item.source_time
        if key in stored:
            continue
        if source_time is None:
            if window is not None:
                results[key] = IngestResult(
                    receipt_key=key,
                    outcome=Outcome.REJECTED,
                    message=f"source_time is required: pack {protocol.pack_install_id} has a duplicate window of "
                    f"{window} s, and a delivery's source_time decides whether it falls inside it",
                )
        elif horizon is not None and naive_utc(source_time) <= horizon:
            results[key] = IngestResult(
                receipt_key=key,
                outcome=Outcome.EXPIRED,
                message=f"source_time {iso_utc(source_time)} is at or below the pack's duplicate-window horizon "
                f"{iso_utc(horizon)}: the input may repeat one whose tombstone expired, so it is acknowledged "
                "as expired and no work is created",
            )
    return results


def _rejected(delivery: Delivery) -> IngestResult:
    return IngestResult(
        receipt_key=delivery.item.receipt_key,
        outcome=Outcome.REJECTED,
        message="receipt_key is already stored with a different payload or route; receipts are immutable",
    )


def _record_receipts(
    connection: Connection,
    pack_install_id: str,
    accepted: Sequence[Delivery],
    stored: Mapping[str, StoredReceipt],
    results: Mapping[str, IngestResult],
    admitted: range,
    now: dt.datetime,
) -> None:
    """Write each accepted delivery's receipt with its verdict, in the admission transaction.

    New receipts are inserted already confirmed (or coverage_missing) when their input has an
    Event, and stored with their payload only when admission must wait (fenced). The receipts
    of the inputs admitted now (ordinals ``admitted``) are copied from their Events by the
    database (``receipts_insert_admitted``): sending them again would double the values a
    batch escapes and transfers. Receipts stored earlier (a fence, or a crash before an older
    release confirmed them) move to their verdict. A crash before the commit loses nothing
    acknowledged; after it, a retried delivery finds the Event and takes the duplicate path.
    """
    new_rows: list[ReceiptRow] = []
    verdicts: dict[ReceiptState, list[str]] = {state: [] for state in receipts_sql.RECEIPT_VERDICT_FROM}
    for delivery in accepted:
        key = delivery.item.receipt_key
        outcome = results[key].outcome
        state = _receipt_state(outcome)
        if key not in stored:
            # An admitted input's receipt is copied from its Event below; a pruned one's tombstone is its
            # record; an expired one leaves none (the window's horizon answers every redelivery alike).
            if outcome not in (Outcome.ADMITTED, Outcome.DUPLICATE_PRUNED, Outcome.EXPIRED, Outcome.REJECTED):
                new_rows.append(receipt_row(pack_install_id, delivery, now, state=state))
        elif state in verdicts and stored[key].State in receipts_sql.RECEIPT_VERDICT_FROM[state]:
            verdicts[state].append(key)
    receipts_sql.receipts_insert(connection, new_rows)
    if admitted:
        receipts_sql.receipts_insert_admitted(connection, pack_install_id, admitted, now)
    for state, keys in verdicts.items():
        receipts_sql.receipts_set_state(connection, pack_install_id, keys, state, now)


def _receipt_state(outcome: Outcome) -> ReceiptState:
    if outcome in ACKNOWLEDGED_OUTCOMES:
        return ReceiptState.CONFIRMED
    if outcome is Outcome.COVERAGE_MISSING:
        return ReceiptState.COVERAGE_MISSING
    return ReceiptState.STORED  # fenced: admitted later, by the materializer


def _fenced(delivery: Delivery) -> IngestResult:
    return IngestResult(
        receipt_key=delivery.item.receipt_key,
        outcome=Outcome.FENCED,
        message="stored durably; an admission fence holds this pack, admission follows when it is lifted",
    )


def _new_generations(
    connection: Connection,
    settings: Settings,
    newest_known: NewestMemory,
    pack: packs_sql.LockedPack,
    fresh: Sequence[Delivery],
    now: dt.datetime,
    tracks: Sequence[flow_versions_sql.Track] = (),
) -> _Admitted:
    """Allocate ordinals in arrival order, insert Events, and cover every new input once per track.

    Every identity of the batch gets exactly one generation covering its new inputs
    (invariant M): its newest one extended, or a successor; with Flow versions, one in each
    track that receives inputs (``tracks``).
    """
    ordinals = packs_sql.ordinals_allocate(connection, pack, len(fresh))
    packs_sql.allocated_events_insert(
        connection, pack.pack_install_id, event_rows(pack.pack_install_id, ordinals, fresh, now)
    )
    by_identity: dict[str, list[tuple[int, Delivery]]] = {}  # generation key -> its new members
    versioned: dict[str, Target] = {}  # the generation keys of versions' tracks
    answered: dict[str, str] = {}  # inputs' key -> the generation key their result names (the live track's)
    for ordinal, delivery in zip(ordinals, fresh, strict=True):
        own = delivery.projection_key
        joined = version_tracks.targets(tracks, own) if tracks else None
        if joined is None:
            by_identity.setdefault(own, []).append((ordinal, delivery))
            continue
        for target in joined:
            by_identity.setdefault(target.key, []).append((ordinal, delivery))
            versioned[target.key] = target
            if target.live or own not in answered:
                answered[own] = target.key
    # A work type with versions is never remembered (``NewestMemory``): a build's or rollback's
    # catch-up creates generations without moving LastOrdinal. No Event carries a version's key,
    # so its tails are sought by key.
    plain = [key for key in by_identity if key not in versioned]
    known = newest_known.known(pack.pack_install_id, pack.last_ordinal, plain)
    newest = work_items_sql.work_items_newest(connection, pack.pack_install_id, ordinals, plain, known)
    if versioned:
        newest.update(work_items_sql.work_items_tail(connection, pack.pack_install_id, versioned))
    run_first = [key for key, row in newest.items() if row.RunsBeforeWorkId]
    # Behind a replay run first: a new generation, linked behind the identity's tail.
    tails = work_items_sql.work_items_tail(connection, pack.pack_install_id, run_first) if run_first else {}
    new_generations: list[GenerationRow] = []
    extended: dict[str, tuple[int, int]] = {}  # WorkId -> (new LaneOrdinal, members added)
    linked: dict[str, str] = {}  # nonterminal predecessor WorkId -> the blocked successor behind it
    work_ids: dict[str, str] = {}
    starts: set[int] = set()  # first ordinals of the generations this batch creates
    for projection_key, members in by_identity.items():
        low, high = members[0][0], members[-1][0]  # arrival order = ordinal order
        track_target = versioned.get(projection_key)
        build_run = track_target is not None and track_target.build_run
        current = newest.get(projection_key)
        if current is not None and _extendable(current) and bool(current.BuildRun) == build_run:
            extended[current.WorkId] = (high, len(members))
            work_ids[projection_key] = current.WorkId
            continue
        if current is not None and current.RunsBeforeWorkId:
            current = tails.get(projection_key)
        work_id = str(uuid.uuid4())
        work_ids[projection_key] = work_id
        starts.add(low)
        blocked = current is not None and WorkStatus(current.Status) not in TERMINAL_WORK_STATUSES
        if current is not None and blocked:
            linked[current.WorkId] = work_id
        row = generation_row(
            work_id=work_id,
            pack_install_id=pack.pack_install_id,
            projection_key=projection_key,
            start=low,
            end=high,
            members=len(members),
            blocked=blocked,
            now=now,
            max_attempts=settings.max_attempts,
        )
        new_generations.append(track_row(row, track_target) if track_target is not None else row)
    changed = work_items_sql.work_items_extend(connection, pack.pack_install_id, extended, ordinals[0], ordinals[-1])
    if changed != len(extended):
        raise RuntimeError("a generation of this batch changed under its row lock")
    work_items_sql.work_items_insert(connection, new_generations)
    # The blocking decision writes the row it was taken from (decision 106).
    if work_items_sql.work_items_link_successors(connection, linked) != len(linked):
        raise RuntimeError("a predecessor of this batch changed under its row lock")
    results = {
        delivery.item.receipt_key: IngestResult(
            receipt_key=delivery.item.receipt_key,
            outcome=Outcome.ADMITTED,
            enqueue_ordinal=ordinal,
            work_id=work_ids[answered.get(delivery.projection_key, delivery.projection_key)],
            starts_generation=ordinal in starts,
        )
        for ordinal, delivery in zip(ordinals, fresh, strict=True)
        if delivery.projection_key in answered or delivery.projection_key in work_ids
    }
    return _Admitted(results, ordinals, {key: work_ids[key] for key in plain})


def _extendable(row: NewestGeneration) -> bool:
    """Only an unclaimed attempt-zero generation may raise its upper bound (invariant B), never a replay run first."""
    return WorkStatus(row.Status) in work_items_sql.UNCLAIMED_STATUSES and row.Attempt == 0 and not row.RunsBeforeWorkId
