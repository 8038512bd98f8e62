"""The statements of retention (``nexuscrm_connectors.operating.retention``): policy, candidates, pruning, tombstones.

Every statement is bounded: candidates come from ``ix_workitem_retention`` by keyset, members
from ``ix_event_source_lane`` within one generation's range and a limit, everything else by
primary key (decision 123).
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from nexuscrm_connectors.queries import DbRow
from nexuscrm_connectors.queries import order_policy as order_policy_sql
from nexuscrm_connectors.queries.operator_reads import after_keyset
from nexuscrm_schema.hints import probe_exists
from nexuscrm_schema.tables import (
    Event,
    EventPayload,
    FlowVersionTrack,
    IngressReceipt,
    PrunedReceipt,
    PrunedWork,
    RetentionPolicy,
    WorkItem,
)
from workqueue import WorkStatus
from workqueue.statuses import TERMINAL_WORK_STATUSES


def policy_get(connection: Connection, pack_install_id: str, *, lock: bool = False) -> DbRow | None:
    """The pack's RetentionPolicy row by primary key, optionally locked (pruning and a Flow version's build)."""
    statement = sa.select(RetentionPolicy).where(RetentionPolicy.c.PackInstallId == pack_install_id)
    return connection.execute(statement.with_for_update() if lock else statement).first()


def policy_upsert(
    connection: Connection,
    pack_install_id: str,
    *,
    keep_generations: int | None,
    keep_seconds: int | None,
    duplicate_window_seconds: int | None,
    now: dt.datetime,
) -> None:
    """Write the pack's policy, keeping its horizons; the caller holds the PackInstall row lock."""
    values = {
        "KeepGenerations": keep_generations,
        "KeepSeconds": keep_seconds,
        "DuplicateWindowSeconds": duplicate_window_seconds,
        "UpdatedAt": now,
    }
    updated = connection.execute(
        sa.update(RetentionPolicy).where(RetentionPolicy.c.PackInstallId == pack_install_id).values(**values)
    ).rowcount
    if not updated:
        connection.execute(sa.insert(RetentionPolicy).values(PackInstallId=pack_install_id, **values))


def policies_active(connection: Connection) -> list[DbRow]:
    """Every policy that limits something or has a duplicate window (a handful of rows: one per pack at most)."""
    return list(
        connection.execute(
            sa.select(RetentionPolicy)
            .where(
                sa.or_(
                    RetentionPolicy.c.KeepGenerations.is_not(None),
                    RetentionPolicy.c.KeepSeconds.is_not(None),
                    RetentionPolicy.c.DuplicateWindowSeconds.is_not(None),
                )
            )
            .order_by(RetentionPolicy.c.PackInstallId)
        )
    )


def policy_record_pruning(
    connection: Connection, pack_install_id: str, *, horizon: int | None, generations: int, now: dt.datetime
) -> int:
    """Record a pruning transaction on the policy row; return the rows updated (1).

    Always LastPrunedAt; when generations went (``generations``; ``horizon`` = their highest
    LaneOrdinal) also the count and the horizon, which never moves back. Every pruning transaction writes this row, so a
    concurrent policy change conflicts with it.
    """
    values: dict[str, Any] = {"LastPrunedAt": now}
    if horizon is not None:
        values["HorizonOrdinal"] = sa.case(
            (RetentionPolicy.c.HorizonOrdinal < horizon, horizon), else_=RetentionPolicy.c.HorizonOrdinal
        )
        values["PrunedGenerations"] = RetentionPolicy.c.PrunedGenerations + generations
    return int(
        connection.execute(
            sa.update(RetentionPolicy).where(RetentionPolicy.c.PackInstallId == pack_install_id).values(**values)
        ).rowcount
    )


# A work type with Flow versions keeps its history: its tracks share the inputs, and pruning
# one track's generation would take members another still reads (decision 185).
WITH_FLOW_VERSIONS = (
    sa.select(FlowVersionTrack.c.Version)
    .where(
        FlowVersionTrack.c.PackInstallId == WorkItem.c.PackInstallId, FlowVersionTrack.c.WorkType == WorkItem.c.WorkType
    )
    .exists()
)


