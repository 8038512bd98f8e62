"""Retention: a per-pack policy, and the pruner that deletes what it lets go (decisions 123 and 127).

Only terminal native generations the policy no longer keeps go, with their Events,
receipts and attempt history (WorkAttempt, decision 175); tombstones answer later
duplicates, and every pass is bounded. ``prune`` says what is kept and how a pruning stays
right on a multi-primary engine.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Connection, Engine

from nexuscrm_connectors.context import Context
from nexuscrm_connectors.errors import ProtocolMissing, UnknownPack
from nexuscrm_connectors.queries import operator_reads as operator_reads_sql
from nexuscrm_connectors.queries import packs as packs_sql
from nexuscrm_connectors.queries import retention as retention_sql
from nexuscrm_connectors.queries import work_attempts as work_attempts_sql
from nexuscrm_connectors.settings import Settings
from nexuscrm_runtime.clock import DatabaseClock
from nexuscrm_runtime.database import run_transaction
from workqueue import WorkStatus
from workqueue.errors import InvalidArgument
from workqueue.statuses import TERMINAL_WORK_STATUSES
from workqueue.values import PruneReport, RetentionPolicy

Cursor = tuple[dt.datetime, str]  # (FinishedAt, WorkId) of the last candidate read
DECIDED_PER_TRANSACTION = 200  # candidates one pruning transaction decides at most (fewer when budget is smaller)
EXPIRE_BATCHES_PER_PASS = 20  # expiring transactions per pack and pass (each up to prune_batch_events tombstones)
BACKLOG_CAP = 10_000  # prunable-but-retained generations counted per pack at most


def policy_from_row(pack_install_id: str, row: Any) -> RetentionPolicy:
    """The policy of a ``RetentionPolicy`` row; the default (off) when there is none."""
    if row is None:
        return RetentionPolicy(pack_install_id=pack_install_id)
    return RetentionPolicy(
        pack_install_id=pack_install_id,
        keep_generations=row.KeepGenerations,
        keep_seconds=row.KeepSeconds,
        duplicate_window_seconds=row.DuplicateWindowSeconds,
        horizon_ordinal=int(row.HorizonOrdinal),
        horizon_source_time=row.HorizonSourceTime,
        expired_receipts=int(row.ExpiredReceipts),
        pruned_generations=int(row.PrunedGenerations),
        last_pruned_at=row.LastPrunedAt,
    )


def set_policy(
    context: Context,
    pack_install_id: str,
    *,
    keep_generations: int | None,
    keep_seconds: int | None,
    duplicate_window_seconds: int | None = None,
) -> RetentionPolicy:
    """Set the pack's policy (both limits None turns pruning off; the horizons stay).

    ``duplicate_window_seconds`` (None: tombstones kept forever) makes tombstones expire and
    every delivery's SourceTime required (decision 127). Refuses ``keep_generations`` below 1,
    negative ``keep_seconds`` or a window below one second (INVALID_ARGUMENT), an unknown
    pack (``UnknownPack``) and a pack without a protocol row (``ProtocolMissing``).
    """
    engine, clock = context.engine, context.clock
    if not pack_install_id:
        raise InvalidArgument("pack_install_id is required", field="pack_install_id")
    if keep_generations is not None and keep_generations < 1:
        raise InvalidArgument(
            f"keep_generations must be at least 1 (the newest generation of an identity is always kept), "
            f"got {keep_generations}",
            field="keep_generations",
        )
    if keep_seconds is not None and keep_seconds < 0:
        raise InvalidArgument(f"keep_seconds must not be negative, got {keep_seconds}", field="keep_seconds")
    if duplicate_window_seconds is not None and duplicate_window_seconds < 1:
        raise InvalidArgument(
            f"duplicate_window_seconds must be at least 1, got {duplicate_window_seconds}",
            field="duplicate_window_seconds",
        )

    def run(connection: Connection) -> RetentionPolicy:
        pack = packs_sql.pack_lock(connection, pack_install_id, clock)
        if packs_sql.protocol_get(connection, pack_install_id) is None:
            raise ProtocolMissing(
                f"pack {pack_install_id} has no projection protocol row: retention is refused, because the "
                "cutover audit of a pack that is not cut over reads its whole retained history",
                field="pack_install_id",
            )
        packs_sql.pack_control_version_bump(connection, pack_install_id)
        retention_sql.policy_upsert(
            connection,
            pack_install_id,
            keep_generations=keep_generations,
            keep_seconds=keep_seconds,
            duplicate_window_seconds=duplicate_window_seconds,
            now=pack.now,
        )
        return policy_from_row(pack_install_id, retention_sql.policy_get(connection, pack_install_id))

    return run_transaction(engine, run, name="retention policy")


def get_policy(engine: Engine, pack_install_id: str) -> RetentionPolicy:
    """The pack's policy and horizon (off when none was set); raises ``UnknownPack``."""
    with engine.connect() as connection:
        if operator_reads_sql.pack_namespace(connection, pack_install_id) is None:
            raise UnknownPack(f"pack_install_id {pack_install_id!r} is not installed", field="pack_install_id")
        return policy_from_row(pack_install_id, retention_sql.policy_get(connection, pack_install_id))


