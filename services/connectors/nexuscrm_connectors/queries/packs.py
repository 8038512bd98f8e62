"""What admission reads and locks per pack: the pack row, its fences, its protocol row.

Every function takes the caller's open transaction: the fence check and the protocol read
must be atomic with the admission (or replay) they guard.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from nexuscrm_connectors.errors import OrdinalCollision, UnknownPack
from nexuscrm_connectors.queries import events as events_sql
from nexuscrm_connectors.queries.rows import EventRow
from nexuscrm_runtime.clock import NOW_PARAMETER, DatabaseClock
from nexuscrm_schema.tables import (
    NAMESPACE_SCOPE,
    AdmissionFence,
    AdmissionFenceOverride,
    ConnectorProjectionProtocol,
    Event,
    FlowVersionTrack,
    PackInstall,
    RetentionPolicy,
)

REPAIR = "docs/runbook-cutover.md, 'Ordinal counter behind the history'"


@dataclasses.dataclass(frozen=True, kw_only=True)
class LockedPack:
    """A PackInstall row read under its row lock (held until the transaction ends).

    ``now``: the database's time at the lock, the instant the transaction decides with.
    """

    pack_install_id: str
    namespace: str
    last_ordinal: int
    now: dt.datetime


@dataclasses.dataclass(frozen=True, kw_only=True)
class Protocol:
    """A pack's immutable projection protocol row, with its retention policy's duplicate window.

    ``duplicate_window_seconds`` (None: tombstones kept forever) and ``horizon_source_time``
    (None before a tombstone expired) come from the pack's RetentionPolicy row, read in the
    same statement so admission checks the window without a statement of its own.
    """

    pack_install_id: str
    protocol_version: int
    legacy_max_ordinal: int
    duplicate_window_seconds: int | None = None
    horizon_source_time: dt.datetime | None = None


# Admission's statements are built once; values are parameters (the rule: docs/performance.md,
# "Tuning notes formerly in docs/decisions").
_PACK_READ = sa.select(
    PackInstall.c.PackInstallId, PackInstall.c.Namespace, PackInstall.c.LastOrdinal, NOW_PARAMETER.label("Now")
).where(PackInstall.c.PackInstallId == sa.bindparam("pack_install_id"))
_PACK_LOCK = _PACK_READ.with_for_update()


def pack_lock(connection: Connection, pack_install_id: str, clock: DatabaseClock, *, lock: bool = True) -> LockedPack:
    """Lock the PackInstall row: serializes admission and replay of one pack; read the database clock with it.

    Raises ``UnknownPack``. On SQLite the transaction already holds the write lock. ``lock``
    False only reads the row (a report's counter and instant).
    """
    statement = _PACK_LOCK if lock else _PACK_READ
    row = connection.execute(statement, {"pack_install_id": pack_install_id, **clock.parameters()}).first()
    if row is None:
        raise UnknownPack(f"pack_install_id {pack_install_id!r} is not installed", field="pack_install_id")
    return LockedPack(
        pack_install_id=row.PackInstallId, namespace=row.Namespace, last_ordinal=row.LastOrdinal, now=row.Now
    )


def pack_control_version_bump(connection: Connection, pack_install_id: str) -> None:
    """Write the locked pack's row (its ControlVersion, decision 107): a decision taken under its lock conflicts.

    On one server the pack's row lock orders every decision taken under it. On a multi-primary
    engine (Galera) a lock taken FOR UPDATE holds on its own node only, so two decisions read
    the same state on two nodes; a write to the row both make is what conflicts at commit, and
    the transaction that loses runs again and sees the winner's decision (an operator's pause,
    skip or policy: "already done"; decision 183). Admission writes the row too, so an
    admission that read a changed horizon or policy conflicts likewise (decision 127).
    Raises ``RuntimeError`` when no row changed: the caller locked it, so that is a bug.
    """
    bumped = connection.execute(
        sa.update(PackInstall)
        .where(PackInstall.c.PackInstallId == pack_install_id)
        .values(ControlVersion=sa.func.coalesce(PackInstall.c.ControlVersion, 0) + 1)
    ).rowcount
    if bumped != 1:
        raise RuntimeError(f"pack {pack_install_id} vanished under its row lock")


# Moves a locked pack's ordinal counter from ``last_ordinal`` to ``new_last`` unless a retained
# Event sits above ``last_ordinal`` (``ordinals_allocate``).
_ALLOCATE = (
    sa.update(PackInstall)
    .where(
        PackInstall.c.PackInstallId == sa.bindparam("pack_install_id"),
        PackInstall.c.LastOrdinal == sa.bindparam("last_ordinal"),
        ~sa.select(Event.c.EnqueueOrdinal)
        .where(
            Event.c.PackInstallId == sa.bindparam("pack_install_id"),
            Event.c.EnqueueOrdinal > sa.bindparam("last_ordinal"),
        )
        .exists(),
    )
    .values(LastOrdinal=sa.bindparam("new_last"))
)


def ordinals_allocate(connection: Connection, pack: LockedPack, count: int) -> range:
    """Allocate ``count`` new ordinals of a locked pack, in order; never reused.

    The counter only grows, and the row lock makes allocation follow commit order. The same
    UPDATE proves that no retained Event sits above the counter (a primary-key range probe,
    no extra statement): otherwise it raises ``OrdinalCollision`` (DATA_LOSS) and keeps
    refusing, since the counter cannot move past that Event until an operator repairs it.
    """
    first = pack.last_ordinal + 1
    result = connection.execute(
        _ALLOCATE,
        {
            "pack_install_id": pack.pack_install_id,
            "last_ordinal": pack.last_ordinal,
            "new_last": pack.last_ordinal + count,
        },
    )
    if result.rowcount != 1:
        _refuse_collision(connection, pack.pack_install_id, pack.last_ordinal, None)
        # the lock makes this impossible; refuse rather than reuse
        raise RuntimeError(f"ordinal counter of {pack.pack_install_id} moved under its lock")
    return range(first, first + count)


def allocated_events_insert(
    connection: Connection, pack_install_id: str, rows: Sequence[EventRow] | Sequence[Mapping[str, Any]]
) -> None:
    """Insert the new Events of ``ordinals_allocate``'s ordinals (``events_sql.events_insert``).

    An Event that appeared at one of those ordinals after the counter was checked (a writer
    that bypassed the pack lock) raises ``OrdinalCollision``, not the driver's integrity
    error; any other integrity error is re-raised unchanged. The failed INSERT is undone as
    a statement, so the probe sees only rows that were there before it.
    """
    try:
        events_sql.events_insert(connection, rows)
    except sa.exc.IntegrityError:
        ordinals = [int(row["EnqueueOrdinal"]) for row in rows]
        _refuse_collision(connection, pack_install_id, min(ordinals) - 1, max(ordinals))
        raise


def _refuse_collision(connection: Connection, pack_install_id: str, last_ordinal: int, through: int | None) -> None:
    """Raise ``OrdinalCollision`` naming the lowest Event above ``last_ordinal`` (up to ``through``), if any."""
    statement = sa.select(sa.func.min(Event.c.EnqueueOrdinal)).where(
        Event.c.PackInstallId == pack_install_id, Event.c.EnqueueOrdinal > last_ordinal
    )
    if through is not None:
        statement = statement.where(Event.c.EnqueueOrdinal <= through)
    found = connection.execute(statement).scalar()
    if found is None:
        return
    counter = connection.execute(
        sa.select(PackInstall.c.LastOrdinal).where(PackInstall.c.PackInstallId == pack_install_id)
    ).scalar()
    raise OrdinalCollision(
        f"pack {pack_install_id} retains Event {found} at or above what its ordinal counter hands out "
        f"(LastOrdinal {counter}): the counter and the history disagree (data inconsistency); admission "
        f"and replay of this pack are refused until an operator repairs it ({REPAIR})",
        field="pack_install_id",
    )


# The protocol row's columns with its retention policy's window (``protocol_get``, ``admission_guard``).
_PROTOCOL_COLUMNS = (
    ConnectorProjectionProtocol.c.ProtocolVersion,
    ConnectorProjectionProtocol.c.LegacyMaxOrdinal,
    RetentionPolicy.c.DuplicateWindowSeconds,
    RetentionPolicy.c.HorizonSourceTime,
)
_POLICY_OF_PROTOCOL = RetentionPolicy.c.PackInstallId == ConnectorProjectionProtocol.c.PackInstallId

_PROTOCOL = (
    sa.select(*_PROTOCOL_COLUMNS)
    .select_from(ConnectorProjectionProtocol.outerjoin(RetentionPolicy, _POLICY_OF_PROTOCOL))
    .where(ConnectorProjectionProtocol.c.PackInstallId == sa.bindparam("pack_install_id"))
)


def protocol_get(connection: Connection, pack_install_id: str) -> Protocol | None:
    """The pack's protocol row by primary key (and its policy's window), or None before activation/cutover."""
    return _protocol(pack_install_id, connection.execute(_PROTOCOL, {"pack_install_id": pack_install_id}).first())


def _protocol(pack_install_id: str, row: Any) -> Protocol | None:
    """The ``Protocol`` of a row of ``_PROTOCOL_COLUMNS`` (None: no row, or no protocol row joined)."""
    if row is None or row.ProtocolVersion is None:
        return None
    return Protocol(
        pack_install_id=pack_install_id,
        protocol_version=row.ProtocolVersion,
        legacy_max_ordinal=row.LegacyMaxOrdinal,
        duplicate_window_seconds=row.DuplicateWindowSeconds,
        horizon_source_time=row.HorizonSourceTime,
    )


# An unexpired fence of a namespace scoped to it (``*``) or to a pack, that no unexpired
# override releases for that pack (``fence_active``).
_FENCE = (
    sa.select(AdmissionFence.c.FenceId)
    .where(
        AdmissionFence.c.Namespace == sa.bindparam("namespace"),
        AdmissionFence.c.Scope.in_(sa.bindparam("scopes", expanding=True)),
        sa.or_(AdmissionFence.c.ExpiresAt.is_(None), AdmissionFence.c.ExpiresAt > sa.bindparam("now")),
        ~sa.select(AdmissionFenceOverride.c.FenceId)
        .where(
            AdmissionFenceOverride.c.FenceId == AdmissionFence.c.FenceId,
            AdmissionFenceOverride.c.PackInstallId == sa.bindparam("pack_install_id"),
            sa.or_(
                AdmissionFenceOverride.c.ExpiresAt.is_(None), AdmissionFenceOverride.c.ExpiresAt > sa.bindparam("now")
            ),
        )
        .exists(),
    )
    .limit(1)
)


def fence_active(connection: Connection, pack: LockedPack, now: dt.datetime) -> bool:
    """Tell whether an admission fence holds this pack now.

    A fence holds when it is unexpired, scoped to the pack's namespace (``*``) or to the pack
    itself, and no unexpired override of that fence releases this pack.
    """
    return connection.execute(_FENCE, _fence_parameters(pack, now)).first() is not None


def _fence_parameters(pack: LockedPack, now: dt.datetime) -> dict[str, Any]:
    """The parameters of ``_FENCE`` for a locked pack at ``now`` (also ``_ADMISSION_GUARD``'s)."""
    return {
        "namespace": pack.namespace,
        "scopes": [NAMESPACE_SCOPE, pack.pack_install_id],
        "pack_install_id": pack.pack_install_id,
        "now": now,
    }


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdmissionGuard:
    """What admission checks after the pack lock: whether a fence holds the pack, and its protocol row."""

    fenced: bool
    protocol: Protocol | None
    has_versions: bool = False  # a work type of the pack has Flow versions (``queue.tracks``)


# ``fence_active`` and ``protocol_get`` of a locked pack in one statement: the PackInstall row
# by primary key, the protocol row and its policy joined by theirs, the fence check a subquery.
_ADMISSION_GUARD = (
    sa.select(
        _FENCE.scalar_subquery().label("FenceId"),
        sa.select(FlowVersionTrack.c.Version)
        .where(FlowVersionTrack.c.PackInstallId == PackInstall.c.PackInstallId, FlowVersionTrack.c.RetiredAt.is_(None))
        .limit(1)
        .scalar_subquery()
        .label("FlowVersion"),
        *_PROTOCOL_COLUMNS,
    )
    .select_from(
        PackInstall.outerjoin(
            ConnectorProjectionProtocol, ConnectorProjectionProtocol.c.PackInstallId == PackInstall.c.PackInstallId
        ).outerjoin(RetentionPolicy, _POLICY_OF_PROTOCOL)
    )
    .where(PackInstall.c.PackInstallId == sa.bindparam("pack_install_id"))
)


def admission_guard(connection: Connection, pack: LockedPack) -> AdmissionGuard:
    """``fence_active`` at the lock's instant and ``protocol_get`` of a locked pack, in one statement.

    Run after ``pack_lock``, never inside it: a read in the locking statement could be taken
    before the lock wait ends, and miss a fence committed meanwhile (decision 140).
    """
    row = connection.execute(_ADMISSION_GUARD, _fence_parameters(pack, pack.now)).one()
    return AdmissionGuard(
        fenced=row.FenceId is not None,
        protocol=_protocol(pack.pack_install_id, row),
        has_versions=row.FlowVersion is not None,
    )
