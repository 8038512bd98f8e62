"""Every statement of the coverage proof: a pack's identities by key, and one identity's ranges and inputs.

Builders are named noun + verb, as in the package's other modules; each takes the caller's connection. Every
read is one seek or one range of an index that leads with (PackInstallId, ProjectionKey), so a
page costs in proportion to the identities it asks for and their retained rows, never to the
pack's history: the next identity is one seek of each of ix_workitem_projection_order,
ix_event_source_lane and ix_prunedwork_identity; an identity's generations, inputs and pruned
records are one range of each.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from nexuscrm_connectors.queries import DbRow
from nexuscrm_schema.hints import NO_DECORRELATE, probe_exists
from nexuscrm_schema.tables import Event, PrunedWork, SkippedWork, WorkItem

_REPLAYS = WorkItem.alias("Replays")  # the replay of a failed generation (ix_workitem_replay_of)


def _next_key(table: Any, pack_install_id: str, after: str | None) -> sa.Select[Any]:
    statement = sa.select(sa.func.min(table.c.ProjectionKey)).where(table.c.PackInstallId == pack_install_id)
    return statement if after is None else statement.where(table.c.ProjectionKey > after)


def identity_next(connection: Connection, pack_install_id: str, after: str | None) -> str | None:
    """The pack's lowest projection key above ``after`` (None: from the first) with a generation, input or record."""
    tables = (WorkItem, Event, PrunedWork)
    keys = [connection.execute(_next_key(table, pack_install_id, after)).scalar() for table in tables]
    present = [key for key in keys if key is not None]
    return min(present) if present else None


def identity_generations(connection: Connection, pack_install_id: str, projection_key: str) -> list[DbRow]:
    """The identity's generations with a range, by LaneOrdinal; a failed one with its replay's WorkId and skip.

    One range of ix_workitem_projection_order; per row one ix_workitem_replay_of seek and one
    SkippedWork primary-key probe.
    """
    replay = (  # the replay fence admits one replay of a WorkId at a time: MIN picks it without a sort
        sa.select(sa.func.min(_REPLAYS.c.WorkId))
        .where(_REPLAYS.c.ReplayOfWorkId == WorkItem.c.WorkId)
        .correlate(WorkItem)
        .prefix_with(NO_DECORRELATE, dialect="mysql")
        .scalar_subquery()
    )
    skipped = probe_exists(sa.select(SkippedWork.c.WorkId).where(SkippedWork.c.WorkId == WorkItem.c.WorkId))
    statement = (
        sa.select(
            WorkItem.c.WorkId,
            WorkItem.c.InputStartOrdinal,
            WorkItem.c.LaneOrdinal,
            WorkItem.c.Status,
            WorkItem.c.ReplayOfWorkId,
            replay.label("ReplayedBy"),
            sa.case((skipped, 1), else_=0).label("Skipped"),
        )
        .where(
            WorkItem.c.PackInstallId == pack_install_id,
            WorkItem.c.ProjectionKey == projection_key,
            WorkItem.c.InputStartOrdinal.is_not(None),
        )
        .order_by(WorkItem.c.LaneOrdinal)
    )
    return list(connection.execute(statement))


def identity_pruned(connection: Connection, pack_install_id: str, projection_key: str) -> list[DbRow]:
    """The identity's pruned generations (retention's records), by LaneOrdinal: one range of ix_prunedwork_identity."""
    statement = (
        sa.select(PrunedWork.c.WorkId, PrunedWork.c.InputStartOrdinal, PrunedWork.c.LaneOrdinal)
        .where(PrunedWork.c.PackInstallId == pack_install_id, PrunedWork.c.ProjectionKey == projection_key)
        .order_by(PrunedWork.c.LaneOrdinal)
    )
    return list(connection.execute(statement))


def identity_inputs(connection: Connection, pack_install_id: str, projection_key: str, above: int) -> list[int]:
    """The identity's retained input ordinals above ``above``, ascending: one ix_event_source_lane range."""
    statement = (
        sa.select(Event.c.EnqueueOrdinal)
        .where(
            Event.c.PackInstallId == pack_install_id,
            Event.c.ProjectionKey == projection_key,
            Event.c.EnqueueOrdinal > above,
        )
        .order_by(Event.c.EnqueueOrdinal)
    )
    return [int(ordinal) for ordinal in connection.execute(statement).scalars()]
