"""The invariants of docs/design.md checked over a whole database.

M membership, O ordinals, B bounds, D duplicates, X execution, P payload, and R the retention
horizon (decision 125): M and D hold over what is retained, and what retention pruned left
only its records, all at or below the pack's horizon, never reused; with a duplicate window
(decision 127) a tombstone may outlive its generation's record, and ``window_violations``
checks, against what a test delivered, that every input whose records expired lies at or below
the pack's HorizonSourceTime. P also covers where a payload is stored (decision 126): an Event
with PayloadBytes has exactly one EventPayload row of that length, one without (admitted before
schema v8 copied it) has none, and no EventPayload row lacks its Event. The checker reads
every row, so it is for tests, demos and operator audits of small databases, never a hot
path; it returns violations prefixed with the invariant's letter. Every scenario test ends
with it (tests/support/invariants.py), and `make run` prints its verdict. It lives in the schema
library because it reads only canonical tables: every owner's tests use it without the operator
tools (docs/decisions/146-test-layout-by-owner.md).
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import datetime as dt
import itertools
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Row

from nexuscrm_runtime.database import is_sqlite
from nexuscrm_schema.member_counts import admitted_count
from nexuscrm_schema.tables import (
    ConnectorProjectionProtocol,
    Event,
    EventPayload,
    FlowVersionTrack,
    IngressReceipt,
    PackInstall,
    PrunedReceipt,
    PrunedWork,
    RetentionPolicy,
    SkippedWork,
    WorkAttempt,
    WorkItem,
)
from workqueue import ReceiptState, WorkStatus, decode_projection_key
from workqueue.identity import with_companion_version
from workqueue.statuses import TERMINAL_WORK_STATUSES

DbRow = Row[*tuple[Any, ...]]  # a result row of any shape

# The protocol row's Origin that greenfield activation writes (the other is "cutover").
GREENFIELD = "greenfield"

# (pack, projection key) -> [(InputStartOrdinal, LaneOrdinal, WorkId, Status)] by LaneOrdinal
Generations = dict[tuple[str, str], list[tuple[int, int, str, str]]]


@dataclasses.dataclass(frozen=True)
class Bounds:
    """A generation's bounds and claim state at one moment (for invariant B)."""

    start: int | None
    end: int
    status: str
    attempt: int


def generation_bounds(engine: sa.Engine) -> dict[str, Bounds]:
    """Snapshot every WorkItem's bounds, to compare a later snapshot with (``assert_bounds_moved_legally``)."""
    with engine.connect() as connection:
        rows = connection.execute(
            sa.select(
                WorkItem.c.WorkId,
                WorkItem.c.InputStartOrdinal,
                WorkItem.c.LaneOrdinal,
                WorkItem.c.Status,
                WorkItem.c.Attempt,
            )
        )
        return {r.WorkId: Bounds(r.InputStartOrdinal, r.LaneOrdinal, r.Status, r.Attempt) for r in rows}


def bounds_violations(before: dict[str, Bounds], after: dict[str, Bounds]) -> list[str]:
    """B: InputStartOrdinal never changes; LaneOrdinal only rises, and only while unclaimed attempt-zero."""
    problems = []
    for work_id, old in before.items():
        new = after.get(work_id)
        if new is None:
            problems.append(f"B: generation {work_id} disappeared")
            continue
        if new.start != old.start:
            problems.append(f"B: {work_id} InputStartOrdinal changed {old.start} -> {new.start}")
        if new.end < old.end:
            problems.append(f"B: {work_id} LaneOrdinal fell {old.end} -> {new.end}")
        unclaimed = old.status in (WorkStatus.PENDING, WorkStatus.BLOCKED) and old.attempt == 0
        if new.end > old.end and not unclaimed:
            problems.append(f"B: {work_id} LaneOrdinal rose while {old.status} attempt {old.attempt}")
    return problems


@contextlib.contextmanager
def snapshot(engine: sa.Engine) -> Iterator[sa.Connection]:
    """A connection whose reads all see one snapshot of the database.

    The checker may run while services still write (the retention pass prunes in the
    background): reads of Events and generations taken at different moments would show an
    Event without its generation. REPEATABLE READ on MySQL-protocol servers and TiDB; on
    SQLite the transaction holds the write lock while it reads.
    """
    with engine.connect() as connection:
        if not is_sqlite(engine):
            connection.execution_options(isolation_level="REPEATABLE READ")
        with connection.begin():
            yield connection