def work_items_retention_candidates(
    connection: Connection,
    pack_install_id: str,
    *,
    finished_before: dt.datetime,
    after: tuple[dt.datetime, str] | None,
    limit: int,
) -> list[DbRow]:
    """Up to ``limit`` terminal native generations finished by ``finished_before``, oldest first.

    After the keyset ``after`` (FinishedAt, WorkId): one ``ix_workitem_retention`` range per
    terminal status, merged.
    """
    rows: list[DbRow] = []
    for status in sorted(TERMINAL_WORK_STATUSES):
        statement = sa.select(WorkItem).where(
            WorkItem.c.PackInstallId == pack_install_id,
            WorkItem.c.Status == status,
            WorkItem.c.FinishedAt <= finished_before,
            WorkItem.c.InputStartOrdinal.is_not(None),  # old-protocol work is never pruned
            ~WITH_FLOW_VERSIONS,
        )
        if after is not None:
            statement = statement.where(after_keyset((WorkItem.c.FinishedAt, WorkItem.c.WorkId), after))
        # The keyset's OR on WorkId tempts MariaDB into merging the primary key with the index
        # and sorting: keep the one index range, already in (FinishedAt, WorkId) order.
        statement = statement.with_hint(WorkItem, "FORCE INDEX (ix_workitem_retention)", dialect_name="mysql")
        rows += connection.execute(statement.order_by(WorkItem.c.FinishedAt, WorkItem.c.WorkId).limit(limit))
    return sorted(rows, key=lambda r: (r.FinishedAt, r.WorkId))[:limit]


def work_items_by_id(connection: Connection, work_ids: Sequence[str], *, lock: bool = False) -> list[DbRow]:
    """The WorkItems of ``work_ids`` by primary key (one statement), missing ones left out.

    Locked: only those of a work type without Flow versions, as pruning decides them again.
    """
    if not work_ids:
        return []
    statement = sa.select(WorkItem).where(WorkItem.c.WorkId.in_(list(work_ids)))
    return list(connection.execute(statement.where(~WITH_FLOW_VERSIONS).with_for_update() if lock else statement))


_NEWER = WorkItem.alias("newer")


@functools.lru_cache(maxsize=8)
def _nth_newer(keep: int) -> sa.ScalarSelect[Any]:
    """The LaneOrdinal of a WorkItem row's ``keep``-th newer generation of its identity (NULL: fewer newer).

    One seek of ix_workitem_projection_order per row, reading at most ``keep`` entries; built once per ``keep``.
    """
    return (
        sa.select(_NEWER.c.LaneOrdinal)
        .where(
            _NEWER.c.PackInstallId == WorkItem.c.PackInstallId,
            _NEWER.c.ProjectionKey == WorkItem.c.ProjectionKey,
            _NEWER.c.LaneOrdinal > WorkItem.c.LaneOrdinal,
        )
        .order_by(_NEWER.c.LaneOrdinal)
        .limit(1)
        .offset(keep - 1)
        .scalar_subquery()
    )


def work_items_superseded(connection: Connection, work_ids: Sequence[str], keep: int) -> set[str]:
    """Of ``work_ids``, those with at least ``keep`` newer generations of their identity (projection order)."""
    if not work_ids:
        return set()
    return set(
        connection.execute(
            sa.select(WorkItem.c.WorkId)
            .where(WorkItem.c.WorkId.in_(list(work_ids)), _nth_newer(keep).is_not(None))
            .with_hint(WorkItem, "FORCE INDEX (PRIMARY)", dialect_name="mysql")  # not a walk of the whole index
        ).scalars()
    )


_HOLDING_ORDER = sa.select(WorkItem.c.WorkId).where(
    WorkItem.c.WorkId.in_(sa.bindparam("work_ids", expanding=True)),
    WorkItem.c.Status == WorkStatus.FAILED,
    order_policy_sql.unresolved(WorkItem),
    order_policy_sql.effective_block(WorkItem.c.PackInstallId, WorkItem.c.WorkType),
)


