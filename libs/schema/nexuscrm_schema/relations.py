"""Relations between canonical rows that more than one owner reads.

A generation's predecessor is the previous generation of its projection identity: the
identity's WorkItem with the highest LaneOrdinal below the generation's InputStartOrdinal
(one seek of ``ix_workitem_projection_order``). Connectors' liveness sweep and the
Controlplane dashboard's stranded gauge both judge a blocked generation by it.

An Event's payload is its EventPayload row's, or for an Event admitted before schema v8
copied it, its own Event.Payload (decision 126): ``EVENT_WITH_PAYLOAD`` and ``EVENT_PAYLOAD``
read it for whole-table readers (demo checks, test histories).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from nexuscrm_schema.tables import Event, EventPayload, WorkItem

PREDECESSOR = WorkItem.alias("Predecessor")
"""The outer WorkItem row's predecessor in ``predecessor_select``."""


def predecessor_select(column: sa.ColumnElement[Any]) -> sa.Select[Any]:
    """``column`` of the outer WorkItem row's predecessor (``PREDECESSOR``): one ix_workitem_projection_order seek.

    The generation of the same identity with the highest LaneOrdinal below the row's
    InputStartOrdinal; no row when it has none.
    """
    return (
        sa.select(column)
        .where(
            PREDECESSOR.c.PackInstallId == WorkItem.c.PackInstallId,
            PREDECESSOR.c.ProjectionKey == WorkItem.c.ProjectionKey,
            PREDECESSOR.c.LaneOrdinal < WorkItem.c.InputStartOrdinal,
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
