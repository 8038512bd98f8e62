"""Every statement Controlplane runs: pack lifecycle, protocol rows, fences, drain and audit reads.

Builders are named noun + verb and take the caller's connection (and so its transaction).
Each says which index serves it. State changes are conditional on the state they expect and
return the affected row count for the caller to check. The protocol table has an insert and
reads, and deliberately no update or delete: a written cutoff is immutable.
"""

from __future__ import annotations

import datetime as dt
import heapq
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, sqlite
from sqlalchemy.engine import Connection, Row

from nexuscrm_schema.hints import probe_exists
from nexuscrm_schema.tables import (
    NAMESPACE_SCOPE,
    AdmissionFence,
    AdmissionFenceOverride,
    ConnectorProjectionProtocol,
    Event,
    NamespaceControl,
    PackInstall,
    WorkItem,
)
from workqueue import WorkStatus
from workqueue.statuses import NONTERMINAL_WORK_STATUSES, TERMINAL_WORK_STATUSES

DbRow = Row[*tuple[Any, ...]]  # a result row of any shape


# Old-protocol work: coverage was inferred, so no lower bound was persisted.
LEGACY_WORK = WorkItem.c.InputStartOrdinal.is_(None)


def exactly(column: sa.ColumnElement[Any], values: Sequence[str]) -> sa.ColumnElement[bool]:
    """True only when ``column`` holds one of ``values`` byte for byte; never NULL.

    ``IN`` alone is not exact: MySQL and TiDB collations such as utf8mb4_bin are PAD SPACE
    (``'completed '`` equals ``'completed'``), a ``_ci`` collation ignores case, and SQLite
    keeps a blob beside text in a text column. So the value must also compare equal as text
    (which refuses the blob) and have the same bytes (HEX, which refuses padding and case).
    NULL is false, not unknown, so ``~exactly(...)`` is true for NULL: a gate built on it
    fails closed.
    """
    return sa.and_(
        column.is_not(None),
        column.in_(list(values)),
        sa.func.hex(column).in_([value.encode().hex().upper() for value in values]),
    )


# Old work is live (it blocks the drain) unless its status is exactly a terminal one: an
# unknown, misspelt, padded, empty or NULL status is live, never assumed finished.
LIVE_WORK = ~exactly(WorkItem.c.Status, sorted(TERMINAL_WORK_STATUSES))
KNOWN_WORK_STATUSES = [status.value for status in WorkStatus]


# --- PackInstall -------------------------------------------------------------------------


def pack_namespace(connection: Connection, pack_install_id: str) -> str | None:
    """The namespace of the pack, None when no such pack exists."""
    statement = sa.select(PackInstall.c.Namespace).where(PackInstall.c.PackInstallId == pack_install_id)
    return connection.execute(statement).scalar_one_or_none()


def fence_namespace(connection: Connection, fence_id: str) -> str | None:
    """The namespace the fence guards, None when no such fence exists."""
    statement = sa.select(AdmissionFence.c.Namespace).where(AdmissionFence.c.FenceId == fence_id)
    return connection.execute(statement).scalar_one_or_none()


def pack_insert(connection: Connection, row: dict[str, Any]) -> None:
    """Insert a new pack incarnation (primary key: a fresh id, so no conflict is expected)."""
    connection.execute(sa.insert(PackInstall).values(**row))


# What ``PackInstallRow`` reads: named, so a pre-upgrade database (no ControlVersion) can be
# read and refused with findings instead of failing on a missing column.
_PACK_COLUMNS = tuple(PackInstall.c[name] for name in ("PackInstallId", "Namespace", "PackName", "PackVersion"))
_PACK_COLUMNS += (PackInstall.c.LastOrdinal, PackInstall.c.WorkItemHandoffAt, PackInstall.c.CreatedAt)


def packs_page(connection: Connection, namespace: str, after: str, limit: int) -> list[DbRow]:
    """Up to ``limit`` incarnations after pack id ``after``, by id, each with its protocol origin (or None).

    Of one namespace (ix_packinstall_namespace, whose entries end with the primary key) or,
    with ``namespace`` empty, of all (the primary key); the protocol row by its primary key.
    """
    statement = (
        sa.select(*_PACK_COLUMNS, ConnectorProjectionProtocol.c.Origin)
        .select_from(
            PackInstall.outerjoin(
                ConnectorProjectionProtocol,
                ConnectorProjectionProtocol.c.PackInstallId == PackInstall.c.PackInstallId,
            )
        )
        .where(PackInstall.c.PackInstallId > after)
        .order_by(PackInstall.c.PackInstallId)
        .limit(limit)
    )
    if namespace:
        statement = statement.where(PackInstall.c.Namespace == namespace)
    return list(connection.execute(statement))


