"""Every statement of the order policy: a pack's and a work type's policy, the operator's skips, the claim's hold.

Builders are named noun + verb, as in the package's other modules; each takes the caller's
connection. ``claims`` builds the claim's candidate read with ``candidate_not_held``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from nexuscrm_connectors.queries import DbRow
from nexuscrm_connectors.queries import claim_pauses as pauses_sql
from nexuscrm_connectors.queries.work_items import Instant
from nexuscrm_schema import relations
from nexuscrm_schema.tables import OrderPolicy, SkippedWork, WorkItem, WorkTypeOrderPolicy
from workqueue import WorkStatus

BLOCK = relations.BLOCK
CONTINUE = relations.CONTINUE
DEFAULT_POLICY = relations.DEFAULT_ORDER_POLICY
unresolved = relations.unresolved
effective_block = relations.effective_block


def candidate_not_held(pack: sa.ColumnElement[str]) -> sa.ColumnElement[bool]:
    """The claim's candidate condition: not held back under the "block" policy.

    Held: behind a dead letter, or behind a replay that runs before it.
    ``pack`` is the candidate read's bound pack parameter. The effective policy
    (``effective_block``) is a primary-key probe of the work type's row per candidate and one
    of the pack's per read. Under "block" each candidate row costs the seeks of
    ``relations.behind_dead_letter_or_replay``. An identity has one work type, so a policy of
    one work type holds only that type's successors.
    """
    return sa.not_(sa.and_(effective_block(pack, WorkItem.c.WorkType), relations.behind_dead_letter_or_replay()))


def candidate_operable(pack: sa.ColumnElement[str], now: Instant) -> sa.ColumnElement[bool]:
    """Everything an operator decided about a claim candidate: not paused, and not held by the order policy."""
    return sa.and_(pauses_sql.candidate_not_paused(pack, now), candidate_not_held(pack))


def pack_blocks_any(pack: sa.ColumnElement[str]) -> sa.ColumnElement[bool]:
    """Whether "block" is the policy of ``pack`` or of one of its work types (primary-key reads)."""
    return sa.or_(
        sa.exists().where(OrderPolicy.c.PackInstallId == pack, OrderPolicy.c.Policy == BLOCK),
        sa.exists().where(WorkTypeOrderPolicy.c.PackInstallId == pack, WorkTypeOrderPolicy.c.Policy == BLOCK),
    )


def pack_operated(pack: sa.ColumnElement[str], now: Instant) -> sa.ColumnElement[bool]:
    """Whether an operator's decision may hold claims of ``pack``: an active pause, or "block" for it or a work type.

    Read with the claim's served packs, so a pack without either is read without the conditions
    of ``candidate_operable`` (the claim's fast path).
    """
    return sa.or_(pauses_sql.pack_paused_any(pack, now), pack_blocks_any(pack))


_HELD = (
    sa.select(WorkItem.c.WorkId, relations.held_behind())
    .where(
        WorkItem.c.WorkId.in_(sa.bindparam("work_ids", expanding=True)),
        WorkItem.c.Status == WorkStatus.PENDING,
        WorkItem.c.InputStartOrdinal.is_not(None),
        effective_block(WorkItem.c.PackInstallId, WorkItem.c.WorkType),
    )
    # A page's WorkIds may be much of a small table, where MariaDB would rather scan it.
    .with_hint(WorkItem, "FORCE INDEX (PRIMARY)", dialect_name="mysql")
)


def work_items_held(connection: Connection, work_ids: Sequence[str]) -> dict[str, str]:
    """Of ``work_ids``, the pending generations the "block" policy holds, each with its dead letter's WorkId.

    What the claim's ``candidate_not_held`` refuses, read for an operator: per row one primary
    key probe of each policy table and one seek of ix_workitem_projection_order.
    """
    if not work_ids:
        return {}
    rows = connection.execute(_HELD, {"work_ids": list(work_ids)})
    return {row[0]: row[1] for row in rows if row[1] is not None}


def work_items_held_count(connection: Connection, pack_install_id: str, cap: int) -> int:
    """The pack's pending generations the "block" policy holds, counted up to ``cap`` (0 without "block").

    Reads the pack's pending generations on ix_workitem_claim until ``cap`` held ones are found,
    each with the probes of ``work_items_held``; nothing when no policy of the pack is "block".
    """
    if not connection.execute(sa.select(pack_blocks_any(sa.literal(pack_install_id)))).scalar():
        return 0
    rows = (
        sa.select(WorkItem.c.WorkId)
        .where(
            WorkItem.c.PackInstallId == pack_install_id,
            WorkItem.c.Status == WorkStatus.PENDING,
            WorkItem.c.InputStartOrdinal.is_not(None),
            effective_block(WorkItem.c.PackInstallId, WorkItem.c.WorkType),
            relations.behind_dead_letter_or_replay(),
        )
        .with_hint(WorkItem, "FORCE INDEX (ix_workitem_claim)", dialect_name="mysql")
        .limit(cap)
        .subquery()
    )
    return int(connection.execute(sa.select(sa.func.count()).select_from(rows)).scalar_one())


def blocks(connection: Connection, pack_install_id: str, work_type: str) -> bool:
    """Whether ``work_type``'s generations in the pack are under "block" now (two primary-key reads)."""
    return bool(
        connection.execute(sa.select(effective_block(sa.literal(pack_install_id), sa.literal(work_type)))).scalar()
    )


def replays_run_first(connection: Connection, pack_install_id: str) -> list[DbRow]:
    """The pack's unfinished replays that run before a held generation (WorkId, WorkType, RunsBeforeWorkId).

    Reads ix_workitem_runs_before's rows (replays run first, ever: few) and their probes.
    """
    first = WorkItem.alias("RunsFirst")
    return list(
        connection.execute(
            sa.select(first.c.WorkId, first.c.WorkType, first.c.RunsBeforeWorkId)
            .where(
                first.c.RunsBeforeWorkId.is_not(None),
                first.c.PackInstallId == pack_install_id,
                relations.unfinished(first),
            )
            .order_by(first.c.WorkId)
        )
    )


def order_policy_get(connection: Connection, pack_install_id: str) -> DbRow | None:
    """The pack's OrderPolicy row (primary key); None: the default."""
    return connection.execute(sa.select(OrderPolicy).where(OrderPolicy.c.PackInstallId == pack_install_id)).first()


def work_type_policy_get(connection: Connection, pack_install_id: str, work_type: str) -> DbRow | None:
    """The work type's WorkTypeOrderPolicy row (primary key); None: the pack's policy applies."""
    return connection.execute(
        sa.select(WorkTypeOrderPolicy).where(
            WorkTypeOrderPolicy.c.PackInstallId == pack_install_id, WorkTypeOrderPolicy.c.WorkType == work_type
        )
    ).first()


def work_type_policies_of_pack(connection: Connection, pack_install_id: str) -> list[DbRow]:
    """The pack's WorkTypeOrderPolicy rows by work type (a primary-key prefix range)."""
    return list(
        connection.execute(
            sa.select(WorkTypeOrderPolicy)
            .where(WorkTypeOrderPolicy.c.PackInstallId == pack_install_id)
            .order_by(WorkTypeOrderPolicy.c.WorkType)
        )
    )


def work_type_policy_set(connection: Connection, row: dict[str, Any], *, exists: bool) -> None:
    """Write the work type's policy row: an UPDATE of the row read under the pack lock, else an INSERT."""
    if exists:
        connection.execute(
            sa.update(WorkTypeOrderPolicy)
            .where(
                WorkTypeOrderPolicy.c.PackInstallId == row["PackInstallId"],
                WorkTypeOrderPolicy.c.WorkType == row["WorkType"],
            )
            .values(**row)
        )
    else:
        connection.execute(sa.insert(WorkTypeOrderPolicy).values(**row))


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