# Each EventPayload row's size, and whether its Event keeps a copy in Event.Payload that
# differs from it (a copy is allowed until the payload contract empties it).
_PAYLOAD_SIZES = sa.select(
    EventPayload.c.PackInstallId,
    EventPayload.c.EnqueueOrdinal,
    sa.func.length(EventPayload.c.Payload).label("Bytes"),
    sa.and_(Event.c.Payload != b"", Event.c.Payload != EventPayload.c.Payload).label("CopyDiffers"),
).select_from(
    EventPayload.outerjoin(
        Event,
        sa.and_(
            Event.c.PackInstallId == EventPayload.c.PackInstallId,
            Event.c.EnqueueOrdinal == EventPayload.c.EnqueueOrdinal,
        ),
    )
)


def payload_storage_violations(engine: sa.Engine) -> list[str]:
    """P's rule of where payloads are stored alone: it reads only Event and EventPayload, so it runs on schema v8."""
    with snapshot(engine) as connection:
        events = connection.execute(sa.select(Event.c.PackInstallId, Event.c.EnqueueOrdinal, Event.c.PayloadBytes))
        return _payload_rows(events.all(), connection.execute(_PAYLOAD_SIZES).all())


def check_invariants(engine: sa.Engine) -> list[str]:
    """Every violation of M, O, B, D, X, P and R visible in one snapshot of the database."""
    with snapshot(engine) as connection:
        counters = sa.select(PackInstall.c.PackInstallId, PackInstall.c.LastOrdinal)
        packs = {r.PackInstallId: r.LastOrdinal for r in connection.execute(counters)}
        protocols = connection.execute(sa.select(ConnectorProjectionProtocol)).all()
        events = connection.execute(
            sa.select(
                Event.c.PackInstallId,
                Event.c.EnqueueOrdinal,
                Event.c.ProjectionKey,
                Event.c.ReceiptKey,
                Event.c.PayloadHash,
                Event.c.IsReplay,
                Event.c.PayloadBytes,
            )
        ).all()
        payloads = connection.execute(_PAYLOAD_SIZES).all()
        work = connection.execute(sa.select(WorkItem)).all()
        receipts = connection.execute(
            sa.select(
                IngressReceipt.c.PackInstallId,
                IngressReceipt.c.ReceiptKey,
                IngressReceipt.c.PayloadHash,
                IngressReceipt.c.State,
            )
        ).all()
        policies = {r.PackInstallId: r for r in connection.execute(sa.select(RetentionPolicy))}
        pruned_work = connection.execute(sa.select(PrunedWork)).all()
        skipped = set(connection.execute(sa.select(SkippedWork.c.WorkId)).scalars())
        tombstones = connection.execute(sa.select(PrunedReceipt)).all()
        attempted = set(connection.execute(sa.select(WorkAttempt.c.WorkId).distinct()).scalars())
        tracks = connection.execute(sa.select(FlowVersionTrack)).all()
    cutoffs = {r.PackInstallId: r.LegacyMaxOrdinal for r in protocols}
    greenfield = {r.PackInstallId for r in protocols if r.Origin == GREENFIELD}
    problems: list[str] = []
    problems += _ordinals(packs, greenfield, events)
    generations: Generations = defaultdict(list)
    member_keys: dict[tuple[str, str], str] = {}  # a generation key -> its members' key (a version's: InputKey)
    for w in work:
        if w.InputStartOrdinal is not None:
            generations[(w.PackInstallId, w.ProjectionKey)].append(
                (w.InputStartOrdinal, w.LaneOrdinal, w.WorkId, w.Status)
            )
            member_keys[(w.PackInstallId, w.ProjectionKey)] = w.InputKey or w.ProjectionKey
    for ranges in generations.values():
        ranges.sort(key=lambda g: g[1])
    problems += _membership(cutoffs, events, generations, tracks)
    problems += _old_protocol_work(cutoffs, work)
    problems += _bounds_and_payload(events, generations, member_keys)
    problems += _admitted_counts(events, work)
    problems += _payload_rows(events, payloads)
    problems += _execution(generations, _replays_run_first(work, skipped))
    problems += _duplicates(cutoffs, events, receipts)
    problems += _retention(packs, policies, events, receipts, generations, pruned_work, tombstones)
    # Attempt history goes with its generation: none outlives a pruned one.
    orphans = sorted(attempted - {w.WorkId for w in work})
    problems += [f"R: attempts of {work_id} remain without their generation" for work_id in orphans]
    return problems