def pack_get(connection: Connection, pack_install_id: str, *, lock: bool = False) -> DbRow | None:
    """One PackInstall row by primary key; ``lock`` takes its row lock (the pack lock)."""
    statement = sa.select(*_PACK_COLUMNS).where(PackInstall.c.PackInstallId == pack_install_id)
    if lock:
        statement = statement.with_for_update()
    return connection.execute(statement).first()


def packs_by_name(connection: Connection, namespace: str, pack_name: str, pack_version: str, limit: int) -> list[DbRow]:
    """Up to ``limit`` incarnations of a pack by namespace, name and version (ix_packinstall_namespace range).

    Unordered: the caller sorts the few rows (a reinstall is rare), so no statement sorts.
    """
    return list(
        connection.execute(
            sa.select(*_PACK_COLUMNS)
            .where(
                PackInstall.c.Namespace == namespace,
                PackInstall.c.PackName == pack_name,
                PackInstall.c.PackVersion == pack_version,
            )
            .limit(limit)
        )
    )


def packs_control_version_bump(
    connection: Connection, *, namespace: str | None = None, pack_install_ids: Sequence[str] | None = None
) -> int:
    """Bump ``PackInstall.ControlVersion`` of a namespace's packs, or of ``pack_install_ids``.

    Every Controlplane change that an admission decides from (a fence, an override, a
    protocol row) runs this in its own transaction: a real change of each pack row it
    covers, the row every admission that allocates ordinals writes too (LastOrdinal). On a
    multi-primary engine the two then conflict at commit, so an admission cannot commit on a
    fence or protocol read that a committed change has made stale (decision 107); on one
    server the row locks order them. Primary-key lookups for named packs,
    ix_packinstall_namespace for a namespace. Returns the row count.
    """
    if (namespace is None) == (pack_install_ids is None):
        raise ValueError("name a namespace or packs, not both")
    if pack_install_ids is not None:
        if not pack_install_ids:
            return 0
        statement = sa.update(PackInstall).where(PackInstall.c.PackInstallId.in_(list(pack_install_ids)))
    else:
        statement = sa.update(PackInstall).where(PackInstall.c.Namespace == namespace)
    return connection.execute(
        statement.values(ControlVersion=sa.func.coalesce(PackInstall.c.ControlVersion, 0) + 1)
    ).rowcount


def namespace_control_bump(connection: Connection, namespace: str) -> None:
    """Insert the namespace's NamespaceControl row, or bump its ControlVersion (one upsert).

    Installing a pack and arming or disarming a namespace fence run this, so the two write a
    common row: on a multi-primary engine they conflict at commit, and the retried fence
    bumps the new pack it could not see (decision 107, amendment); on one server the row lock
    orders them. Run it before ``packs_control_version_bump`` of the namespace, so the
    bump's statement reads every pack committed before the lock was granted. Primary key.
    """
    values = {"Namespace": namespace, "ControlVersion": 1}
    bumped = NamespaceControl.c.ControlVersion + 1
    if connection.dialect.name == "sqlite":
        statement: sa.Executable = (
            sqlite.insert(NamespaceControl)
            .values(values)
            .on_conflict_do_update(index_elements=[NamespaceControl.c.Namespace], set_={"ControlVersion": bumped})
        )
    else:
        statement = mysql.insert(NamespaceControl).values(values).on_duplicate_key_update(ControlVersion=bumped)
    connection.execute(statement)


def pack_history_exists(connection: Connection, pack_install_id: str) -> bool:
    """True when the pack has any Event or WorkItem (ix_event_source_lane, ix_workitem_claim prefixes)."""
    event = sa.select(Event.c.EnqueueOrdinal).where(Event.c.PackInstallId == pack_install_id).limit(1)
    work = sa.select(WorkItem.c.WorkId).where(WorkItem.c.PackInstallId == pack_install_id).limit(1)
    return connection.execute(event).first() is not None or connection.execute(work).first() is not None


# --- _System_ConnectorProjectionProtocol ---------------------------------------------------


