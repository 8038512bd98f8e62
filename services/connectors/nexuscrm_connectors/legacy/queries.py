"""The old-protocol (v0) runtime's statements (``legacy.runtime``): WorkItem-only work, no ranges."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from nexuscrm_connectors.queries import DbRow
from nexuscrm_connectors.queries.work_items import Instant
from nexuscrm_schema.tables import PackInstall, WorkItem
from workqueue import WorkStatus
from workqueue.statuses import NONTERMINAL_WORK_STATUSES

LEGACY_WORK = WorkItem.c.InputStartOrdinal.is_(None)
UNCLAIMED = (WorkStatus.PENDING, WorkStatus.BLOCKED)


def legacy_handoff_get(connection: Connection, pack_install_id: str) -> dt.datetime | None:
    """The pack's WorkItem-only handoff time, or None (primary key read)."""
    return connection.execute(
        sa.select(PackInstall.c.WorkItemHandoffAt).where(PackInstall.c.PackInstallId == pack_install_id)
    ).scalar()


def legacy_handoff_set(connection: Connection, pack_install_id: str, now: dt.datetime) -> int:
    """Record the handoff once; an existing record is kept (row count 0)."""
    return connection.execute(
        sa.update(PackInstall)
        .where(PackInstall.c.PackInstallId == pack_install_id, PackInstall.c.WorkItemHandoffAt.is_(None))
        .values(WorkItemHandoffAt=now)
    ).rowcount


def legacy_work_unclaimed(connection: Connection, pack_install_id: str, projection_key: str) -> DbRow | None:
    """An unclaimed nonterminal old-protocol WorkItem of an identity, locked (ix_workitem_projection_order)."""
    return connection.execute(
        sa.select(WorkItem.c.WorkId)
        .where(
            WorkItem.c.PackInstallId == pack_install_id,
            WorkItem.c.ProjectionKey == projection_key,
            WorkItem.c.Status.in_(UNCLAIMED),
            LEGACY_WORK,
        )
        .limit(1)
        .with_for_update()
    ).first()


def legacy_work_live(connection: Connection, pack_install_id: str, projection_key: str, below: int | None) -> bool:
    """True when an identity has nonterminal old-protocol work (below ordinal ``below``, if given)."""
    statement = sa.select(WorkItem.c.WorkId).where(
        WorkItem.c.PackInstallId == pack_install_id,
        WorkItem.c.ProjectionKey == projection_key,
        WorkItem.c.Status.in_(NONTERMINAL_WORK_STATUSES),
        LEGACY_WORK,
    )
    if below is not None:
        statement = statement.where(WorkItem.c.LaneOrdinal < below)
    return connection.execute(statement.limit(1)).first() is not None


def legacy_work_claimable(connection: Connection, pack_install_id: str, now: Instant, limit: int) -> list[DbRow]:
    """Old-protocol claim candidates of a pack: pending, due retries, expired leases (ix_workitem_claim)."""
    return list(
        connection.execute(
            sa.select(WorkItem.c.WorkId, WorkItem.c.Status, WorkItem.c.ClaimableAt, WorkItem.c.LeaseToken)
            .where(
                WorkItem.c.PackInstallId == pack_install_id,
                WorkItem.c.Status.in_([WorkStatus.PENDING, WorkStatus.RETRY, WorkStatus.PROCESSING]),
                WorkItem.c.ClaimableAt <= now,
                LEGACY_WORK,
            )
            .order_by(WorkItem.c.ClaimableAt)
            .limit(limit)
        )
    )


def legacy_work_previous_lane(
    connection: Connection, pack_install_id: str, projection_key: str, lane_ordinal: int
) -> int | None:
    """The LaneOrdinal of the previous retained old-protocol WorkItem of an identity (ix_workitem_projection_order)."""
    value = connection.execute(
        sa.select(sa.func.max(WorkItem.c.LaneOrdinal)).where(
            WorkItem.c.PackInstallId == pack_install_id,
            WorkItem.c.ProjectionKey == projection_key,
            WorkItem.c.LaneOrdinal < lane_ordinal,
            LEGACY_WORK,
        )
    ).scalar()
    return None if value is None else int(value)
