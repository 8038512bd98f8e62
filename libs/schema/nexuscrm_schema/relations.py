"""Relations between canonical rows that more than one owner reads.

A generation's predecessor is the previous generation of its projection identity: the
identity's WorkItem with the highest LaneOrdinal below the generation's InputStartOrdinal
that does not run before a held generation (one seek of ``ix_workitem_projection_order``).
Connectors' liveness sweep and the Controlplane dashboard's stranded gauge both judge a
blocked generation by it.

Under the "block" order policy (decisions 160 and 165), a pending generation is held while
its predecessor is a dead letter (failed, neither replayed nor skipped), and while a replay
that runs before it (RunsBeforeWorkId, decision 174) has not completed, been skipped or been
replayed in turn: Connectors' claim refuses it and the runner reports it (``dead_letter``,
``effective_block``, ``held_behind``). Such a replay is nobody's predecessor: it runs before
the generations below its own ordinal that it holds, in the place of the dead letter it replays.

An Event's payload is its EventPayload row's, or for an Event admitted before schema v8
copied it, its own Event.Payload (decision 126): ``EVENT_WITH_PAYLOAD`` and ``EVENT_PAYLOAD``
read it for whole-table readers (demo checks, test histories).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from nexuscrm_schema.hints import NO_DECORRELATE, probe_exists
from nexuscrm_schema.tables import Event, EventPayload, OrderPolicy, SkippedWork, WorkItem, WorkTypeOrderPolicy
from workqueue.statuses import WorkStatus

PREDECESSOR = WorkItem.alias("Predecessor")
"""The outer WorkItem row's predecessor in ``predecessor_select``."""


def predecessor_select(column: sa.ColumnElement[Any]) -> sa.Select[Any]:
    """``column`` of the outer WorkItem row's predecessor (``PREDECESSOR``): one ix_workitem_projection_order seek.

    The generation of the same identity with the highest LaneOrdinal below the row's
    InputStartOrdinal, a replay that runs before a held generation aside; no row when it has none.
    """
    return (
        sa.select(column)
        .where(
            PREDECESSOR.c.PackInstallId == WorkItem.c.PackInstallId,
            PREDECESSOR.c.ProjectionKey == WorkItem.c.ProjectionKey,
            PREDECESSOR.c.LaneOrdinal < WorkItem.c.InputStartOrdinal,
            PREDECESSOR.c.RunsBeforeWorkId.is_(None),
        )
        .order_by(PREDECESSOR.c.LaneOrdinal.desc())
        .limit(1)
        .correlate(WorkItem)
    )


PREDECESSOR_STATUS: sa.ScalarSelect[Any] = predecessor_select(PREDECESSOR.c.Status).scalar_subquery()
"""The status of the outer WorkItem row's predecessor; NULL when it has none."""

EVENT_WITH_PAYLOAD = Event.outerjoin(
    EventPayload,
    sa.and_(
        EventPayload.c.PackInstallId == Event.c.PackInstallId, EventPayload.c.EnqueueOrdinal == Event.c.EnqueueOrdinal
    ),
)
"""Event joined to its EventPayload row (none for a payload still kept in Event)."""

EVENT_PAYLOAD: sa.ColumnElement[bytes] = sa.func.coalesce(EventPayload.c.Payload, Event.c.Payload).label("Payload")
"""The payload of the Event row of ``EVENT_WITH_PAYLOAD``, wherever it is stored."""

BLOCK = "block"
CONTINUE = "continue"
DEFAULT_ORDER_POLICY = CONTINUE  # a dead letter holds nothing until an operator asks for "block"

_REPLAYS = WorkItem.alias("Replays")  # a replay of a failed generation (ix_workitem_replay_of)


def unresolved(table: Any) -> sa.ColumnElement[bool]:
    """``table``'s row (a failed generation) was neither replayed nor skipped: it is still a dead letter.

    One seek of ix_workitem_replay_of and one primary-key probe of SkippedWork.
    """
    return sa.and_(
        ~probe_exists(sa.select(_REPLAYS.c.WorkId).where(_REPLAYS.c.ReplayOfWorkId == table.c.WorkId)),
        ~probe_exists(sa.select(SkippedWork.c.WorkId).where(SkippedWork.c.WorkId == table.c.WorkId)),
    )


