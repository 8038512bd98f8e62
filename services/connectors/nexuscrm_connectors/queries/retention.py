"""The statements of retention (``nexuscrm_connectors.operating.retention``): policy, candidates, pruning, tombstones.

Every statement is bounded: candidates come from ``ix_workitem_retention`` by keyset, members
from ``ix_event_source_lane`` within one generation's range and a limit, everything else by
primary key (decision 123).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from nexuscrm_connectors.queries import DbRow
from nexuscrm_connectors.queries import order_policy as order_policy_sql
from nexuscrm_connectors.queries.operator_reads import after_keyset
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


def policy_get(connection: Connection, pack_install_id: str) -> DbRow | None:
    """The pack's RetentionPolicy row by primary key."""
    return connection.execute(
        sa.select(RetentionPolicy).where(RetentionPolicy.c.PackInstallId == pack_install_id)
    ).first()


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


def work_items_newer(
    connection: Connection, pack_install_id: str, projection_key: str, lane_ordinal: int, limit: int
) -> int:
    """How many generations of the identity end above ``lane_ordinal``, counting up to ``limit`` (projection order)."""
    newer = (
        sa.select(WorkItem.c.WorkId)
        .where(
            WorkItem.c.PackInstallId == pack_install_id,
            WorkItem.c.ProjectionKey == projection_key,
            WorkItem.c.LaneOrdinal > lane_ordinal,
        )
        .limit(limit)
        .subquery()
    )
    return int(connection.execute(sa.select(sa.func.count()).select_from(newer)).scalar_one())


_HOLDS_ORDER = sa.select(WorkItem.c.WorkId).where(
    WorkItem.c.WorkId == sa.bindparam("work_id"),
    WorkItem.c.Status == WorkStatus.FAILED,
    order_policy_sql.unresolved(WorkItem),
    order_policy_sql.effective_block(WorkItem.c.PackInstallId, WorkItem.c.WorkType),
)


def work_item_holds_order(connection: Connection, work_id: str) -> bool:
    """Whether ``work_id`` is a dead letter whose work type (or pack) is under "block".

    Pruning it would release the successor it holds: one primary-key read of WorkItem, the
    replay and skip probes, and the two policy probes.
    """
    return connection.execute(_HOLDS_ORDER, {"work_id": work_id}).first() is not None


def work_item_status(connection: Connection, work_id: str) -> str | None:
    """One WorkItem's status by primary key."""
    return connection.execute(sa.select(WorkItem.c.Status).where(WorkItem.c.WorkId == work_id)).scalar_one_or_none()


def events_members_page(
    connection: Connection, pack_install_id: str, projection_key: str, start: int, end: int, limit: int
) -> list[DbRow]:
    """Up to ``limit`` members of an identity in ``[start, end]``, lowest first (ix_event_source_lane)."""
    return list(
        connection.execute(
            sa.select(Event.c.EnqueueOrdinal, Event.c.ReceiptKey, Event.c.PayloadHash, Event.c.SourceTime)
            .where(
                Event.c.PackInstallId == pack_install_id,
                Event.c.ProjectionKey == projection_key,
                Event.c.EnqueueOrdinal.between(start, end),
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
    conflicts with it.
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