def window_violations(engine: sa.Engine, acknowledged: Mapping[tuple[str, str], dt.datetime]) -> list[str]:
    """W: every acknowledged input (pack, receipt key) -> SourceTime is retained, or expired at or below the horizon.

    An input is retained as an Event or a tombstone; one that is neither must have expired with
    its pack's duplicate window, so its SourceTime is at or below HorizonSourceTime: a
    redelivery of it is then answered expired, never admitted again.
    """
    with snapshot(engine) as connection:
        events = {
            (r.PackInstallId, r.ReceiptKey)
            for r in connection.execute(sa.select(Event.c.PackInstallId, Event.c.ReceiptKey))
        }
        tombstones = {
            (r.PackInstallId, r.ReceiptKey)
            for r in connection.execute(sa.select(PrunedReceipt.c.PackInstallId, PrunedReceipt.c.ReceiptKey))
        }
        horizons = {
            r.PackInstallId: r.HorizonSourceTime
            for r in connection.execute(sa.select(RetentionPolicy.c.PackInstallId, RetentionPolicy.c.HorizonSourceTime))
        }
    problems = []
    for (pack, key), source_time in acknowledged.items():
        if (pack, key) in events or (pack, key) in tombstones:
            continue
        horizon = horizons.get(pack)
        naive = source_time.astimezone(dt.UTC).replace(tzinfo=None) if source_time.tzinfo else source_time
        if horizon is None or naive > horizon:
            problems.append(
                f"W: input {pack}/{key} (source time {naive.isoformat()}) has no Event and no tombstone, and lies "
                f"above the pack's horizon {horizon}: a redelivery would be admitted again"
            )
    return problems


def _retention(
    packs: dict[str, int],
    policies: dict[str, DbRow],
    events: Iterable[DbRow],
    receipts: Iterable[DbRow],
    generations: Generations,
    pruned_work: Iterable[DbRow],
    tombstones: Iterable[DbRow],
) -> list[str]:
    """R: what retention pruned is gone for good, recorded at or below the horizon, and never reused.

    A pruned generation lies at or below its pack's horizon (which is at or below the counter),
    no retained generation of its identity overlaps it and no Event of its identity is left in
    its range (a reused ordinal would be); each tombstone names a pruned generation containing
    its ordinal (or, once its pack's duplicate window expired tombstones, a record that expired
    before it, at or below the horizon), and neither an Event nor a receipt holds its key or
    ordinal any more.
    """
    problems = []
    pruned = {w.WorkId: w for w in pruned_work}
    retained = {(e.PackInstallId, e.EnqueueOrdinal): e for e in events}
    by_identity: defaultdict[tuple[str, str], list[int]] = defaultdict(list)
    for (pack, ordinal), e in retained.items():
        by_identity[(pack, e.ProjectionKey)].append(ordinal)
    for w in pruned.values():
        policy = policies.get(w.PackInstallId)
        horizon = 0 if policy is None else policy.HorizonOrdinal
        if not w.LaneOrdinal <= horizon <= packs[w.PackInstallId]:
            problems.append(
                f"R: pruned {w.WorkId} [{w.InputStartOrdinal},{w.LaneOrdinal}] is above the horizon {horizon} "
                f"or the horizon above LastOrdinal {packs[w.PackInstallId]}"
            )
        identity = (w.PackInstallId, w.ProjectionKey)
        for start, end, work_id, _ in generations.get(identity, []):
            if start <= w.LaneOrdinal and w.InputStartOrdinal <= end:
                problems.append(f"R: retained {work_id} [{start},{end}] overlaps pruned {w.WorkId}")
        left = [o for o in by_identity.get(identity, []) if w.InputStartOrdinal <= o <= w.LaneOrdinal]
        if left:
            problems.append(f"R: Events {left[:5]} remain (or were reused) in the range of pruned {w.WorkId}")
    receipt_keys = {(r.PackInstallId, r.ReceiptKey) for r in receipts}
    event_keys = {(e.PackInstallId, e.ReceiptKey) for e in events if e.ReceiptKey is not None}
    for t in tombstones:
        key = (t.PackInstallId, t.ReceiptKey)
        owner = pruned.get(t.WorkId)
        policy = policies.get(t.PackInstallId)
        if owner is None and policy is not None and policy.HorizonSourceTime is not None:
            # Its record expired first: the horizon still bounds what was pruned.
            if t.EnqueueOrdinal > policy.HorizonOrdinal:
                problems.append(
                    f"R: tombstone {key} (input {t.EnqueueOrdinal}) outlived its record {t.WorkId} "
                    f"but lies above the horizon {policy.HorizonOrdinal}"
                )
        elif owner is None or not owner.InputStartOrdinal <= t.EnqueueOrdinal <= owner.LaneOrdinal:
            problems.append(f"R: tombstone {key} (input {t.EnqueueOrdinal}) is not in its pruned generation {t.WorkId}")
        if key in receipt_keys or key in event_keys or (t.PackInstallId, t.EnqueueOrdinal) in retained:
            problems.append(f"R: tombstone {key} (input {t.EnqueueOrdinal}) is still (or again) a receipt or Event")
    return problems