def protocol_get(connection: Connection, pack_install_id: str) -> DbRow | None:
    """The pack's protocol row by primary key, or None."""
    return connection.execute(
        sa.select(ConnectorProjectionProtocol).where(ConnectorProjectionProtocol.c.PackInstallId == pack_install_id)
    ).first()


def protocol_insert(connection: Connection, row: dict[str, Any]) -> None:
    """Insert the pack's one protocol row; a concurrent insert raises IntegrityError (primary key)."""
    connection.execute(sa.insert(ConnectorProjectionProtocol).values(**row))


# --- AdmissionFence and AdmissionFenceOverride ---------------------------------------------


def fence_insert(connection: Connection, row: dict[str, Any]) -> None:
    """Insert a fence (primary key: a fresh id)."""
    connection.execute(sa.insert(AdmissionFence).values(**row))


def fence_get(connection: Connection, fence_id: str, *, lock: bool = False) -> DbRow | None:
    """One fence by primary key; ``lock`` serializes override changes with the cutover gate."""
    statement = sa.select(AdmissionFence).where(AdmissionFence.c.FenceId == fence_id)
    if lock:
        statement = statement.with_for_update()
    return connection.execute(statement).first()


def fence_ids_with_prefix(connection: Connection, prefix: str, limit: int) -> list[str]:
    """Up to ``limit`` fence ids that start with ``prefix`` (a range of the primary key)."""
    statement = (
        sa.select(AdmissionFence.c.FenceId)
        .where(AdmissionFence.c.FenceId.startswith(prefix, autoescape=True))
        .order_by(AdmissionFence.c.FenceId)
        .limit(limit)
    )
    return list(connection.execute(statement).scalars())


def fence_delete(connection: Connection, fence_id: str) -> int:
    """Delete one fence; its overrides go with it (the caller deletes them first)."""
    return connection.execute(sa.delete(AdmissionFence).where(AdmissionFence.c.FenceId == fence_id)).rowcount


def fences_list(connection: Connection, namespace: str) -> list[DbRow]:
    """The fences of a namespace, oldest first (ix_admissionfence_scope prefix)."""
    return list(
        connection.execute(
            sa.select(AdmissionFence)
            .where(AdmissionFence.c.Namespace == namespace)
            .order_by(AdmissionFence.c.CreatedAt, AdmissionFence.c.FenceId)
        )
    )


def fences_namespace_lock(connection: Connection, namespace: str) -> list[DbRow]:
    """Lock and return the namespace-wide (``*``) fences: the cutover's namespace lock.

    DisarmFence and override changes lock the same rows, so they wait for a running cutover
    (ix_admissionfence_scope).
    """
    return list(
        connection.execute(
            sa.select(AdmissionFence)
            .where(AdmissionFence.c.Namespace == namespace, AdmissionFence.c.Scope == NAMESPACE_SCOPE)
            .order_by(AdmissionFence.c.FenceId)
            .with_for_update()
        )
    )


def overrides_list(connection: Connection, fence_ids: list[str]) -> list[DbRow]:
    """Every override of ``fence_ids``, expired ones included (primary key prefix)."""
    if not fence_ids:
        return []
    return list(
        connection.execute(
            sa.select(AdmissionFenceOverride)
            .where(AdmissionFenceOverride.c.FenceId.in_(fence_ids))
            .order_by(AdmissionFenceOverride.c.FenceId, AdmissionFenceOverride.c.PackInstallId)
        )
    )


def override_delete(connection: Connection, fence_id: str, pack_install_id: str | None = None) -> int:
    """Delete one override of a fence, or all of them when ``pack_install_id`` is None."""
    statement = sa.delete(AdmissionFenceOverride).where(AdmissionFenceOverride.c.FenceId == fence_id)
    if pack_install_id is not None:
        statement = statement.where(AdmissionFenceOverride.c.PackInstallId == pack_install_id)
    return connection.execute(statement).rowcount


def override_insert(connection: Connection, row: dict[str, Any]) -> None:
    """Insert one override (primary key: fence, pack)."""
    connection.execute(sa.insert(AdmissionFenceOverride).values(**row))


# --- Drain: old-protocol work that is not terminal -----------------------------------------