def prune(
    context: Context,
    pack_install_id: str,
    *,
    dry_run: bool = False,
    max_generations: int = 0,
    after: Cursor | None = None,
) -> tuple[PruneReport, Cursor | None]:
    """One bounded pass over a pack; returns the report and the cursor to continue from (None at the end).

    Reads up to ``max_generations`` (0: the per-pass setting) candidates after ``after`` and
    prunes those the policy lets go, then expires what the duplicate window lets go (up to
    ``EXPIRE_BATCHES_PER_PASS`` transactions); ``dry_run`` counts them and changes nothing.

    Never pruned: a generation that is not terminal (so never a member of one), the newest
    ``KeepGenerations`` of each identity, one finished less than ``KeepSeconds`` ago, one whose
    successor is still blocked, a dead letter (failed, never replayed nor skipped) whose work
    type or pack is under the "block" order policy (decision 165: pruning it would release the
    successor it holds), a generation whose inputs a live replay runs again (decision 173),
    old-protocol work, and anything of a pack without a protocol row.
    What goes leaves a ``PrunedWork`` record and a ``PrunedReceipt`` tombstone per receipt;
    the ordinal counter is never touched, HorizonOrdinal never moves back. One transaction
    deletes at most ``prune_batch_events`` members (a larger generation in several, its
    WorkItem with the last), so each retained Event stays in its generation.

    Multi-primary (decision 107): each transaction re-reads the policy and the generation and
    decides only from facts no concurrent writer undoes (terminal is final, a generation never
    becomes the newest again, a terminal one's members are frozen, a blocked successor is
    only unblocked), and writes the policy row (LastPrunedAt), so a policy change conflicts
    with a pruning that read the old policy. Tombstones older than the duplicate window expire
    oldest first; each expiring transaction raises HorizonSourceTime (never back) and bumps
    the pack row admission writes, so an admission that read the old horizon cannot commit.
    """
    engine, settings, clock = context.engine, context.settings, context.clock
    limit = max_generations or settings.prune_generations_per_pass
    if not 1 <= limit <= settings.prune_generations_per_pass:
        raise InvalidArgument(
            f"max_generations must be between 1 and {settings.prune_generations_per_pass}, got {max_generations}",
            field="max_generations",
        )
    policy = get_policy(engine, pack_install_id)
    if not policy.active:
        expired = _expire(context, policy, dry_run=dry_run)
        return dataclasses.replace(expired, horizon_ordinal=policy.horizon_ordinal), None
    with engine.connect() as connection:
        now = clock.read(connection)  # ages on the database's clock, as FinishedAt was (decision 118)
        candidates = retention_sql.work_items_retention_candidates(
            connection, pack_install_id, finished_before=policy.finished_before(now), after=after, limit=limit
        )
        if dry_run:
            report = _dry_run(connection, policy, candidates, now)
    if not dry_run:
        pruned = _Tally()
        waiting = [candidate.WorkId for candidate in candidates]
        while waiting:  # each transaction settles at least the first waiting generation's next chunk
            batch = functools.partial(
                _prune_batch, settings=settings, clock=clock, pack_install_id=pack_install_id, work_ids=waiting
            )
            tally, settled = run_transaction(engine, batch, name="retention prune")
            pruned.add(tally)
            waiting = waiting[settled:]
        report = PruneReport(
            pack_install_id=pack_install_id,
            dry_run=False,
            generations=pruned.generations,
            events=pruned.events,
            receipts=pruned.receipts,
            kept=pruned.kept,
        )
    expired = _expire(context, policy, dry_run=dry_run)
    report = dataclasses.replace(
        report,
        expired_receipts=expired.expired_receipts,
        expired_generations=expired.expired_generations,
        horizon_source_time=expired.horizon_source_time,
        horizon_ordinal=report.horizon_ordinal if dry_run else get_policy(engine, pack_install_id).horizon_ordinal,
    )
    cursor = (candidates[-1].FinishedAt, candidates[-1].WorkId) if len(candidates) == limit else None
    return report, cursor