def _ordinals(packs: dict[str, int], greenfield: set[str], events: Iterable[DbRow]) -> list[str]:
    """O: every ordinal is at most its pack's counter and positive, but for old-protocol history's 0.

    Ordinal 0 is legacy only: in a pack without a protocol row, or in one cut over (where 0 is
    always at or below LegacyMaxOrdinal). A greenfield pack has no legacy history (activation
    refuses a pack with history), and admission allocates from 1 in every pack.
    """
    problems = []
    for e in events:
        lowest = 1 if e.PackInstallId in greenfield else 0
        if e.EnqueueOrdinal < lowest or e.EnqueueOrdinal > packs[e.PackInstallId]:
            problems.append(
                f"O: Event {e.PackInstallId}/{e.EnqueueOrdinal} outside (0, LastOrdinal {packs[e.PackInstallId]}]"
            )
    return problems


def _tracks_of(tracks: Iterable[DbRow], pack: str, key: str) -> list[tuple[str, int, int | None]]:
    """The generation keys an input of ``key`` must be a member in, with the ordinals each covers (decision 185).

    Without Flow versions of its work type: its own key, everywhere. With them: each track over
    its delivered version, the own version's by its own key, another's by the identity with that
    version, from CoverFromOrdinal through CoverThroughOrdinal (open while it receives).
    """
    identity = decode_projection_key(key)
    mine = [
        t
        for t in tracks
        if t.PackInstallId == pack
        and t.WorkType == identity.work_type
        and t.SourceVersion == identity.companion_version
    ]
    if not mine:
        return [(key, 0, None)]
    return [
        (
            key if t.Version == t.SourceVersion else with_companion_version(key, t.Version),
            t.CoverFromOrdinal,
            t.CoverThroughOrdinal,
        )
        for t in mine
    ]


def _membership(
    cutoffs: dict[str, int], events: Iterable[DbRow], generations: Generations, tracks: Iterable[DbRow] = ()
) -> list[str]:
    """M: each input above the cutoff is a member of exactly one generation of each track covering it; no overlaps."""
    problems = []
    tracks = list(tracks)
    for e in events:
        if e.PackInstallId not in cutoffs or e.EnqueueOrdinal <= cutoffs[e.PackInstallId]:
            continue
        covering = _tracks_of(tracks, e.PackInstallId, e.ProjectionKey) if tracks else [(e.ProjectionKey, 0, None)]
        for key, low, high in covering:
            if e.EnqueueOrdinal < low or (high is not None and e.EnqueueOrdinal > high):
                continue
            owners = [g[2] for g in generations.get((e.PackInstallId, key), []) if g[0] <= e.EnqueueOrdinal <= g[1]]
            if len(owners) != 1:
                track = "" if key == e.ProjectionKey else f" of the Flow version track {key}"
                problems.append(
                    f"M: Event {e.PackInstallId}/{e.EnqueueOrdinal} is a member of {len(owners)} generations{track} "
                    f"{owners}"
                )
    for (pack, _key), ranges in generations.items():
        for (s1, l1, w1, _), (s2, l2, w2, _) in itertools.pairwise(ranges):
            if s2 <= l1:
                problems.append(f"M: generations {w1} [{s1},{l1}] and {w2} [{s2},{l2}] of pack {pack} overlap")
    return problems