def work_items_holding_order(connection: Connection, work_ids: Sequence[str]) -> set[str]:
    """Of ``work_ids``, the dead letters whose work type (or pack) is under "block" (decision 165).

    Pruning one would release the successor it holds: per row a primary-key read of
    WorkItem, the replay and skip probes, and the two policy probes.
    """
    if not work_ids:
        return set()
    return set(connection.execute(_HOLDING_ORDER, {"work_ids": list(work_ids)}).scalars())


_REPLAY, _LATER = WorkItem.alias("replay"), WorkItem.alias("later")
_REPLAYS_NEWEST = sa.select(_REPLAY.c.ReplayOfWorkId, _REPLAY.c.WorkId, _REPLAY.c.Status).where(
    _REPLAY.c.ReplayOfWorkId.in_(sa.bindparam("work_ids", expanding=True)),
    ~probe_exists(
        sa.select(_LATER.c.WorkId).where(
            _LATER.c.ReplayOfWorkId == _REPLAY.c.ReplayOfWorkId, _LATER.c.LaneOrdinal > _REPLAY.c.LaneOrdinal
        )
    ),
)


def work_items_replays_newest(connection: Connection, work_ids: Sequence[str]) -> list[DbRow]:
    """Of each of ``work_ids``, the newest replay: (ReplayOfWorkId, WorkId, Status) (ix_workitem_replay_of).

    Replays of one WorkId never overlap in time, so the newest is the only one that may be live.
    """
    if not work_ids:
        return []
    return list(connection.execute(_REPLAYS_NEWEST, {"work_ids": list(work_ids)}))


def work_items_blocked(connection: Connection, work_ids: Sequence[str]) -> set[str]:
    """Of ``work_ids``, the blocked ones (by primary key)."""
    if not work_ids:
        return set()
    return set(
        connection.execute(
            sa.select(WorkItem.c.WorkId).where(
                WorkItem.c.WorkId.in_(list(work_ids)), WorkItem.c.Status == WorkStatus.BLOCKED
            )
        ).scalars()
    )


def retention_backlog(
    connection: Connection, pack_install_id: str, *, finished_before: dt.datetime, keep: int, cap: int
) -> tuple[int, dt.datetime | None]:
    """Generations the policy lets go that are still there, counted up to ``cap``, and the oldest one's FinishedAt.

    Terminal native generations finished by ``finished_before`` with at least ``keep`` newer
    generations of their identity: per terminal status one ``ix_workitem_retention`` range,
    each row with one ``_nth_newer`` seek. The rarer rules that keep such a generation (a
    blocked successor, a dead letter under "block", a live replay) are not applied: what they
    keep is counted too.
    """
    count, oldest = 0, None
    for status in sorted(TERMINAL_WORK_STATUSES):
        prunable = sa.select(WorkItem.c.FinishedAt).where(
            WorkItem.c.PackInstallId == pack_install_id,
            WorkItem.c.Status == status,
            WorkItem.c.FinishedAt <= finished_before,
            WorkItem.c.InputStartOrdinal.is_not(None),
            ~WITH_FLOW_VERSIONS,
            _nth_newer(keep).is_not(None),
        )
        capped = prunable.limit(cap).subquery()
        count += int(connection.execute(sa.select(sa.func.count()).select_from(capped)).scalar_one())
        first = connection.execute(prunable.order_by(WorkItem.c.FinishedAt).limit(1)).scalar_one_or_none()
        if first is not None and (oldest is None or first < oldest):
            oldest = first
    return min(count, cap), oldest


_OWNER = WorkItem.alias("owner")
_MEMBERS_OF = (
    sa.select(_OWNER.c.WorkId, Event.c.EnqueueOrdinal, Event.c.ReceiptKey, Event.c.PayloadHash, Event.c.SourceTime)
    .select_from(_OWNER)
    .join(
        Event,
        sa.and_(
            Event.c.PackInstallId == _OWNER.c.PackInstallId,
            Event.c.ProjectionKey == _OWNER.c.ProjectionKey,
            Event.c.EnqueueOrdinal.between(_OWNER.c.InputStartOrdinal, _OWNER.c.LaneOrdinal),
        ),
    )
    .where(_OWNER.c.WorkId.in_(sa.bindparam("work_ids", expanding=True)))
    # MariaDB would read the pack's Events by primary key prefix per generation: one range each.
    .with_hint(_OWNER, "FORCE INDEX (PRIMARY)", dialect_name="mysql")
    .with_hint(Event, "FORCE INDEX (ix_event_source_lane)", dialect_name="mysql")
    .limit(sa.bindparam("limit"))
)


