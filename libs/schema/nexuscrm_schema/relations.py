"""Relations between canonical rows that more than one owner reads.

A generation's predecessor is the previous generation of its projection identity: the
identity's WorkItem with the highest LaneOrdinal below the generation's InputStartOrdinal
(one seek of ``ix_workitem_projection_order``). Connectors' liveness sweep and the
Controlplane dashboard's stranded gauge both judge a blocked generation by it.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from nexuscrm_schema.tables import WorkItem

_PREDECESSOR = WorkItem.alias("Predecessor")

PREDECESSOR_STATUS: sa.ScalarSelect[Any] = (
    sa.select(_PREDECESSOR.c.Status)
    .where(
        _PREDECESSOR.c.PackInstallId == WorkItem.c.PackInstallId,
        _PREDECESSOR.c.ProjectionKey == WorkItem.c.ProjectionKey,
        _PREDECESSOR.c.LaneOrdinal < WorkItem.c.InputStartOrdinal,
    )
    .order_by(_PREDECESSOR.c.LaneOrdinal.desc())
    .limit(1)
    .correlate(WorkItem)
    .scalar_subquery()
)
"""The status of the outer WorkItem row's predecessor; NULL when it has none."""