def _old_protocol_work(cutoffs: dict[str, int], work: Iterable[DbRow]) -> list[str]:
    """M: old-protocol work (no InputStartOrdinal) ends at or below its pack's LegacyMaxOrdinal.

    Such a row is no generation, so no other check sees it; above the cutoff (where the legacy
    runtime refuses to write) it would cover native inputs by inference.
    """
    return [
        f"M: WorkItem {w.WorkId} of pack {w.PackInstallId} has no InputStartOrdinal but its LaneOrdinal "
        f"{w.LaneOrdinal} is above LegacyMaxOrdinal {cutoffs[w.PackInstallId]}"
        for w in work
        if w.InputStartOrdinal is None and w.PackInstallId in cutoffs and w.LaneOrdinal > cutoffs[w.PackInstallId]
    ]


def _bounds_and_payload(
    events: Iterable[DbRow], generations: Generations, member_keys: Mapping[tuple[str, str], str]
) -> list[str]:
    present = {(e.PackInstallId, e.ProjectionKey, e.EnqueueOrdinal) for e in events}
    problems = []
    for (pack, generation_key), ranges in generations.items():
        key = member_keys.get((pack, generation_key), generation_key)
        for start, end, work_id, _status in ranges:
            if start > end:
                problems.append(f"B: {work_id} has InputStartOrdinal {start} > LaneOrdinal {end}")
            if (pack, key, start) not in present:
                problems.append(f"P: {work_id} has no member at its InputStartOrdinal {start}")
            if (pack, key, end) not in present:
                problems.append(f"P: {work_id} has no selected Event at its LaneOrdinal {end}")
    return problems


def _admitted_counts(events: Iterable[DbRow], work: Iterable[DbRow]) -> list[str]:
    """P: a generation whose admitted member count is known has exactly that many members.

    A generation without its first or selected member is named for that (``_bounds_and_payload``)
    and not again here: this finds the loss of a member between them.
    """
    members: defaultdict[tuple[str, str], list[int]] = defaultdict(list)
    for e in events:
        members[(e.PackInstallId, e.ProjectionKey)].append(e.EnqueueOrdinal)
    for ordinals in members.values():
        ordinals.sort()
    problems = []
    for w in work:
        admitted = admitted_count(w)
        if w.InputStartOrdinal is None or admitted is None:
            continue
        ordinals = members.get((w.PackInstallId, w.InputKey or w.ProjectionKey), [])
        low, high = bisect.bisect_left(ordinals, w.InputStartOrdinal), bisect.bisect_right(ordinals, w.LaneOrdinal)
        found = high - low
        ends = found > 0 and ordinals[low] == w.InputStartOrdinal and ordinals[high - 1] == w.LaneOrdinal
        if ends and found != admitted:
            problems.append(
                f"P: {w.WorkId} [{w.InputStartOrdinal},{w.LaneOrdinal}] has {found} members "
                f"but admission recorded {admitted}"
            )
    return problems


def _payload_rows(events: Iterable[DbRow], payloads: Iterable[DbRow]) -> list[str]:
    payloads = list(payloads)
    stored = {(p.PackInstallId, p.EnqueueOrdinal): p.Bytes for p in payloads}  # a primary key: one row each
    differs = {(p.PackInstallId, p.EnqueueOrdinal): bool(p.CopyDiffers) for p in payloads}
    problems = []
    for e in events:
        key = (e.PackInstallId, e.EnqueueOrdinal)
        size = stored.pop(key, None)
        if e.PayloadBytes is not None and size != e.PayloadBytes:
            found = "no EventPayload row" if size is None else f"an EventPayload of {size} bytes"
            problems.append(f"P: Event {key} records a {e.PayloadBytes}-byte payload but has {found}")
        elif e.PayloadBytes is not None and differs.get(key):
            problems.append(f"P: Event {key} keeps a copy in Event.Payload that differs from its EventPayload row")
        elif e.PayloadBytes is None and size is not None:
            problems.append(f"P: Event {key} keeps its payload in Event but also has an EventPayload row")
    problems += [f"P: EventPayload {key} has no Event" for key in sorted(stored)]
    return problems


