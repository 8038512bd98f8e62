"""Operator reads: namespaces for authorization, receipt lists, queue state, an identity's or pack's generations.

The skips shown with generations are read here too (``skipped_work_of``); a skip is written by
``queries.order_policy``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from nexuscrm_connectors.queries import DbRow
from nexuscrm_connectors.queries.work_items import WorkRow
from nexuscrm_schema.tables import (
    IngressReceipt,
    PackInstall,
    PrunedWork,
    SkippedWork,
    WorkItem,
)
from workqueue import ReceiptState, WorkStatus


def pack_namespace(connection: Connection, pack_install_id: str) -> str | None:
    """The namespace of the pack, None when no such pack exists."""
    statement = sa.select(PackInstall.c.Namespace).where(PackInstall.c.PackInstallId == pack_install_id)
    return connection.execute(statement).scalar_one_or_none()


def work_namespace(connection: Connection, work_id: str) -> str | None:
    """The namespace of the WorkItem's pack (or of its pack when it was pruned), None when the WorkId is unknown."""
    return work_namespaces(connection, [work_id]).get(work_id)


def work_namespaces(connection: Connection, work_ids: Collection[str]) -> dict[str, str]:
    """``work_namespace`` of many WorkIds in one statement: WorkId -> namespace, unknown ones left out."""
    statement = sa.union_all(
        *(
            sa.select(table.c.WorkId, PackInstall.c.Namespace)
            .join(table, table.c.PackInstallId == PackInstall.c.PackInstallId)
            .where(table.c.WorkId.in_(list(work_ids)))
            for table in (WorkItem, PrunedWork)
        )
    )
    return {row.WorkId: row.Namespace for row in connection.execute(statement)}


def packs_list(connection: Connection) -> list[str]:
    """Every PackInstallId (primary key order)."""
    return list(
        connection.execute(sa.select(PackInstall.c.PackInstallId).order_by(PackInstall.c.PackInstallId)).scalars()
    )


def receipts_in_state(
    connection: Connection,
    state: ReceiptState,
    pack_install_id: str | None,
    after: tuple[str, dt.datetime, str] | None,
    limit: int,
) -> list[DbRow]:
    """Receipts in ``state`` (of one pack, or all), in (pack, ReceivedAt, key) order after ``after``.

    A range of ix_ingressreceipt_state read in index order up to ``limit`` rows: InnoDB's
    entries end with the primary key, so the order needs no sort (SQLite's end with the rowid:
    it sorts the receipts of one batch, which share ReceivedAt). Keyset pagination by the
    last row's (pack, time, key). MariaDB needs three nudges: the index is forced (for one
    pack whose receipts are mostly in ``state`` it prefers the primary key and a sort of all
    of them), the constant pack column stays out of the order (it sorts when it is there),
    and the keyset is spelled out (it does not seek on a row-value comparison).
    """
    statement = (
        sa.select(
            IngressReceipt.c.PackInstallId,
            IngressReceipt.c.ReceiptKey,
            IngressReceipt.c.ProjectionKey,
            IngressReceipt.c.State,
            IngressReceipt.c.ReceivedAt,
        )
        .with_hint(IngressReceipt, "FORCE INDEX (ix_ingressreceipt_state)", dialect_name="mysql")
        .where(IngressReceipt.c.State == state)
    )
    order = (IngressReceipt.c.PackInstallId, IngressReceipt.c.ReceivedAt, IngressReceipt.c.ReceiptKey)
    constant = 0  # leading order columns fixed by the filter
    if pack_install_id:
        statement = statement.where(IngressReceipt.c.PackInstallId == pack_install_id)
        constant = 1
    if after is not None:
        statement = statement.where(after_keyset(order[constant:], after[constant:]))
    return list(connection.execute(statement.order_by(*order[constant:]).limit(limit)))


def after_keyset(
    columns: Sequence[sa.ColumnElement[Any]], values: Sequence[Any], *, descending: bool = False
) -> sa.ColumnElement[bool]:
    """``(columns) > (values)`` in row order, as an OR of index seeks (c1 > v1, c1 = v1 AND c2 > v2, ...).

    ``descending``: ``(columns) < (values)``, the position after ``values`` in descending order.
    """
    return sa.or_(
        *(
            sa.and_(
                *(column == value for column, value in zip(columns[:i], values[:i], strict=True)),
                columns[i] < values[i] if descending else columns[i] > values[i],
            )
            for i in range(len(columns))
        )
    )


WAITING_STATUSES = (WorkStatus.PENDING, WorkStatus.BLOCKED, WorkStatus.RETRY)


