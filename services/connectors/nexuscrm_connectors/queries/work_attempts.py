"""The statements of attempt history (decision 175): each attempt that did not complete its generation.

A ``WorkAttempt`` row is written in the transaction that ends its attempt (Fail, or the claim
that takes an expired lease over), under that generation's row lock, and deleted only with its
generation (retention). Every statement is by primary key or its WorkId prefix, built once
(decision 139).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from nexuscrm_connectors.queries import DbRow
from nexuscrm_schema.tables import WorkAttempt

_COLUMNS = ("PackInstallId", "WorkerId", "StartedAt", "FinishedAt", "Outcome", "Error", "Traceback")
# The attempt's number is one more than the generation's newest (1 for its first): read in the
# INSERT itself, under the generation's row lock its caller holds, so no other writer races it.
_RECORD = sa.insert(WorkAttempt).from_select(
    ["WorkId", "Attempt", *_COLUMNS],
    sa.select(
        sa.bindparam("work_id", type_=WorkAttempt.c.WorkId.type),
        sa.func.coalesce(sa.func.max(WorkAttempt.c.Attempt), 0) + 1,
        *(sa.bindparam(f"value_{name}", type_=WorkAttempt.c[name].type) for name in _COLUMNS),
    ).where(WorkAttempt.c.WorkId == sa.bindparam("work_id", type_=WorkAttempt.c.WorkId.type)),
)
_NEWEST = (
    sa.select(WorkAttempt)
    .where(WorkAttempt.c.WorkId == sa.bindparam("work_id"))
    .order_by(WorkAttempt.c.Attempt.desc())
    .limit(sa.bindparam("limit", type_=sa.Integer()))
)
_DELETE = sa.delete(WorkAttempt).where(WorkAttempt.c.WorkId.in_(sa.bindparam("work_ids", expanding=True)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class EndedAttempt:
    """What ``work_attempts_record`` writes for one attempt; its number comes from the table."""

    work_id: str
    pack_install_id: str
    worker_id: str
    started_at: dt.datetime | None
    finished_at: dt.datetime
    outcome: str
    error: str
    traceback: str | None = None


def work_attempts_record(connection: Connection, attempts: Sequence[EndedAttempt]) -> None:
    """Record ``attempts`` (of distinct generations the caller holds), each numbered after its generation's newest.

    One INSERT ... SELECT per attempt (an ``executemany``): a seek of the primary key's
    WorkId prefix for the number, and the row.
    """
    if not attempts:
        return
    connection.execute(
        _RECORD,
        [
            {
                "work_id": a.work_id,
                "value_PackInstallId": a.pack_install_id,
                "value_WorkerId": a.worker_id,
                "value_StartedAt": a.started_at,
                "value_FinishedAt": a.finished_at,
                "value_Outcome": a.outcome,
                "value_Error": a.error,
                "value_Traceback": a.traceback,
            }
            for a in attempts
        ],
    )


def work_attempts_newest(connection: Connection, work_id: str, limit: int) -> list[DbRow]:
    """The generation's newest ``limit`` attempts, newest first (its primary key's WorkId prefix, backwards).

    Attempts are numbered 1, 2, ... without gaps (never deleted one by one), so the first row's
    ``Attempt`` is how many the generation has.
    """
    return list(connection.execute(_NEWEST, {"work_id": work_id, "limit": limit}))


def work_attempts_delete(connection: Connection, work_ids: Sequence[str]) -> int:
    """Delete every attempt of the generations ``work_ids`` (retention prunes them); return the rows deleted."""
    if not work_ids:
        return 0
    return int(connection.execute(_DELETE, {"work_ids": list(work_ids)}).rowcount)