def legacy_work_counts(connection: Connection, pack_install_id: str) -> dict[str, int]:
    """Old-protocol WorkItems of a pack per known nonterminal status, matched exactly (ix_workitem_claim).

    Work in a status that is not exactly a known one is counted by ``legacy_work_unknown``.
    """
    rows = connection.execute(
        sa.select(WorkItem.c.Status, sa.func.count().label("Count"))
        .where(
            WorkItem.c.PackInstallId == pack_install_id,
            exactly(WorkItem.c.Status, NONTERMINAL_WORK_STATUSES),
            LEGACY_WORK,
        )
        .group_by(WorkItem.c.Status)
    )
    return {row.Status: int(row.Count) for row in rows}


def legacy_work_unknown(connection: Connection, pack_install_id: str, limit: int) -> tuple[int, list[DbRow]]:
    """Count and sample (WorkId, Status) old-protocol work whose status is not exactly a known one.

    Such work is live: nothing proves it finished. ix_workitem_claim prefix (the pack's range);
    the count reads it whole, the sample stops after ``limit`` rows in the index's order.
    """
    unknown = (
        WorkItem.c.PackInstallId == pack_install_id,
        ~exactly(WorkItem.c.Status, KNOWN_WORK_STATUSES),
        LEGACY_WORK,
    )
    count = int(connection.execute(sa.select(sa.func.count()).select_from(WorkItem).where(*unknown)).scalar_one())
    if not count:
        return 0, []
    order = (WorkItem.c.Status, WorkItem.c.ClaimableAt, WorkItem.c.WorkId)
    sample = connection.execute(
        sa.select(WorkItem.c.WorkId, WorkItem.c.Status).where(*unknown).order_by(*order).limit(limit)
    )
    return count, list(sample)


def legacy_work_live_sample(connection: Connection, pack_install_id: str, limit: int) -> list[str]:
    """Up to ``limit`` WorkIds of live old-protocol work of a pack (``LIVE_WORK``), by status and ClaimableAt.

    The order is ix_workitem_claim's own, so the read stops after ``limit`` rows. WorkId breaks
    ties: free on InnoDB and TiDB, whose index entries end with the primary key; on SQLite,
    whose entries end with the rowid, the rows that tie on ClaimableAt are sorted (every
    blocked row, ClaimableAt being NULL: bounded by the undrained work, not by history).
    """
    return list(
        connection.execute(
            sa.select(WorkItem.c.WorkId)
            .where(WorkItem.c.PackInstallId == pack_install_id, LIVE_WORK, LEGACY_WORK)
            .order_by(WorkItem.c.Status, WorkItem.c.ClaimableAt, WorkItem.c.WorkId)
            .limit(limit)
        ).scalars()
    )


def legacy_retry_waits(connection: Connection, pack_install_id: str, now: dt.datetime, limit: int) -> list[DbRow]:
    """Old-protocol retries whose next attempt is still in the future, soonest first (ix_workitem_claim)."""
    return list(
        connection.execute(
            sa.select(WorkItem.c.WorkId, WorkItem.c.ClaimableAt)
            .where(
                WorkItem.c.PackInstallId == pack_install_id,
                WorkItem.c.Status == WorkStatus.RETRY,
                WorkItem.c.ClaimableAt > now,
                LEGACY_WORK,
            )
            .order_by(WorkItem.c.ClaimableAt, WorkItem.c.WorkId)
            .limit(limit)
        )
    )


def legacy_retry_wait_count(connection: Connection, pack_install_id: str, now: dt.datetime) -> int:
    """How many old-protocol retries wait for a future attempt time (ix_workitem_claim)."""
    return int(
        connection.execute(
            sa.select(sa.func.count())
            .select_from(WorkItem)
            .where(
                WorkItem.c.PackInstallId == pack_install_id,
                WorkItem.c.Status == WorkStatus.RETRY,
                WorkItem.c.ClaimableAt > now,
                LEGACY_WORK,
            )
        ).scalar_one()
    )


def _dependency_waits(pack_install_id: str) -> sa.Select[Any]:
    """Blocked old-protocol work with no live predecessor of its identity.

    Nothing inside the queue will unblock such a row: only an external dependency resolver
    can. (A row blocked behind a live predecessor drains when that predecessor does.)
    """
    predecessor = WorkItem.alias("Predecessor")
    live_predecessor = probe_exists(
        sa.select(predecessor.c.WorkId).where(
            predecessor.c.PackInstallId == WorkItem.c.PackInstallId,
            predecessor.c.ProjectionKey == WorkItem.c.ProjectionKey,
            predecessor.c.LaneOrdinal < WorkItem.c.LaneOrdinal,
            predecessor.c.InputStartOrdinal.is_(None),
            ~exactly(predecessor.c.Status, sorted(TERMINAL_WORK_STATUSES)),
        )
    )
    return sa.select(WorkItem.c.WorkId).where(
        WorkItem.c.PackInstallId == pack_install_id,
        WorkItem.c.Status == WorkStatus.BLOCKED,
        LEGACY_WORK,
        ~live_predecessor,
    )