def _expire(context: Context, policy: RetentionPolicy, *, dry_run: bool) -> PruneReport:
    """Expire what the duplicate window lets go, in bounded transactions; the report's expiry fields.

    A dry run counts the tombstones that would expire now, up to one batch.
    """
    engine, settings, clock = context.engine, context.settings, context.clock
    report = PruneReport(
        pack_install_id=policy.pack_install_id, dry_run=dry_run, horizon_source_time=policy.horizon_source_time
    )
    if policy.duplicate_window_seconds is None:
        return report
    if dry_run:
        with engine.connect() as connection:
            before = clock.read(connection) - dt.timedelta(seconds=policy.duplicate_window_seconds)
            due = retention_sql.tombstones_expiring(
                connection, policy.pack_install_id, before, settings.prune_batch_events
            )
        return dataclasses.replace(report, expired_receipts=len(due))
    receipts = generations = 0
    for _ in range(EXPIRE_BATCHES_PER_PASS):
        batch = functools.partial(_expire_batch, settings=settings, clock=clock, pack_install_id=policy.pack_install_id)
        tombstones, records, more = run_transaction(engine, batch, name="retention expire")
        receipts, generations = receipts + tombstones, generations + records
        if not more:
            break
    return dataclasses.replace(
        report,
        expired_receipts=receipts,
        expired_generations=generations,
        horizon_source_time=get_policy(engine, policy.pack_install_id).horizon_source_time,
    )


def _expire_batch(
    connection: Connection, settings: Settings, clock: DatabaseClock, pack_install_id: str
) -> tuple[int, int, bool]:
    """One expiring transaction: up to ``prune_batch_events`` tombstones, oldest SourceTime first.

    Raises the horizon over every SourceTime it deletes, and bumps the pack row admission
    writes (decision 107): an admission that read the old horizon cannot commit an admission
    of a key whose tombstone this deletes. Once no tombstone below the cutoff is left, records
    of pruned generations below it go too (their tombstones are gone); while tombstones are
    still due, the records older than the newest tombstone this deletes go with it, so under
    steady ingest records expire in step with their tombstones instead of in bursts once the
    tombstones run dry. Returns the tombstones and records deleted, and whether more may be due.
    """
    now = clock.read(connection)
    policy = policy_from_row(pack_install_id, retention_sql.policy_get(connection, pack_install_id))
    before = policy.expire_before(now)
    if before is None:
        return 0, 0, False
    limit = settings.prune_batch_events
    due = retention_sql.tombstones_expiring(connection, pack_install_id, before, limit)
    # Tombstones go oldest first: every one older than the batch's newest is in the batch.
    records_before = due[-1].SourceTime if len(due) == limit else before
    records = retention_sql.pruned_work_expiring(connection, pack_install_id, records_before, limit)
    if not due and not records:
        return 0, 0, False
    packs_sql.pack_control_version_bump(connection, pack_install_id)  # the pack row first, as admission locks it
    tombstones = retention_sql.tombstones_delete(connection, pack_install_id, [row.ReceiptKey for row in due], before)
    expired = retention_sql.pruned_work_delete(connection, records)
    horizon = max((row.SourceTime for row in due), default=None)
    recorded = retention_sql.policy_record_expiry(
        connection, pack_install_id, horizon=horizon, expired=tombstones, now=now
    )
    if recorded != 1:
        raise RuntimeError(f"the retention policy of pack {pack_install_id} vanished")
    return tombstones, expired, len(due) == limit or len(records) == limit