def _replays_run_first(work: Iterable[DbRow], skipped: set[str]) -> dict[str, tuple[str, bool]]:
    """Each replay that runs before a held generation: the held WorkId, and whether it is unfinished.

    Unfinished: not completed, and not replayed or skipped after failing for good.
    """
    replayed = {w.ReplayOfWorkId for w in work if w.ReplayOfWorkId}
    return {
        w.WorkId: (
            w.RunsBeforeWorkId,
            w.Status != WorkStatus.COMPLETED
            and not (w.Status == WorkStatus.FAILED and (w.WorkId in replayed or w.WorkId in skipped)),
        )
        for w in work
        if w.RunsBeforeWorkId
    }


def _execution(generations: Generations, run_first: Mapping[str, tuple[str, bool]]) -> list[str]:
    """X: one generation of an identity processing at a time, in LaneOrdinal order.

    A replay run first (``run_first``) stands in its dead letter's place: it runs once every
    generation below the one it holds is terminal, and that one runs after it.
    """
    problems = []
    for ranges in generations.values():
        processing = [work_id for _s, _e, work_id, status in ranges if status == WorkStatus.PROCESSING]
        if len(processing) > 1:
            problems.append(f"X: {', '.join(processing)} of one identity are processing at once")
        chain = [g for g in ranges if g[2] not in run_first]
        seen_nonterminal = None
        for _start, _end, work_id, status in chain:
            if seen_nonterminal is not None and status != WorkStatus.BLOCKED:
                problems.append(f"X: {work_id} is {status} while its predecessor {seen_nonterminal} is not terminal")
            if status not in TERMINAL_WORK_STATUSES and seen_nonterminal is None:
                seen_nonterminal = work_id
        starts = {work_id: (start, status) for start, _e, work_id, status in chain}
        for _start, _end, work_id, status in ranges:
            if work_id not in run_first:
                continue
            held, unfinished = run_first[work_id]
            held_start, held_status = starts.get(held, (None, None))
            if held_start is None:
                continue  # the held generation was pruned after it ran
            if unfinished and held_status not in (WorkStatus.PENDING, WorkStatus.RETRY):
                problems.append(f"X: {held} is {held_status} before replay {work_id}, which runs first, finished")
            started = status not in (WorkStatus.PENDING, WorkStatus.RETRY)
            early = [w for s, _e, w, st in chain if s < held_start and st not in TERMINAL_WORK_STATUSES]
            if started and early:
                problems.append(f"X: replay {work_id} is {status} while {early[0]} below it is not terminal")
    return problems


def _duplicates(cutoffs: dict[str, int], events: Iterable[DbRow], receipts: Iterable[DbRow]) -> list[str]:
    """D: each Event carries its receipt's payload hash, and an input whose Event existed keeps it.

    A native input above LegacyMaxOrdinal has its receipt for as long as its Event is retained
    (admission writes both in one transaction; retention deletes both in one); only old-protocol
    history may predate receipts.
    """
    by_key = {(r.PackInstallId, r.ReceiptKey): r for r in receipts}
    problems = []
    admitted = set()
    for e in events:
        if e.IsReplay:
            if e.ReceiptKey is not None:
                problems.append(f"D: replay Event {e.PackInstallId}/{e.EnqueueOrdinal} carries a receipt key")
            continue
        receipt = by_key.get((e.PackInstallId, e.ReceiptKey))
        if receipt is None:
            cutoff = cutoffs.get(e.PackInstallId)
            if cutoff is not None and e.EnqueueOrdinal > cutoff:
                problems.append(
                    f"D: Event {e.PackInstallId}/{e.EnqueueOrdinal} (receipt key {e.ReceiptKey}) has no receipt "
                    f"though admitted above LegacyMaxOrdinal {cutoff}"
                )
            continue
        admitted.add((e.PackInstallId, e.ReceiptKey))
        if receipt.PayloadHash != e.PayloadHash:
            problems.append(f"D: Event {e.PackInstallId}/{e.EnqueueOrdinal} differs from its receipt's payload")
    for key, receipt in by_key.items():
        if key in admitted:
            continue
        if receipt.State == ReceiptState.CONFIRMED:
            problems.append(f"D: receipt {key} is confirmed but has no Event (an acknowledged input was lost)")
        elif receipt.State == ReceiptState.COVERAGE_MISSING:  # a verdict given only about an existing Event
            problems.append(f"D: receipt {key} is coverage_missing but has no Event (its input was lost)")
    return problems