QUEUED_STATUSES = (*WAITING_STATUSES, WorkStatus.PROCESSING)


def work_queue_counts(connection: Connection, pack_install_id: str) -> dict[str, int]:
    """Native (ranged) nonterminal generations of a pack per status.

    A range of ix_workitem_claim over the pack's nonterminal statuses: at most two rows per
    identity (a claimed generation and its unclaimed successor), never the terminal history.
    """
    rows = connection.execute(
        sa.select(WorkItem.c.Status, sa.func.count().label("Count"))
        .where(
            WorkItem.c.PackInstallId == pack_install_id,
            WorkItem.c.Status.in_(QUEUED_STATUSES),
            WorkItem.c.InputStartOrdinal.is_not(None),
        )
        .group_by(WorkItem.c.Status)
    )
    return {row.Status: int(row.Count) for row in rows}


def work_oldest_waiting(connection: Connection, pack_install_id: str) -> DbRow | None:
    """The waiting native generation with the pack's lowest InputStartOrdinal: its oldest waiting input.

    Ordinals increase in commit order, so that generation waits longest. Two ranges of
    ix_workitem_claim over the waiting statuses (the MIN, then the row with it), no sort.
    """
    lowest = (
        sa.select(sa.func.min(WorkItem.c.InputStartOrdinal))
        .where(WorkItem.c.PackInstallId == pack_install_id, WorkItem.c.Status.in_(WAITING_STATUSES))
        .scalar_subquery()
    )
    return connection.execute(
        sa.select(WorkItem.c.WorkId, WorkItem.c.CreatedAt)
        .where(
            WorkItem.c.PackInstallId == pack_install_id,
            WorkItem.c.Status.in_(WAITING_STATUSES),
            WorkItem.c.InputStartOrdinal == lowest,
        )
        .limit(1)
    ).first()


def receipt_count_capped(connection: Connection, pack_install_id: str, state: ReceiptState, cap: int) -> int:
    """Receipts of a pack in ``state``, counted up to ``cap`` (ix_ingressreceipt_state range, LIMIT)."""
    limited = (
        sa.select(IngressReceipt.c.ReceiptKey)
        .where(IngressReceipt.c.State == state, IngressReceipt.c.PackInstallId == pack_install_id)
        .limit(cap)
        .subquery()
    )
    return int(connection.execute(sa.select(sa.func.count()).select_from(limited)).scalar_one())


def work_items_of_identity(
    connection: Connection, pack_install_id: str, projection_key: str, below: int | None, limit: int
) -> list[WorkRow]:
    """Generations of one identity with LaneOrdinal below ``below``, newest (highest LaneOrdinal) first.

    ix_workitem_projection_order read backwards, up to ``limit`` rows: keyset pagination by the
    previous page's last LaneOrdinal, which is unique within an identity (each generation's is
    its own selected Event; old-protocol work has one WorkItem per selected Event).
    """
    statement = sa.select(WorkItem).where(
        WorkItem.c.PackInstallId == pack_install_id, WorkItem.c.ProjectionKey == projection_key
    )
    if below is not None:
        statement = statement.where(WorkItem.c.LaneOrdinal < below)
    return [WorkRow(*row) for row in connection.execute(statement.order_by(WorkItem.c.LaneOrdinal.desc()).limit(limit))]


def work_items_of_pack(
    connection: Connection, pack_install_id: str, before: tuple[str, int] | None, limit: int
) -> list[WorkRow]:
    """Generations of a pack, identity after identity (ProjectionKey descending), newest first in each.

    ix_workitem_projection_order read backwards from the position ``before`` (the previous
    page's last ProjectionKey and LaneOrdinal), up to ``limit`` rows; the keyset is spelled out
    as index seeks (``after_keyset``).
    """
    order = (WorkItem.c.ProjectionKey, WorkItem.c.LaneOrdinal)
    statement = sa.select(WorkItem).where(WorkItem.c.PackInstallId == pack_install_id)
    if before is not None:
        statement = statement.where(after_keyset(order, before, descending=True))
    rows = connection.execute(statement.order_by(*(column.desc() for column in order)).limit(limit))
    return [WorkRow(*row) for row in rows]


_SKIPPED_WORK_OF = sa.select(SkippedWork).where(SkippedWork.c.WorkId.in_(sa.bindparam("work_ids", expanding=True)))


def skipped_work_of(connection: Connection, work_ids: Sequence[str]) -> list[DbRow]:
    """The SkippedWork rows of those of ``work_ids`` an operator skipped (primary-key probes)."""
    return list(connection.execute(_SKIPPED_WORK_OF, {"work_ids": list(work_ids)}))