def _dry_run(connection: Connection, policy: RetentionPolicy, candidates: list[Any], now: dt.datetime) -> PruneReport:
    going = _letting_go(connection, policy, candidates, now)
    generations = events = receipts = 0
    for row in candidates:
        if row.WorkId in going:
            members, with_receipt = retention_sql.events_member_counts(
                connection, row.PackInstallId, row.ProjectionKey, row.InputStartOrdinal, row.LaneOrdinal
            )
            generations, events, receipts = generations + 1, events + members, receipts + with_receipt
    return PruneReport(
        pack_install_id=policy.pack_install_id,
        dry_run=True,
        generations=generations,
        events=events,
        receipts=receipts,
        kept=len(candidates) - generations,
        horizon_ordinal=policy.horizon_ordinal,
    )


def _letting_go(connection: Connection, policy: RetentionPolicy, rows: Sequence[Any], now: dt.datetime) -> set[str]:
    """The WorkIds of ``rows`` the policy lets go; every other one it (or a rule above every policy) keeps.

    Set-based: one statement per rule for all of ``rows`` (and one per level of replays of replays).
    """
    if not policy.active:
        return set()
    cutoff = policy.finished_before(now)
    old = [
        row.WorkId
        for row in rows
        if row.InputStartOrdinal is not None  # old-protocol work stays
        and WorkStatus(row.Status) in TERMINAL_WORK_STATUSES
        and row.FinishedAt is not None
        and row.FinishedAt <= cutoff
    ]
    keep = policy.keep_generations or 1  # the newest generation of an identity always stays
    going = retention_sql.work_items_superseded(connection, old, keep)
    # A dead letter under "block": pruning it would release the successor it holds.
    going -= retention_sql.work_items_holding_order(
        connection, [row.WorkId for row in rows if row.WorkId in going and row.Status == WorkStatus.FAILED]
    )
    going -= _replayed_by_live_work(connection, going)  # a live replay runs these inputs again (decision 173)
    successors = {row.SuccessorWorkId: row.WorkId for row in rows if row.WorkId in going and row.SuccessorWorkId}
    going -= {successors[blocked] for blocked in retention_sql.work_items_blocked(connection, list(successors))}
    return going


def _replayed_by_live_work(connection: Connection, work_ids: set[str]) -> set[str]:
    """Of ``work_ids``, those a nonterminal replay runs again, directly or as a replay of its replay."""
    live: set[str] = set()
    roots = {work_id: {work_id} for work_id in work_ids}  # each replay reached, and whose chain it is in
    while roots:
        reached: dict[str, set[str]] = {}
        for replay in retention_sql.work_items_replays_newest(connection, list(roots)):
            if WorkStatus(replay.Status) not in TERMINAL_WORK_STATUSES:
                live |= roots[replay.ReplayOfWorkId]
            else:
                reached.setdefault(replay.WorkId, set()).update(roots[replay.ReplayOfWorkId])
        roots = reached
    return live


@dataclasses.dataclass
class _Tally:
    generations: int = 0
    events: int = 0
    receipts: int = 0
    kept: int = 0

    def add(self, other: _Tally) -> None:
        self.generations += other.generations
        self.events += other.events
        self.receipts += other.receipts
        self.kept += other.kept


def _member_hint(row: Any) -> int | None:
    """The generation's member count as its admissions wrote it, when trusted (decision 149); None otherwise."""
    through = row.AdmittedThroughOrdinal
    if row.AdmittedMemberCount is None or through is None or row.LaneOrdinal > through:
        return None
    return int(row.AdmittedMemberCount)


def _plan(work_ids: Sequence[str], rows: dict[str, Any], going: set[str], budget: int) -> tuple[list[Any], int]:
    """The generations one transaction prunes whole, and how many of ``work_ids`` it settles.

    In order, the kept ones are settled and those the policy lets go join while their member
    counts fit ``budget``; the first that does not fit (or whose count is not trusted) ends
    the plan, or when it is the first, is the plan alone (to go in chunks) with the kept ones
    right behind it.
    """
    plan: list[Any] = []
    for position, work_id in enumerate(work_ids):
        if work_id not in going:
            continue
        hint = _member_hint(rows[work_id])
        if plan and (hint is None or hint > budget):
            return plan, position
        if hint is None or hint > budget:  # alone; the kept ones right behind it are settled with it
            after = position + 1
            while after < len(work_ids) and work_ids[after] not in going:
                after += 1
            return [rows[work_id]], after
        plan.append(rows[work_id])
        budget -= hint
    return plan, len(work_ids)


