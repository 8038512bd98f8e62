"""Every statement on ClaimPause: the operator's pauses of claims, and the claim's probe of them.

Builders are named noun + verb, as in the package's other modules; each takes the caller's connection. Every
read goes down ix_claimpause_scope (PackInstallId, Scope, ScopeValue): a pause is found by
its whole scope, never by a scan of the pack's pause history.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from nexuscrm_connectors.queries import DbRow
from nexuscrm_connectors.queries.work_items import Instant
from nexuscrm_schema.hints import NO_DECORRELATE
from nexuscrm_schema.tables import ClaimPause, WorkItem

PACK_SCOPE_VALUE = ""  # ClaimPause.ScopeValue of a pause of the whole pack


def _active(now: Instant) -> sa.ColumnElement[bool]:
    """A pause still holding at ``now``: not resumed, and without an expiry or one after ``now``."""
    return sa.and_(
        ClaimPause.c.ResumedAt.is_(None),
        sa.or_(ClaimPause.c.ExpiresAt.is_(None), ClaimPause.c.ExpiresAt > now),
    )


def _paused(
    pack: sa.ColumnElement[str], scope: str, value: sa.ColumnElement[str], now: Instant
) -> sa.ColumnElement[bool]:
    # A limited scalar subquery, not EXISTS: MariaDB turns an EXISTS correlated to the candidate
    # row into a materialized IN over every pause of the scope kind (a scan of ClaimPause), where
    # this stays one seek of ix_claimpause_scope per row; the index is named because on a small
    # table MariaDB scans ClaimPause for the identity's probe otherwise.
    return (
        sa.select(sa.literal(1))
        .prefix_with(NO_DECORRELATE, dialect="mysql")
        .where(
            ClaimPause.c.PackInstallId == pack,
            ClaimPause.c.Scope == scope,
            ClaimPause.c.ScopeValue == value,
            _active(now),
        )
        .with_hint(ClaimPause, "FORCE INDEX (ix_claimpause_scope)", dialect_name="mysql")
        .limit(1)
        .scalar_subquery()
        .is_not(None)
    )


def candidate_not_paused(pack: sa.ColumnElement[str], now: Instant) -> sa.ColumnElement[bool]:
    """The claim's candidate condition: no active pause of the candidate's pack, identity or work type.

    ``pack`` is the candidate read's bound pack parameter, so the pack's probe does not depend
    on the row and is evaluated once per read; the identity's and work type's are one seek of
    ix_claimpause_scope per candidate row. (An identity has at most one claimable generation,
    so a paused identity is skipped at the cost of that one row.)
    """
    return sa.not_(
        sa.or_(
            _paused(pack, "pack", sa.literal(PACK_SCOPE_VALUE), now),
            _paused(pack, "identity", WorkItem.c.ProjectionKey, now),
            _paused(pack, "work_type", WorkItem.c.WorkType, now),
        )
    )


def pack_paused_any(pack: sa.ColumnElement[str], now: Instant) -> sa.Exists:
    """Whether the pack has any active pause (ix_claimpause_active: its pauses not resumed)."""
    return sa.exists().where(ClaimPause.c.PackInstallId == pack, _active(now))


def work_item_exists(connection: Connection, pack_install_id: str, column: sa.Column[str], value: str) -> bool:
    """Whether the pack has a generation whose ``column`` (ProjectionKey or WorkType) is ``value``.

    An identity is one seek of ix_workitem_projection_order; a work type has no index of its
    own, so its probe reads the pack's generations until the first match (an operator's
    pause, never a hot path).
    """
    found = connection.execute(
        sa.select(WorkItem.c.WorkId).where(WorkItem.c.PackInstallId == pack_install_id, column == value).limit(1)
    ).first()
    return found is not None


def claim_pause_active(
    connection: Connection, pack_install_id: str, scope: str, value: str, now: dt.datetime
) -> DbRow | None:
    """The active pause of one scope, if any (ix_claimpause_scope)."""
    return connection.execute(
        sa.select(ClaimPause)
        .where(
            ClaimPause.c.PackInstallId == pack_install_id,
            ClaimPause.c.Scope == scope,
            ClaimPause.c.ScopeValue == value,
            _active(now),
        )
        .limit(1)
    ).first()


def claim_pause_insert(connection: Connection, row: dict[str, Any]) -> None:
    """Record a new pause."""
    connection.execute(sa.insert(ClaimPause).values(**row))


def claim_pause_resume(connection: Connection, pause_id: str, resumed_by: str, now: dt.datetime) -> int:
    """Mark an active pause resumed at ``now`` by ``resumed_by`` (primary key); returns the row count."""
    return connection.execute(
        sa.update(ClaimPause)
        .where(ClaimPause.c.PauseId == pause_id, _active(now))
        .values(ResumedAt=now, ResumedBy=resumed_by)
    ).rowcount


def claim_pauses_of_pack(connection: Connection, pack_install_id: str, now: dt.datetime) -> list[DbRow]:
    """The pack's active pauses, by scope then scope value (ix_claimpause_active's or ix_claimpause_scope's pack range).

    Sorted here, not by the statement: MariaDB reads the active pauses through
    ix_claimpause_active and would sort them in a filesort; they are the few scopes an operator
    paused, and the dashboard asks for them on every refresh.
    """
    rows = connection.execute(
        sa.select(ClaimPause).where(ClaimPause.c.PackInstallId == pack_install_id, _active(now))
    ).all()
    return sorted(rows, key=lambda row: (row.Scope, row.ScopeValue))
