"""Every statement of the order policy: a pack's policy, the operator's skips, and the claim's hold.

Builders are named noun + verb, as in the package's other modules; each takes the caller's
connection. ``claims`` builds the claim's candidate read with ``candidate_not_held``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from nexuscrm_connectors.queries import DbRow
from nexuscrm_connectors.queries import pauses as pauses_sql
from nexuscrm_connectors.queries.work_items import Instant
from nexuscrm_schema.hints import NO_DECORRELATE, probe_exists
from nexuscrm_schema.relations import PREDECESSOR, predecessor_select
from nexuscrm_schema.tables import OrderPolicy, SkippedWork, WorkItem
from workqueue import WorkStatus

BLOCK = "block"
CONTINUE = "continue"
DEFAULT_POLICY = CONTINUE  # decision 160

_REPLAYS = WorkItem.alias("Replays")  # a replay of a failed generation (ix_workitem_replay_of)


def unresolved(table: Any) -> sa.ColumnElement[bool]:
    """``table``'s row (a failed generation) was neither replayed nor skipped: it is still a dead letter.

    One seek of ix_workitem_replay_of and one primary-key probe of SkippedWork.
    """
    return sa.and_(
        ~probe_exists(sa.select(_REPLAYS.c.WorkId).where(_REPLAYS.c.ReplayOfWorkId == table.c.WorkId)),
        ~probe_exists(sa.select(SkippedWork.c.WorkId).where(SkippedWork.c.WorkId == table.c.WorkId)),
    )


def candidate_not_held(pack: sa.ColumnElement[str]) -> sa.ColumnElement[bool]:
    """The claim's candidate condition: not held back by a dead letter before it under the "block" policy.

    ``pack`` is the candidate read's bound pack parameter: the policy's probe is one
    primary-key read per read, not per row. Under "block" each candidate row costs one seek of
    ix_workitem_projection_order (its identity's generation just below it) and that
    generation's two probes (``unresolved``).
    """
    blocking = sa.exists().where(OrderPolicy.c.PackInstallId == pack, OrderPolicy.c.Policy == BLOCK)
    dead = sa.case((sa.and_(PREDECESSOR.c.Status == WorkStatus.FAILED, unresolved(PREDECESSOR)), 1), else_=0)
    held_behind = predecessor_select(dead).prefix_with(NO_DECORRELATE, dialect="mysql").scalar_subquery()
    return sa.not_(sa.and_(blocking, sa.func.coalesce(held_behind, 0) == 1))


def candidate_operable(pack: sa.ColumnElement[str], now: Instant) -> sa.ColumnElement[bool]:
    """Everything an operator decided about a claim candidate: not paused, and not held by the order policy."""
    return sa.and_(pauses_sql.candidate_not_paused(pack, now), candidate_not_held(pack))


def pack_operated(pack: sa.ColumnElement[str], now: Instant) -> sa.ColumnElement[bool]:
    """Whether an operator's decision may hold claims of ``pack``: an active pause, or the "block" policy.

    Read with the claim's served packs, so a pack without either is read without the conditions
    of ``candidate_operable`` (the claim's fast path).
    """
    return sa.or_(
        pauses_sql.pack_paused_any(pack, now),
        sa.exists().where(OrderPolicy.c.PackInstallId == pack, OrderPolicy.c.Policy == BLOCK),
    )


def order_policy_get(connection: Connection, pack_install_id: str) -> DbRow | None:
    """The pack's OrderPolicy row (primary key); None: the default."""
    return connection.execute(sa.select(OrderPolicy).where(OrderPolicy.c.PackInstallId == pack_install_id)).first()


def order_policy_set(connection: Connection, row: dict[str, Any], *, exists: bool) -> None:
    """Write the pack's policy row: an UPDATE of the row read under the pack lock, else an INSERT."""
    if exists:
        connection.execute(
            sa.update(OrderPolicy).where(OrderPolicy.c.PackInstallId == row["PackInstallId"]).values(**row)
        )
    else:
        connection.execute(sa.insert(OrderPolicy).values(**row))


def skipped_work_get(connection: Connection, work_id: str) -> DbRow | None:
    """The skip of ``work_id``, if any (primary key)."""
    return connection.execute(sa.select(SkippedWork).where(SkippedWork.c.WorkId == work_id)).first()


def skipped_work_insert(
    connection: Connection, work_id: str, pack_install_id: str, by: str, reason: str, now: dt.datetime
) -> None:
    """Record an operator's skip of a failed generation."""
    connection.execute(
        sa.insert(SkippedWork).values(
            WorkId=work_id, PackInstallId=pack_install_id, SkippedBy=by, Reason=reason, SkippedAt=now
        )
    )


def work_item_replay_any(connection: Connection, work_id: str) -> DbRow | None:
    """A replay of ``work_id`` in any status, if one exists (ix_workitem_replay_of)."""
    return connection.execute(
        sa.select(WorkItem.c.WorkId, WorkItem.c.Status).where(WorkItem.c.ReplayOfWorkId == work_id).limit(1)
    ).first()
