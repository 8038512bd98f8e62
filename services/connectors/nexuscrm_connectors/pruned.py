"""What a reader says of work that retention pruned: when and why it is gone, or that it never was."""

from __future__ import annotations

from typing import NoReturn

from sqlalchemy.engine import Connection

from nexuscrm_connectors.errors import WorkNotFound, WorkPruned
from nexuscrm_connectors.queries import retention as retention_sql
from nexuscrm_runtime.clock import iso_utc


def refuse_if_pruned(connection: Connection, work_id: str) -> NoReturn:
    """Raise ``WorkPruned`` saying when ``work_id`` was pruned, if it was; else ``WorkNotFound``."""
    pruned = retention_sql.pruned_work_get(connection, work_id)
    if pruned is None:
        raise WorkNotFound(
            f"work {work_id} does not exist (or it was pruned and its record expired with its pack's duplicate window)",
            field="work_id",
        )
    raise WorkPruned(
        f"work {work_id} was pruned at {iso_utc(pruned.PrunedAt)} by the retention policy of pack "
        f"{pruned.PackInstallId}: generation [{pruned.InputStartOrdinal}, {pruned.LaneOrdinal}] was {pruned.Status} "
        "and its inputs are no longer stored, so it cannot be described or replayed",
        field="work_id",
    )
