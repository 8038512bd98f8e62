"""Every statement of the dead-letter reads: a pack's generations that failed for good, never replayed nor skipped.

Builders are named noun + verb, as in the package's other modules; each takes the caller's connection. A read
examines a bounded window of the pack's failed generations, oldest finished first, along
ix_workitem_retention (PackInstallId, Status, FinishedAt; InnoDB's entries end with the
WorkId, the keyset's tie-breaker), and evaluates the operator's filters on that window only:
a filter matching few rows of a long history gives a short page, never a long scan.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from nexuscrm_connectors.queries import DbRow
from nexuscrm_connectors.queries import order_policy as order_policy_sql
from nexuscrm_connectors.queries.work_items import WorkRow
from nexuscrm_schema.tables import WorkItem
from workqueue import WorkStatus


@dataclasses.dataclass(frozen=True, kw_only=True)
class Filter:
    """Which dead letters a read keeps; every field set narrows it (None and "" match all).

    ``projection_key``: one identity; ``work_type``: one work type; ``finished_after`` and
    ``finished_before``: FinishedAt bounds (inclusive, exclusive; naive UTC);
    ``error_contains``: text LastError contains (case as stored).
    """

    projection_key: str | None = None
    work_type: str = ""
    finished_after: dt.datetime | None = None
    finished_before: dt.datetime | None = None
    error_contains: str = ""


def _escaped(text: str) -> str:
    """``text`` as a LIKE pattern's literal part (a backslash escapes ``%``, ``_`` and itself)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _matches(table: Any, wanted: Filter) -> sa.ColumnElement[bool]:
    """The filter's residual conditions (not served by the window's index) on ``table``'s row."""
    conditions: list[sa.ColumnElement[bool]] = [
        table.c.InputStartOrdinal.is_not(None),
        order_policy_sql.unresolved(table),
    ]
    if wanted.projection_key is not None:
        conditions.append(table.c.ProjectionKey == wanted.projection_key)
    if wanted.work_type:
        conditions.append(table.c.WorkType == wanted.work_type)
    if wanted.error_contains:
        conditions.append(table.c.LastError.like(f"%{_escaped(wanted.error_contains)}%", escape="\\"))
    return sa.and_(*conditions)


def _window(pack_install_id: str, wanted: Filter, after: tuple[dt.datetime, str] | None, limit: int) -> sa.Subquery:
    """The WorkIds of the pack's next ``limit`` failed generations after ``after`` (FinishedAt, WorkId)."""
    statement = (
        sa.select(WorkItem.c.WorkId, WorkItem.c.FinishedAt)
        .where(
            WorkItem.c.PackInstallId == pack_install_id,
            WorkItem.c.Status == WorkStatus.FAILED,
            WorkItem.c.FinishedAt.is_not(None),
        )
        .order_by(WorkItem.c.FinishedAt, WorkItem.c.WorkId)
        .limit(limit)
    )
    if wanted.finished_after is not None:
        statement = statement.where(WorkItem.c.FinishedAt >= wanted.finished_after)
    if wanted.finished_before is not None:
        statement = statement.where(WorkItem.c.FinishedAt < wanted.finished_before)
    if after is not None:
        finished, work_id = after
        statement = statement.where(
            sa.or_(
                WorkItem.c.FinishedAt > finished,
                sa.and_(WorkItem.c.FinishedAt == finished, WorkItem.c.WorkId > work_id),
            )
        )
    return statement.subquery("Window")


def _window_rows(
    pack_install_id: str, wanted: Filter, after: tuple[dt.datetime, str] | None, limit: int, *columns: Any
) -> sa.Select[Any]:
    window = _window(pack_install_id, wanted, after, limit)
    # The window drives the join (STRAIGHT_JOIN on MySQL-protocol servers): with a small table
    # MariaDB otherwise scans WorkItem and probes the window.
    return (
        sa.select(*columns, sa.case((_matches(WorkItem, wanted), 1), else_=0).label("Matches"))
        .select_from(window.join(WorkItem, WorkItem.c.WorkId == window.c.WorkId))
        .prefix_with("STRAIGHT_JOIN", dialect="mysql")
    )


class WindowRow(NamedTuple):
    """A failed generation of a dead-letter window, when it failed, and whether the operator's filter keeps it."""

    work: WorkRow
    FinishedAt: dt.datetime
    Matches: bool


def dead_letters_window(
    connection: Connection, pack_install_id: str, wanted: Filter, after: tuple[dt.datetime, str] | None, limit: int
) -> list[WindowRow]:
    """The next ``limit`` failed generations of the pack after ``after``, each with ``Matches`` (the filter).

    Oldest finished first. Every row examined is returned, so the caller's next window starts
    after the last one whether it matched or not. One range of ix_workitem_retention, then
    primary-key lookups of the window's rows and one ix_workitem_replay_of seek each.
    """
    rows = connection.execute(_window_rows(pack_install_id, wanted, after, limit, WorkItem))
    window = [WindowRow(WorkRow(*row[:-1]), row.FinishedAt, bool(row.Matches)) for row in rows]
    # Ordered here, not by the statement: the window is bounded, and SQLite would sort the join.
    return sorted(window, key=lambda row: (row.FinishedAt, row.work.WorkId))


def dead_letters_identities(connection: Connection, pack_install_id: str, wanted: Filter, limit: int) -> list[DbRow]:
    """``ProjectionKey`` and ``Matches`` of the pack's first ``limit`` failed generations: what a count reads.

    The same bounded window as ``dead_letters_window``, without LastError and the other columns.
    """
    statement = _window_rows(pack_install_id, wanted, None, limit, WorkItem.c.ProjectionKey)
    return list(connection.execute(statement))