def dead_letter(table: Any) -> sa.ColumnElement[bool]:
    """``table``'s row is a dead letter: failed for good, neither replayed nor skipped."""
    return sa.and_(table.c.Status == WorkStatus.FAILED, unresolved(table))


def effective_block(pack: sa.ColumnElement[str], work_type: sa.ColumnElement[str]) -> sa.ColumnElement[bool]:
    """Whether a generation of ``work_type`` in ``pack`` is under "block".

    Its work type's policy if set, else its pack's, else the default: one primary-key probe
    of WorkTypeOrderPolicy (per row when ``work_type`` is the row's column) and one of
    OrderPolicy (once per read when ``pack`` is a bound parameter).
    """
    of_type = (
        sa.select(WorkTypeOrderPolicy.c.Policy)
        .prefix_with(NO_DECORRELATE, dialect="mysql")
        .where(WorkTypeOrderPolicy.c.PackInstallId == pack, WorkTypeOrderPolicy.c.WorkType == work_type)
        .scalar_subquery()
    )
    of_pack = sa.select(OrderPolicy.c.Policy).where(OrderPolicy.c.PackInstallId == pack).scalar_subquery()
    return sa.func.coalesce(of_type, of_pack, DEFAULT_ORDER_POLICY) == BLOCK


_FIRST = WorkItem.alias("RunsFirst")  # a replay that runs before the outer row (ix_workitem_runs_before)


def unfinished(table: Any) -> sa.ColumnElement[bool]:
    """``table``'s row has not completed, and was not resolved after failing for good (replayed or skipped)."""
    return sa.and_(
        table.c.Status != WorkStatus.COMPLETED,
        sa.or_(table.c.Status != WorkStatus.FAILED, unresolved(table)),
    )


def _runs_first_select(column: sa.ColumnElement[Any]) -> sa.Select[Any]:
    """``column`` of an unfinished replay run before the outer WorkItem row: one seek of ix_workitem_runs_before."""
    return (
        sa.select(column)
        .where(_FIRST.c.RunsBeforeWorkId == WorkItem.c.WorkId, unfinished(_FIRST))
        .limit(1)
        .correlate(WorkItem)
    )


def behind_dead_letter_or_replay() -> sa.ColumnElement[bool]:
    """The outer WorkItem row's predecessor is a dead letter, or a replay that runs before it is unfinished.

    The claim's hold under "block" (with ``effective_block``): one seek of
    ix_workitem_projection_order and its row's two probes, and one seek of
    ix_workitem_runs_before (no row for nearly every generation).
    """
    dead = predecessor_select(sa.case((dead_letter(PREDECESSOR), 1), else_=0))
    # Scalar subqueries, not EXISTS: MariaDB would turn an EXISTS into a semi-join scanning WorkItem.
    first = _runs_first_select(sa.literal(1))
    return sa.or_(
        sa.func.coalesce(dead.prefix_with(NO_DECORRELATE, dialect="mysql").scalar_subquery(), 0) == 1,
        sa.func.coalesce(first.prefix_with(NO_DECORRELATE, dialect="mysql").scalar_subquery(), 0) == 1,
    )


def held_behind() -> sa.ColumnElement[Any]:
    """The WorkId the outer WorkItem row waits for: its dead-letter predecessor, else an unfinished replay run first.

    NULL when neither; whether the row is held also takes its status (pending) and
    ``effective_block``.
    """
    dead = predecessor_select(sa.case((dead_letter(PREDECESSOR), PREDECESSOR.c.WorkId), else_=None))
    first = _runs_first_select(_FIRST.c.WorkId)
    return sa.func.coalesce(
        dead.prefix_with(NO_DECORRELATE, dialect="mysql").scalar_subquery(),
        first.prefix_with(NO_DECORRELATE, dialect="mysql").scalar_subquery(),
    )