def _prune_batch(
    connection: Connection, settings: Settings, clock: DatabaseClock, pack_install_id: str, work_ids: list[str]
) -> tuple[_Tally, int]:
    """One pruning transaction over the first of ``work_ids``, up to ``prune_batch_events`` members.

    Decides the first ``DECIDED_PER_TRANSACTION`` of ``work_ids`` (at most ``prune_batch_events``)
    together, set-based, without a lock; locks the generations that go (one statement) and decides them again. Whole
    generations go together while their members fit (read in one statement, so a count that
    was wrong only makes the transaction shorter); a generation that does not fit goes alone,
    in chunks (its lowest members first, its WorkItem with the last chunk). The writes go in
    one statement each (tombstones, receipts, Events, WorkItems and their attempts, records).
    Returns what went and how many of ``work_ids`` are settled (pruned or kept); an unsettled
    one comes first in the next transaction.
    """
    now = clock.read(connection)
    # Locked: a Flow version's build locks it before it reads the inputs its catch-up counts, so
    # the two never overlap, and a build committed before is seen by the locked read below.
    policy = policy_from_row(pack_install_id, retention_sql.policy_get(connection, pack_install_id, lock=True))
    budget = settings.prune_batch_events
    deciding = work_ids[: min(budget, DECIDED_PER_TRANSACTION)]
    # Keeping needs no lock; the row lock is taken only to delete (admission locks an
    # identity's newest generation, which the policy always keeps), then decided again.
    rows = {row.WorkId: row for row in retention_sql.work_items_by_id(connection, deciding)}
    plan, settled = _plan(deciding, rows, _letting_go(connection, policy, list(rows.values()), now), budget)
    locked = {
        row.WorkId: row for row in retention_sql.work_items_by_id(connection, [r.WorkId for r in plan], lock=True)
    }
    going = _letting_go(connection, policy, list(locked.values()), now)
    plan = [locked[row.WorkId] for row in plan if row.WorkId in going]
    members = _members(connection, plan, budget + 1)
    if len(plan) > 1 and len(members) > budget:  # a count was wrong: the first goes alone, maybe in chunks
        plan, settled = plan[:1], work_ids.index(plan[0].WorkId) + 1
        members = _members(connection, plan, budget + 1)
    chunked = len(members) > budget  # then ``plan`` is one generation, and this is not its last chunk
    if chunked:
        members, settled = members[:budget], work_ids.index(plan[0].WorkId)
    tombstones: dict[str, list[dict[str, Any]]] = {row.WorkId: [] for row in plan}
    for member in members:
        if member.ReceiptKey is None:  # a replay Event has no receipt
            continue
        owner = member.WorkId
        tombstones[owner].append(
            {
                "PackInstallId": pack_install_id,
                "ReceiptKey": member.ReceiptKey,
                "EnqueueOrdinal": member.EnqueueOrdinal,
                "PayloadHash": member.PayloadHash,
                "WorkId": owner,
                "PrunedAt": now,
                "SourceTime": member.SourceTime,  # the duplicate window expires it by this (decision 127)
            }
        )
    pruned = [] if chunked else [(row, _newest_source_time(tombstones[row.WorkId], now)) for row in plan]
    tally = _Tally(kept=sum(1 for work_id in work_ids[:settled] if work_id in rows) - len(pruned))
    written = [tombstone for own in tombstones.values() for tombstone in own]
    retention_sql.receipts_prune(connection, written)
    tally.receipts = len(written)
    tally.events = retention_sql.events_delete(
        connection, pack_install_id, [member.EnqueueOrdinal for member in members]
    )
    tally.generations = retention_sql.work_items_prune(connection, pruned, now)
    if tally.generations != len(pruned):
        raise RuntimeError(f"a terminal generation of pack {pack_install_id} changed under its row lock")
    work_attempts_sql.work_attempts_delete(connection, [row.WorkId for row, _ in pruned])  # their history goes too
    if tally.events or tally.generations:
        horizon = max((row.LaneOrdinal for row, _ in pruned), default=None)
        recorded = retention_sql.policy_record_pruning(
            connection, pack_install_id, horizon=horizon, generations=tally.generations, now=now
        )
        if recorded != 1:
            raise RuntimeError(f"the retention policy of pack {pack_install_id} vanished")
    return tally, settled