def events_members_of(connection: Connection, work_ids: Sequence[str], limit: int) -> list[DbRow]:
    """Up to ``limit`` members of the generations ``work_ids``, each with its generation's WorkId, in no order.

    Per generation a primary-key read of WorkItem and one ix_event_source_lane range.
    """
    if not work_ids:
        return []
    return list(connection.execute(_MEMBERS_OF, {"work_ids": list(work_ids), "limit": limit}))


def events_members_page(connection: Connection, generation: Any, limit: int) -> list[DbRow]:
    """Up to ``limit`` members of one generation (a WorkItem row), lowest first, with its WorkId."""
    return list(
        connection.execute(
            sa.select(
                sa.literal(generation.WorkId).label("WorkId"),
                Event.c.EnqueueOrdinal,
                Event.c.ReceiptKey,
                Event.c.PayloadHash,
                Event.c.SourceTime,
            )
            .where(
                Event.c.PackInstallId == generation.PackInstallId,
                Event.c.ProjectionKey == generation.ProjectionKey,
                Event.c.EnqueueOrdinal.between(generation.InputStartOrdinal, generation.LaneOrdinal),
            )
            .order_by(Event.c.EnqueueOrdinal)
            .limit(limit)
        )
    )


def events_delete(connection: Connection, pack_install_id: str, ordinals: Sequence[int]) -> int:
    """Delete Events and their EventPayload rows by primary key; return the Events deleted."""
    if not ordinals:
        return 0
    connection.execute(
        sa.delete(EventPayload).where(
            EventPayload.c.PackInstallId == pack_install_id, EventPayload.c.EnqueueOrdinal.in_(ordinals)
        )
    )
    return int(
        connection.execute(
            sa.delete(Event).where(Event.c.PackInstallId == pack_install_id, Event.c.EnqueueOrdinal.in_(ordinals))
        ).rowcount
    )


def receipts_prune(connection: Connection, rows: Sequence[dict[str, Any]]) -> int:
    """Replace receipts by their tombstones (``PrunedReceipt`` rows); return the receipts deleted."""
    if not rows:
        return 0
    connection.execute(sa.insert(PrunedReceipt), list(rows))
    keys = [row["ReceiptKey"] for row in rows]
    return int(
        connection.execute(
            sa.delete(IngressReceipt).where(
                IngressReceipt.c.PackInstallId == rows[0]["PackInstallId"], IngressReceipt.c.ReceiptKey.in_(keys)
            )
        ).rowcount
    )


def work_items_prune(connection: Connection, pruned: Sequence[tuple[Any, dt.datetime | None]], now: dt.datetime) -> int:
    """Replace terminal generations by their ``PrunedWork`` records; return the WorkItems deleted.

    ``pruned``: each generation's row (locked by the caller) and the newest SourceTime of the
    members pruned with it (None: one had none). Only terminal rows are deleted: a count below
    ``len(pruned)`` means one changed, and the caller rolls back.
    """
    if not pruned:
        return 0
    deleted = connection.execute(
        sa.delete(WorkItem).where(
            WorkItem.c.WorkId.in_([row.WorkId for row, _ in pruned]), WorkItem.c.Status.in_(TERMINAL_WORK_STATUSES)
        )
    ).rowcount
    connection.execute(
        sa.insert(PrunedWork),
        [
            {
                "WorkId": row.WorkId,
                "PackInstallId": row.PackInstallId,
                "ProjectionKey": row.ProjectionKey,
                "InputStartOrdinal": row.InputStartOrdinal,
                "LaneOrdinal": row.LaneOrdinal,
                "Status": row.Status,
                "FinishedAt": row.FinishedAt,
                "LeaseToken": row.LeaseToken,
                "LeaseExpiresAt": row.LeaseExpiresAt,
                "PrunedAt": now,
                "SourceTime": source_time,
            }
            for row, source_time in pruned
        ],
    )
    return int(deleted)


