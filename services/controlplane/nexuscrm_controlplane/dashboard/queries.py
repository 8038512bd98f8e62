"""The read-only statements of the operator dashboard and the per-pack metrics collector.

Every statement is bounded: it reads one pack's nonterminal WorkItems (at most two per
projection identity: a claimed generation and its unclaimed successor, because admission
extends an unclaimed one), one index end, a primary key, or at most ``limit`` rows of an
index range. Counts of sets that grow with history (failed work, receipts) stop at ``cap``.
None of them scans Event: Event is read by primary key only. Each says which index serves it.

A generation's rows carry what operators decided of it (``_operated``: held by the order
policy, replayed, skipped), read through the relations of ``nexuscrm_schema.relations`` that
Connectors' claim and GetWork use, so the page says "held" where a claim would refuse it.

These are the one documented cross-owner read
(docs/decisions/101-dashboard-reads-connectors-over-rpc.md): Event, WorkItem and
IngressReceipt belong to Connectors, yet the page's gauges (queue depth, lag, failures,
receipt counts) and the Prometheus collector read them here, directly and read-only, next to
the Controlplane's own PackInstall, fence and protocol rows, through the schema library's
tables. A gauge is a bounded aggregate over many packs that no Connectors RPC returns, and it
must keep answering while Connectors is down. Everything Connectors explains (a WorkId, a
receipt, a receipt listing) the dashboard asks Connectors for (``dashboard.connectors``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row

from nexuscrm_schema import relations
from nexuscrm_schema.hints import probe_exists
from nexuscrm_schema.relations import PREDECESSOR_STATUS
from nexuscrm_schema.tables import (
    ConnectorProjectionProtocol,
    Event,
    IngressReceipt,
    PackInstall,
    SkippedWork,
    WorkItem,
)
from workqueue import WorkStatus
from workqueue.statuses import TERMINAL_WORK_STATUSES

DbRow = Row[*tuple[Any, ...]]


def packs_list(connection: Connection, limit: int) -> list[DbRow]:
    """The newest ``limit`` pack incarnations with their protocol row's columns (NULL: none yet).

    PackInstall has one row per incarnation (a small table); the protocol join is by primary key.
    """
    return list(
        connection.execute(
            sa.select(
                PackInstall,
                ConnectorProjectionProtocol.c.LegacyMaxOrdinal,
                ConnectorProjectionProtocol.c.Origin,
                ConnectorProjectionProtocol.c.AuditReport,
                ConnectorProjectionProtocol.c.CreatedAt.label("ProtocolCreatedAt"),
            )
            .outerjoin(
                ConnectorProjectionProtocol,
                ConnectorProjectionProtocol.c.PackInstallId == PackInstall.c.PackInstallId,
            )
            .order_by(PackInstall.c.CreatedAt.desc(), PackInstall.c.PackInstallId)
            .limit(limit)
        )
    )


def work_status_counts(connection: Connection, pack_install_id: str, statuses: Sequence[str]) -> dict[str, int]:
    """WorkItems of a pack per status in ``statuses`` (nonterminal ones: ix_workitem_claim range)."""
    rows = connection.execute(
        sa.select(WorkItem.c.Status, sa.func.count().label("Count"))
        .where(WorkItem.c.PackInstallId == pack_install_id, WorkItem.c.Status.in_(list(statuses)))
        .group_by(WorkItem.c.Status)
    )
    return {row.Status: int(row.Count) for row in rows}


def work_status_count_capped(connection: Connection, pack_install_id: str, status: str, cap: int) -> int:
    """WorkItems of a pack in ``status``, counted up to ``cap`` (ix_workitem_claim range, LIMIT)."""
    limited = (
        sa.select(WorkItem.c.WorkId)
        .where(WorkItem.c.PackInstallId == pack_install_id, WorkItem.c.Status == status)
        .limit(cap)
        .subquery()
    )
    return int(connection.execute(sa.select(sa.func.count()).select_from(limited)).scalar_one())


def work_oldest_claimable(connection: Connection, pack_install_id: str) -> DbRow | None:
    """The pending generation of a pack that became claimable first (ix_workitem_claim, one index end)."""
    return connection.execute(
        sa.select(WorkItem.c.WorkId, WorkItem.c.ClaimableAt, WorkItem.c.ProjectionKey)
        .where(WorkItem.c.PackInstallId == pack_install_id, WorkItem.c.Status == WorkStatus.PENDING)
        .order_by(WorkItem.c.ClaimableAt, WorkItem.c.WorkId)
        .limit(1)
    ).first()


def work_leases_expired_count(connection: Connection, pack_install_id: str, now: dt.datetime) -> int:
    """Processing generations whose lease has expired and no worker has reclaimed yet.

    A processing row's ClaimableAt is its lease expiry (ix_workitem_claim range).
    """
    return int(
        connection.execute(
            sa.select(sa.func.count())
            .select_from(WorkItem)
            .where(
                WorkItem.c.PackInstallId == pack_install_id,
                WorkItem.c.Status == WorkStatus.PROCESSING,
                WorkItem.c.ClaimableAt <= now,
            )
        ).scalar_one()
    )


def work_oldest_open_input(connection: Connection, pack_install_id: str, statuses: Sequence[str]) -> DbRow | None:
    """The oldest input not yet executed: the Event at the lowest InputStartOrdinal of nonterminal generations.

    Reads the pack's nonterminal generations (ix_workitem_claim range), then one Event by
    primary key. Returns EnqueueOrdinal and CreatedAt, or None when nothing is open.
    """
    lowest = (
        sa.select(sa.func.min(WorkItem.c.InputStartOrdinal))
        .where(WorkItem.c.PackInstallId == pack_install_id, WorkItem.c.Status.in_(list(statuses)))
        .scalar_subquery()
    )
    return connection.execute(
        sa.select(Event.c.EnqueueOrdinal, Event.c.CreatedAt).where(
            Event.c.PackInstallId == pack_install_id, Event.c.EnqueueOrdinal == lowest
        )
    ).first()


def _newest_failed(pack_install_id: str, examined: int) -> sa.Subquery:
    """The WorkIds of the pack's ``examined`` newest finished failures (ix_workitem_retention, backwards)."""
    return (
        sa.select(WorkItem.c.WorkId)
        .where(
            WorkItem.c.PackInstallId == pack_install_id,
            WorkItem.c.Status == WorkStatus.FAILED,
            WorkItem.c.FinishedAt.is_not(None),
        )
        .order_by(WorkItem.c.FinishedAt.desc(), WorkItem.c.WorkId.desc())
        .limit(examined)
        .subquery("NewestFailed")
    )