def _members(connection: Connection, plan: Sequence[Any], limit: int) -> list[Any]:
    """Up to ``limit`` members of the planned generations in one statement (of one generation: lowest first)."""
    if len(plan) == 1:
        return retention_sql.events_members_page(connection, plan[0], limit)
    return retention_sql.events_members_of(connection, [row.WorkId for row in plan], limit)


def _newest_source_time(tombstones: list[dict[str, Any]], now: dt.datetime) -> dt.datetime | None:
    """The newest SourceTime of a generation's last chunk of tombstones; None if one has none.

    The record expires with the window by it. A generation pruned in several chunks may have
    earlier tombstones newer than this: they outlive the record, and still answer duplicates
    (``events_sql.events_by_receipt`` reads tombstones without their record too). Without a
    tombstone (only replay Events, which have no receipt) nothing answers a duplicate from the
    record: it expires a window after ``now``, its pruning (None kept it for ever).
    """
    times: list[dt.datetime | None] = [t["SourceTime"] for t in tombstones]
    if not times:
        return now
    if None in times:
        return None
    return max(time for time in times if time is not None)


@dataclasses.dataclass(frozen=True)
class Backlog:
    """What the pruner has yet to do: generations let go but retained, summed over packs, and the oldest's age.

    Each pack's count stops at ``BACKLOG_CAP``; both are near zero while the pruner keeps up (decision 181).
    """

    generations: int = 0
    oldest_seconds: float = 0.0


def backlog(connection: Connection, policy: RetentionPolicy, now: dt.datetime) -> tuple[int, dt.datetime | None]:
    """The pack's prunable-but-retained generations (up to ``BACKLOG_CAP``) and when the oldest finished.

    Counts by the policy's age and count limits only (``retention_sql.retention_backlog``).
    """
    if not policy.active:
        return 0, None
    return retention_sql.retention_backlog(
        connection,
        policy.pack_install_id,
        finished_before=policy.finished_before(now),
        keep=policy.keep_generations or 1,
        cap=BACKLOG_CAP,
    )


def describe_policy(context: Context, pack_install_id: str) -> RetentionPolicy:
    """``get_policy`` with the pruner's backlog (``backlog``); raises ``UnknownPack``."""
    policy = get_policy(context.engine, pack_install_id)
    with context.engine.connect() as connection:
        count, oldest = backlog(connection, policy, context.clock.read(connection))
    return dataclasses.replace(policy, backlog_generations=count, backlog_oldest_finished_at=oldest)


class Pruner:
    """The background retention pass: every pack with an active policy, bounded per pack.

    Keeps a keyset cursor per pack, so consecutive passes walk each pack's old generations
    instead of rereading the same kept ones, and start over at the end. A round prunes up to
    ``prune_generations_per_pass`` candidates per pack in transactions of at most
    ``prune_batch_events`` Events. A pass runs one round over every pack, then more rounds over
    the packs whose candidates filled theirs, until ``seconds`` have passed: a pruner behind
    admission works through its backlog at the rate it prunes instead of one round per pass
    (decision 181), in the same bounded transactions. Then it reads the backlog (``backlog``).
    """

    def __init__(self) -> None:
        self._after: dict[str, Cursor | None] = {}
        self.backlog = Backlog()

    def run(self, context: Context, seconds: float = 0.0) -> list[PruneReport]:
        """One pass of rounds for up to ``seconds`` (one round at least); a report per pack and round."""
        deadline = time.monotonic() + seconds
        with context.engine.connect() as connection:
            packs_with_policy = [row.PackInstallId for row in retention_sql.policies_active(connection)]
        reports = []
        due = packs_with_policy
        while due:
            for pack_install_id in due:
                report, self._after[pack_install_id] = prune(
                    context, pack_install_id, after=self._after.get(pack_install_id)
                )
                reports.append(report)
            if time.monotonic() >= deadline:
                break
            due = [pack_install_id for pack_install_id in due if self._after[pack_install_id] is not None]
        generations, oldest_seconds = 0, 0.0
        for pack_install_id in packs_with_policy:
            policy = get_policy(context.engine, pack_install_id)
            with context.engine.connect() as connection:
                now = context.clock.read(connection)
                count, oldest = backlog(connection, policy, now)
            generations += count
            if oldest is not None:
                oldest_seconds = max(oldest_seconds, (now - oldest).total_seconds())
        self.backlog = Backlog(generations, oldest_seconds)
        return reports