def legacy_dependency_waits(connection: Connection, pack_install_id: str, limit: int) -> tuple[int, list[str]]:
    """Count and sample the blocked old-protocol work that waits on an external dependency.

    The sample is the ``limit`` smallest WorkIds. One read: ix_workitem_claim finds the
    blocked rows, ix_workitem_projection_order probes each one's predecessors, and every match
    is returned. A blocked row is a live predecessor of the later ones of its identity, so only
    the rows at an identity's lowest blocked LaneOrdinal can match: the result is bounded by
    identities, and counting and sampling it here spares a second evaluation and a sort.
    """
    work_ids = connection.execute(_dependency_waits(pack_install_id)).scalars().all()
    return len(work_ids), heapq.nsmallest(limit, work_ids)


# --- Audit of retained responsibility ------------------------------------------------------


def legacy_work_count(connection: Connection, pack_install_id: str) -> int:
    """Number of old-protocol WorkItems of a pack, any status (ix_workitem_claim prefix)."""
    return int(
        connection.execute(
            sa.select(sa.func.count())
            .select_from(WorkItem)
            .where(WorkItem.c.PackInstallId == pack_install_id, LEGACY_WORK)
        ).scalar_one()
    )


def _orphaned_work(pack_install_id: str) -> sa.Select[Any]:
    selected = probe_exists(
        sa.select(Event.c.EnqueueOrdinal).where(
            Event.c.PackInstallId == WorkItem.c.PackInstallId,
            Event.c.EnqueueOrdinal == WorkItem.c.LaneOrdinal,
            Event.c.ProjectionKey == WorkItem.c.ProjectionKey,
        )
    )
    return sa.select(WorkItem.c.WorkId).where(WorkItem.c.PackInstallId == pack_install_id, LEGACY_WORK, ~selected)


def legacy_work_orphaned(connection: Connection, pack_install_id: str, limit: int) -> tuple[int, list[str]]:
    """Count and sample old-protocol WorkItems whose selected Event is gone (or of another identity).

    The count walks the pack's old-protocol WorkItems with a primary-key probe of Event each.
    Only when there are orphans does a second walk take the first ``limit`` of them in
    ix_workitem_projection_order's order (identity, LaneOrdinal; WorkId breaks ties), so it
    stops early and sorts nothing but ties of one LaneOrdinal.
    """
    statement = _orphaned_work(pack_install_id)
    count = int(connection.execute(sa.select(sa.func.count()).select_from(statement.subquery())).scalar_one())
    if not count:
        return 0, []
    order = (WorkItem.c.ProjectionKey, WorkItem.c.LaneOrdinal, WorkItem.c.WorkId)
    return count, list(connection.execute(statement.order_by(*order).limit(limit)).scalars())


def event_identity_count(connection: Connection, pack_install_id: str) -> int:
    """Number of projection identities with Events in a pack (ix_event_source_lane prefix)."""
    keys = sa.select(Event.c.ProjectionKey).where(Event.c.PackInstallId == pack_install_id).distinct().subquery()
    return int(connection.execute(sa.select(sa.func.count()).select_from(keys)).scalar_one())


def event_identities_page(connection: Connection, pack_install_id: str, after: str | None, limit: int) -> list[str]:
    """The next ``limit`` identities with Events after ``after`` in key order (keyset, ix_event_source_lane).

    ``after`` None starts at the first key, whatever it is (the empty string included).
    """
    statement = sa.select(Event.c.ProjectionKey).where(Event.c.PackInstallId == pack_install_id)
    if after is not None:
        statement = statement.where(Event.c.ProjectionKey > after)
    return list(
        connection.execute(
            statement.group_by(Event.c.ProjectionKey).order_by(Event.c.ProjectionKey).limit(limit)
        ).scalars()
    )


def pack_event_count(connection: Connection, pack_install_id: str) -> int:
    """Every retained Event of a pack, whatever its identity or ordinal (primary-key prefix)."""
    return int(
        connection.execute(
            sa.select(sa.func.count()).select_from(Event).where(Event.c.PackInstallId == pack_install_id)
        ).scalar_one()
    )