def work_dead_letters_newest(connection: Connection, pack_install_id: str, examined: int) -> list[DbRow]:
    """The dead letters among the pack's ``examined`` newest failures, newest first.

    A dead letter failed for good and was neither replayed nor skipped (``relations.unresolved``):
    a replayed or skipped failure is not listed. A bounded range of ix_workitem_retention read
    backwards drives the join (STRAIGHT_JOIN on MySQL-protocol servers), then per row one seek
    of ix_workitem_replay_of and one SkippedWork primary-key probe; ordered here, not by the
    statement, so no plan sorts WorkItem.
    """
    newest = _newest_failed(pack_install_id, examined)
    rows = connection.execute(
        sa.select(
            WorkItem.c.WorkId,
            WorkItem.c.InputStartOrdinal,
            WorkItem.c.LaneOrdinal,
            WorkItem.c.Attempt,
            WorkItem.c.LastError,
            WorkItem.c.FinishedAt,
        )
        .select_from(newest.join(WorkItem, WorkItem.c.WorkId == newest.c.WorkId))
        .where(relations.unresolved(WorkItem))
        .prefix_with("STRAIGHT_JOIN", dialect="mysql")
    )
    return sorted(rows, key=lambda row: (row.FinishedAt, row.WorkId), reverse=True)


def work_dead_letter_count(connection: Connection, pack_install_id: str, examined: int) -> int:
    """How many dead letters the pack's ``examined`` newest failures hold (read as ``work_dead_letters_newest``)."""
    newest = _newest_failed(pack_install_id, examined)
    dead = (
        sa.select(sa.func.count())
        .select_from(newest.join(WorkItem, WorkItem.c.WorkId == newest.c.WorkId))
        .where(relations.unresolved(WorkItem))
        .prefix_with("STRAIGHT_JOIN", dialect="mysql")
    )
    return int(connection.execute(dead).scalar_one())


def work_stranded_count_capped(connection: Connection, pack_install_id: str, cap: int) -> int:
    """Blocked native generations of a pack whose predecessor is terminal or missing, counted up to ``cap``.

    Nothing will unblock them but the Connectors liveness sweep (``nexuscrm_stranded_generations_healed_total``
    counts what it healed); a nonzero count that persists means the sweep is not running.
    Reads the pack's (pack, 'blocked') range of ix_workitem_claim (at most one blocked
    generation per identity: admission extends an unclaimed one) with one seek of
    ix_workitem_projection_order per row for its predecessor.
    """
    predecessor = PREDECESSOR_STATUS
    terminal = [status.value for status in TERMINAL_WORK_STATUSES]
    limited = (
        sa.select(WorkItem.c.WorkId)
        .where(
            WorkItem.c.PackInstallId == pack_install_id,
            WorkItem.c.Status == WorkStatus.BLOCKED,
            WorkItem.c.InputStartOrdinal.is_not(None),
            sa.or_(predecessor.is_(None), predecessor.in_(terminal)),
        )
        .limit(cap)
        .subquery()
    )
    return int(connection.execute(sa.select(sa.func.count()).select_from(limited)).scalar_one())