def pruned_work_get(connection: Connection, work_id: str) -> DbRow | None:
    """A pruned generation's record by primary key."""
    return connection.execute(sa.select(PrunedWork).where(PrunedWork.c.WorkId == work_id)).first()


def events_member_counts(
    connection: Connection, pack_install_id: str, projection_key: str, start: int, end: int
) -> tuple[int, int]:
    """Members of an identity in ``[start, end]``, and how many of them have a receipt (ix_event_source_lane)."""
    row = connection.execute(
        sa.select(sa.func.count(), sa.func.count(Event.c.ReceiptKey)).where(
            Event.c.PackInstallId == pack_install_id,
            Event.c.ProjectionKey == projection_key,
            Event.c.EnqueueOrdinal.between(start, end),
        )
    ).one()
    return int(row[0]), int(row[1])


def tombstones_expiring(connection: Connection, pack_install_id: str, before: dt.datetime, limit: int) -> list[DbRow]:
    """Up to ``limit`` tombstones whose SourceTime is before ``before``, oldest first (ix_prunedreceipt_source_time)."""
    return list(
        connection.execute(
            sa.select(PrunedReceipt.c.ReceiptKey, PrunedReceipt.c.SourceTime)
            .where(PrunedReceipt.c.PackInstallId == pack_install_id, PrunedReceipt.c.SourceTime < before)
            .order_by(PrunedReceipt.c.SourceTime)
            .limit(limit)
        )
    )


def tombstones_delete(connection: Connection, pack_install_id: str, keys: Sequence[str], before: dt.datetime) -> int:
    """Delete tombstones by primary key, each only while its SourceTime is still before ``before``."""
    if not keys:
        return 0
    return int(
        connection.execute(
            sa.delete(PrunedReceipt).where(
                PrunedReceipt.c.PackInstallId == pack_install_id,
                PrunedReceipt.c.ReceiptKey.in_(keys),
                PrunedReceipt.c.SourceTime < before,
            )
        ).rowcount
    )


def pruned_work_expiring(connection: Connection, pack_install_id: str, before: dt.datetime, limit: int) -> list[str]:
    """Up to ``limit`` pruned-generation records whose SourceTime is before ``before`` (ix_prunedwork_source_time)."""
    return list(
        connection.execute(
            sa.select(PrunedWork.c.WorkId)
            .where(PrunedWork.c.PackInstallId == pack_install_id, PrunedWork.c.SourceTime < before)
            .order_by(PrunedWork.c.SourceTime)
            .limit(limit)
        ).scalars()
    )


def pruned_work_delete(connection: Connection, work_ids: Sequence[str]) -> int:
    """Delete pruned-generation records by primary key."""
    if not work_ids:
        return 0
    return int(connection.execute(sa.delete(PrunedWork).where(PrunedWork.c.WorkId.in_(work_ids))).rowcount)


def policy_record_expiry(
    connection: Connection, pack_install_id: str, *, horizon: dt.datetime | None, expired: int, now: dt.datetime
) -> int:
    """Set LastPrunedAt, count ``expired`` tombstones and raise HorizonSourceTime to ``horizon`` (never lower it).

    Returns the rows updated (1).

    Like every pruning transaction it writes the policy row, so a concurrent policy change
    conflicts with it (decision 123).
    """
    values: dict[str, Any] = {"LastPrunedAt": now, "ExpiredReceipts": RetentionPolicy.c.ExpiredReceipts + expired}
    if horizon is not None:
        current = RetentionPolicy.c.HorizonSourceTime
        values["HorizonSourceTime"] = sa.case((sa.or_(current.is_(None), current < horizon), horizon), else_=current)
    return int(
        connection.execute(
            sa.update(RetentionPolicy).where(RetentionPolicy.c.PackInstallId == pack_install_id).values(**values)
        ).rowcount
    )