def work_items_above(
    connection: Connection, pack_install_id: str, last_ordinal: int, limit: int
) -> tuple[int, list[str]]:
    """Count and sample WorkItems of a pack, of any protocol, with a bound above ``last_ordinal``.

    Such a range claims ordinals the counter has not handed out yet. ix_workitem_claim prefix
    (the pack's range, read whole; the audit runs once). The sample is the smallest WorkIds.
    """
    above = sa.select(WorkItem.c.WorkId).where(
        WorkItem.c.PackInstallId == pack_install_id,
        sa.or_(WorkItem.c.LaneOrdinal > last_ordinal, WorkItem.c.InputStartOrdinal > last_ordinal),
    )
    work_ids = connection.execute(above).scalars().all()
    return len(work_ids), heapq.nsmallest(limit, work_ids)


def work_items_unclassifiable(connection: Connection, pack_install_id: str, limit: int) -> tuple[int, list[str]]:
    """Count and sample WorkItems the old-protocol audit cannot classify, before any protocol row.

    A persisted lower bound (InputStartOrdinal) is range work, which only a pack with a
    protocol row may hold; a negative ordinal is outside every protocol. ix_workitem_claim
    prefix, read whole; the sample is the smallest WorkIds.
    """
    statement = sa.select(WorkItem.c.WorkId).where(
        WorkItem.c.PackInstallId == pack_install_id,
        sa.or_(WorkItem.c.InputStartOrdinal.is_not(None), WorkItem.c.LaneOrdinal < 0),
    )
    work_ids = connection.execute(statement).scalars().all()
    return len(work_ids), heapq.nsmallest(limit, work_ids)


def identity_event_bounds(connection: Connection, pack_install_id: str, projection_key: str) -> tuple[int, int]:
    """The lowest and highest Event ordinal of an identity (ix_event_source_lane, two index ends)."""
    row = connection.execute(
        sa.select(sa.func.min(Event.c.EnqueueOrdinal), sa.func.max(Event.c.EnqueueOrdinal)).where(
            Event.c.PackInstallId == pack_install_id, Event.c.ProjectionKey == projection_key
        )
    ).one()
    return int(row[0]), int(row[1])


def identity_completed_boundary(connection: Connection, pack_install_id: str, projection_key: str) -> int | None:
    """The highest LaneOrdinal of a completed old-protocol generation of an identity, or None.

    ix_workitem_projection_order range of the identity.
    """
    value = connection.execute(
        sa.select(sa.func.max(WorkItem.c.LaneOrdinal)).where(
            WorkItem.c.PackInstallId == pack_install_id,
            WorkItem.c.ProjectionKey == projection_key,
            exactly(WorkItem.c.Status, [WorkStatus.COMPLETED]),
            LEGACY_WORK,
        )
    ).scalar()
    return None if value is None else int(value)


def identity_events_page(
    connection: Connection, pack_install_id: str, projection_key: str, after: int | None, limit: int
) -> list[DbRow]:
    """The next ``limit`` Events of an identity after ordinal ``after``, each with whether it has a direct task.

    ``after`` None starts at the lowest ordinal, negative ones included. A direct task is an
    old-protocol WorkItem that selected the Event (LaneOrdinal = its ordinal). Keyset range of
    ix_event_source_lane; one ix_workitem_projection_order probe per Event. Returns
    EnqueueOrdinal, ProjectionKey (as stored: a PAD SPACE collation may match a padded twin of
    ``projection_key``), Status and HasDirectTask.
    """
    direct = probe_exists(
        sa.select(WorkItem.c.WorkId).where(
            WorkItem.c.PackInstallId == Event.c.PackInstallId,
            WorkItem.c.ProjectionKey == Event.c.ProjectionKey,
            WorkItem.c.LaneOrdinal == Event.c.EnqueueOrdinal,
            LEGACY_WORK,
        )
    )
    statement = sa.select(
        Event.c.EnqueueOrdinal, Event.c.ProjectionKey, Event.c.Status, direct.label("HasDirectTask")
    ).where(Event.c.PackInstallId == pack_install_id, Event.c.ProjectionKey == projection_key)
    if after is not None:
        statement = statement.where(Event.c.EnqueueOrdinal > after)
    return list(connection.execute(statement.order_by(Event.c.EnqueueOrdinal).limit(limit)))