def receipt_count_capped(connection: Connection, pack_install_id: str, state: str, cap: int) -> int:
    """Receipts of a pack in ``state``, counted up to ``cap`` (ix_ingressreceipt_state range, LIMIT)."""
    limited = (
        sa.select(IngressReceipt.c.ReceiptKey)
        .where(IngressReceipt.c.State == state, IngressReceipt.c.PackInstallId == pack_install_id)
        .limit(cap)
        .subquery()
    )
    return int(connection.execute(sa.select(sa.func.count()).select_from(limited)).scalar_one())


def work_identities_page(connection: Connection, pack_install_id: str, after: str, limit: int) -> list[str]:
    """The next ``limit`` projection keys with generations after ``after``, in key order.

    A keyset walk of ix_workitem_projection_order: the index is read in key order and the
    walk stops after ``limit`` distinct keys.
    """
    return list(
        connection.execute(
            sa.select(WorkItem.c.ProjectionKey)
            .where(WorkItem.c.PackInstallId == pack_install_id, WorkItem.c.ProjectionKey > after)
            .group_by(WorkItem.c.ProjectionKey)
            .order_by(WorkItem.c.ProjectionKey)
            .limit(limit)
        ).scalars()
    )


_REPLAY = WorkItem.alias("Replay")  # a replay of the outer row (ix_workitem_replay_of)


def _operated() -> list[sa.ColumnElement[Any]]:
    """What operators decided of the outer WorkItem row, joined to its SkippedWork row (if any).

    ``HeldBehind``: for a pending generation the "block" policy holds, the WorkId it waits for
    (``relations.held_behind``); ``Replayed``: a failed one has a replay (one seek of
    ix_workitem_replay_of); ``SkippedBy``, ``SkipReason``, ``SkippedAt``: its skip.
    """
    held = sa.and_(
        WorkItem.c.Status == WorkStatus.PENDING,
        WorkItem.c.InputStartOrdinal.is_not(None),
        relations.effective_block(WorkItem.c.PackInstallId, WorkItem.c.WorkType),
    )
    replayed = probe_exists(sa.select(_REPLAY.c.WorkId).where(_REPLAY.c.ReplayOfWorkId == WorkItem.c.WorkId))
    return [
        sa.case((held, relations.held_behind()), else_=None).label("HeldBehind"),
        sa.case((sa.and_(WorkItem.c.Status == WorkStatus.FAILED, replayed), 1), else_=0).label("Replayed"),
        SkippedWork.c.SkippedBy,
        SkippedWork.c.Reason.label("SkipReason"),
        SkippedWork.c.SkippedAt,
    ]


_WITH_SKIP = WorkItem.outerjoin(SkippedWork, SkippedWork.c.WorkId == WorkItem.c.WorkId)


def identity_generations_newest(
    connection: Connection, pack_install_id: str, projection_key: str, limit: int
) -> list[DbRow]:
    """The newest ``limit`` generations of one identity, newest first, with what operators decided of each.

    ix_workitem_projection_order read backwards; per row the probes of ``_operated`` and a
    SkippedWork primary-key lookup.
    """
    return list(
        connection.execute(
            sa.select(
                WorkItem.c.WorkId,
                WorkItem.c.InputStartOrdinal,
                WorkItem.c.LaneOrdinal,
                WorkItem.c.Status,
                WorkItem.c.Attempt,
                WorkItem.c.MaxAttempts,
                WorkItem.c.ReplayOfWorkId,
                *_operated(),
            )
            .select_from(_WITH_SKIP)
            .where(WorkItem.c.PackInstallId == pack_install_id, WorkItem.c.ProjectionKey == projection_key)
            .order_by(WorkItem.c.LaneOrdinal.desc())
            .limit(limit)
        )
    )


def work_operated(connection: Connection, work_id: str) -> DbRow | None:
    """What operators decided of one generation (``_operated``'s columns); None for an unknown WorkId (primary key)."""
    return connection.execute(
        sa.select(*_operated()).select_from(_WITH_SKIP).where(WorkItem.c.WorkId == work_id)
    ).first()
