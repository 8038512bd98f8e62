"""The claim and the end of an attempt: candidates, the lease UPDATE, heartbeat, complete and fail statements."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections.abc import Collection, Mapping, Sequence
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from nexuscrm_connectors.queries import order_policy as order_policy_sql
from nexuscrm_connectors.queries.work_items import MEMBER_KEY, HeldWork, WorkRow
from nexuscrm_runtime.clock import NOW_PARAMETER, DatabaseClock, now_parameter_shifted
from nexuscrm_schema.tables import (
    ConnectorProjectionProtocol,
    Event,
    FlowVersionTrack,
    PackInstall,
    WorkItem,
)
from workqueue import WorkStatus


class ClaimCandidate(NamedTuple):
    """A row of ``work_items_claimable``: what a claim decides on, with the database's ``Now``."""

    WorkId: str
    PackInstallId: str
    ProjectionKey: str
    Status: str
    ClaimableAt: dt.datetime
    LeaseToken: str | None
    LeaseOwner: str | None  # with ClaimedAt: an expired lease's attempt, as its history records it
    ClaimedAt: dt.datetime | None
    Attempt: int
    MaxAttempts: int
    InputStartOrdinal: int | None
    LaneOrdinal: int
    SuccessorWorkId: str | None
    RunsBeforeWorkId: str | None
    InputKey: str | None
    BuildRun: bool | None
    Now: dt.datetime

    @property
    def member_key(self) -> str:
        """As ``WorkRow.member_key``."""
        return self.InputKey or self.ProjectionKey


@dataclasses.dataclass(frozen=True, slots=True)
class LeasedWork(WorkRow):
    """A generation a claim leased (``work_items_leased``), with its selected Event's ordinal (None: missing).

    Native work only (a claim refuses work without an InputStartOrdinal), so its range has a start.
    """

    InputStartOrdinal: int
    SelectedOrdinal: int | None


class ServedPack(NamedTuple):
    """A pack a claim asked for, with ``Native``: its protocol row's key, None without one.

    ``Operated``: whether an operator's pause or order policy may apply to it
    (``order_policy_sql.pack_operated``); only such packs' candidate reads carry those conditions.
    """

    PackInstallId: str
    Native: str | None
    Operated: bool


# ``work_items_lock``'s statement, built once. Parameters: ``work_ids`` (expanding) and the clock's.
_LOCK_HELD = (
    sa.select(WorkItem, NOW_PARAMETER.label("Now"))
    .where(WorkItem.c.WorkId.in_(sa.bindparam("work_ids", expanding=True)))
    .with_for_update()
)


def work_items_lock(connection: Connection, work_ids: Collection[str], clock: DatabaseClock) -> dict[str, HeldWork]:
    """WorkItems by primary key, locked (FOR UPDATE), each with ``clock``'s now as ``Now``; one statement.

    The lock keeps the leases read unchanged until the caller's compare-and-set in the same
    transaction (``work_items_complete``), so its row count is exact.
    """
    rows = connection.execute(_LOCK_HELD, {"work_ids": list(work_ids), **clock.parameters()})
    return {row.WorkId: HeldWork(*row) for row in rows}


@functools.lru_cache(maxsize=16)
def _complete_statement(size: int) -> sa.Update:
    """``work_items_complete``'s UPDATE of ``size`` leases; built once per size (padded, as ``_link_statement``)."""
    leases = [
        sa.and_(
            WorkItem.c.WorkId == sa.bindparam(f"work_{n}"),
            WorkItem.c.LeaseToken == sa.bindparam(f"token_{n}"),
            WorkItem.c.LeaseExpiresAt == sa.bindparam(f"expires_{n}"),
        )
        for n in range(size)
    ]
    return (
        sa.update(WorkItem)
        .where(sa.or_(*leases), WorkItem.c.Status == WorkStatus.PROCESSING)
        .values(Status=WorkStatus.COMPLETED, ClaimableAt=None, FinishedAt=sa.bindparam("finished_at"))
    )


def work_items_complete(connection: Connection, held: Sequence[HeldWork], now: dt.datetime) -> int:
    """Complete the generations ``held`` (rows as read), each only if it still holds the lease read; one UPDATE.

    The compare-and-set of each row is its WorkId, lease token and lease expiry as read, and
    processing; an OR of primary-key conjunctions (as ``selected_events_set_status``), padded to
    a power of two by repeating the last row. Returns the row count for the caller to compare
    with ``len(held)``.
    """
    if not held:
        return 0
    padded = list(held)
    size = 1 << (len(padded) - 1).bit_length()
    padded += padded[-1:] * (size - len(padded))
    parameters: dict[str, Any] = {"finished_at": now}
    for n, row in enumerate(padded):
        parameters |= {f"work_{n}": row.WorkId, f"token_{n}": row.LeaseToken, f"expires_{n}": row.LeaseExpiresAt}
    return connection.execute(_complete_statement(size), parameters).rowcount


# A build's generation (BuildRun) yields to the live work of its pack that is due now, and to its
# version's rate bound: the inputs of the version's generations claimed in the last second
# (decision 185). Only claims that name Flow versions carry these conditions. Each is built per
# branch with the branch's pack as a parameter, not correlated to the candidate's pack: the live
# work read is then evaluated once per statement, and every read is an index range of constants
# (a correlated pack let MariaDB read the pack's whole index per candidate).
_LIVE_DUE = sa.alias(WorkItem, "live_due")
_RECENT = sa.alias(WorkItem, "recent")
_LAST_SECOND = now_parameter_shifted(-dt.timedelta(seconds=1))


def _build_yields(pack: sa.BindParameter[str]) -> sa.ColumnElement[bool]:
    """The candidate is a build's generation and ``pack`` has live work waiting for over a second.

    Live work claimed as it comes never holds a build back (a pack ingesting steadily would
    starve it); live work that waits means the live pools are behind, and the build gives way.
    """
    return sa.and_(
        WorkItem.c.BuildRun.is_(True),
        sa.select(_LIVE_DUE.c.WorkId)
        .where(
            _LIVE_DUE.c.PackInstallId == pack,
            _LIVE_DUE.c.Status.in_([WorkStatus.PENDING, WorkStatus.RETRY]),
            _LIVE_DUE.c.ClaimableAt <= _LAST_SECOND,
            sa.or_(_LIVE_DUE.c.BuildRun.is_(None), _LIVE_DUE.c.BuildRun.is_(False)),
        )
        .limit(1)
        .exists(),
    )


def _recent_inputs(pack: sa.BindParameter[str], *held: sa.ColumnElement[bool]) -> sa.ScalarSelect[Any]:
    """The inputs of the candidate's version's generations claimed in the last second that are ``held``."""
    return (
        sa.select(sa.func.coalesce(sa.func.sum(_RECENT.c.AdmittedMemberCount), 0))
        .where(
            _RECENT.c.PackInstallId == pack,
            *held,
            _RECENT.c.WorkType == WorkItem.c.WorkType,
            _RECENT.c.FlowVersion == WorkItem.c.FlowVersion,
            _RECENT.c.ClaimedAt > _LAST_SECOND,
        )
        .correlate(WorkItem)  # nested two levels down, auto-correlation would not reach it (a cross join)
        .scalar_subquery()
    )


def _build_rate_reached(pack: sa.BindParameter[str]) -> sa.ColumnElement[bool]:
    """The candidate is a build's generation and its version claimed its bound's inputs in the last second.

    A generation claimed in the last second is still held (processing, or waiting to retry: an
    ix_workitem_claim range of the pack's few such rows) or finished since (an
    ix_workitem_retention range from a second ago): never a read of the pack's history.
    """
    held = _recent_inputs(pack, _RECENT.c.Status.in_([WorkStatus.PROCESSING, WorkStatus.RETRY]))
    finished = _recent_inputs(
        pack, _RECENT.c.Status.in_([WorkStatus.COMPLETED, WorkStatus.FAILED]), _RECENT.c.FinishedAt > _LAST_SECOND
    )
    return sa.and_(
        WorkItem.c.BuildRun.is_(True),
        sa.select(FlowVersionTrack.c.Version)
        .where(
            FlowVersionTrack.c.PackInstallId == WorkItem.c.PackInstallId,
            FlowVersionTrack.c.WorkType == WorkItem.c.WorkType,
            FlowVersionTrack.c.Version == WorkItem.c.FlowVersion,
            FlowVersionTrack.c.MaxInputsPerSecond <= held + finished,
        )
        .exists(),
    )


@functools.lru_cache(maxsize=64)
def _claimable_statement(operated: tuple[bool, ...], by_work_type: bool, versions: bool) -> sa.CompoundSelect[Any]:
    """The candidate read of ``work_items_claimable`` for one pack per item of ``operated``; built once per shape.

    Parameters: ``pack_<n>`` for each pack, ``limit``, the clock's offset
    (``DatabaseClock.parameters``), if ``by_work_type`` ``work_types`` and if ``versions``
    ``flow_versions``. A pack whose item is True carries the operator's conditions (pauses,
    order policy). Without ``versions`` only the generations of the inputs' own keys are
    candidates; with them only those versions' tracks', a build's yielding to live work.
    """
    selects = []
    for n, decided in enumerate(operated):
        for status in (WorkStatus.PENDING, WorkStatus.RETRY, WorkStatus.PROCESSING):
            statement = (
                sa.select(
                    WorkItem.c.WorkId,
                    WorkItem.c.PackInstallId,
                    WorkItem.c.ProjectionKey,
                    WorkItem.c.Status,
                    WorkItem.c.ClaimableAt,
                    WorkItem.c.LeaseToken,
                    WorkItem.c.LeaseOwner,
                    WorkItem.c.ClaimedAt,
                    WorkItem.c.Attempt,
                    WorkItem.c.MaxAttempts,
                    WorkItem.c.InputStartOrdinal,
                    WorkItem.c.LaneOrdinal,
                    WorkItem.c.SuccessorWorkId,
                    WorkItem.c.RunsBeforeWorkId,
                    WorkItem.c.InputKey,
                    WorkItem.c.BuildRun,
                    NOW_PARAMETER.label("Now"),
                )
                .where(
                    WorkItem.c.PackInstallId == sa.bindparam(f"pack_{n}"),
                    WorkItem.c.Status == status,
                    WorkItem.c.ClaimableAt <= NOW_PARAMETER,
                )
                .order_by(WorkItem.c.ClaimableAt)
                .limit(sa.bindparam("limit", type_=sa.Integer()))
            )
            if by_work_type:
                statement = statement.where(WorkItem.c.WorkType.in_(sa.bindparam("work_types", expanding=True)))
            if versions:
                statement = statement.where(
                    WorkItem.c.FlowVersion.in_(sa.bindparam("flow_versions", expanding=True)),
                    ~_build_yields(sa.bindparam(f"pack_{n}")),
                    ~_build_rate_reached(sa.bindparam(f"pack_{n}")),
                )
            else:
                statement = statement.where(WorkItem.c.FlowVersion.is_(None))
            if decided:
                statement = statement.where(
                    order_policy_sql.candidate_operable(sa.bindparam(f"pack_{n}"), NOW_PARAMETER)
                )
            selects.append(statement.subquery().select())
    return sa.union_all(*selects)


def work_items_claimable(
    connection: Connection,
    pack_install_ids: Sequence[str],
    work_types: Sequence[str],
    clock: DatabaseClock,
    limit: int,
    operated: Collection[str] | None = None,
    flow_versions: Sequence[str] = (),
) -> list[ClaimCandidate]:
    """The ``limit`` oldest claim candidates: pending, due retry and lease-expired processing work.

    ``operated``: the packs an operator's pause or order policy may apply to
    (``order_policy_sql.pack_operated``); only their reads carry those conditions. None: every pack.

    Due at ``clock``'s now, which each row carries as column ``Now``: the instant the claim
    transaction decides with.

    One ordered, limited range scan of ix_workitem_claim per (pack, status), combined with
    UNION ALL, so a large backlog is never sorted as a whole; the branches' rows are merged
    by ClaimableAt with a stable sort (ties keep each branch's index order). Each row carries
    what a claim decides on: its state, attempts, range and identity. The statement is built
    once per shape of packs (docs/performance.md, "Tuning notes formerly in docs/decisions").
    """
    if not pack_install_ids:
        return []
    parameters: dict[str, Any] = {"limit": limit, **clock.parameters()}
    parameters |= {f"pack_{n}": pack_install_id for n, pack_install_id in enumerate(pack_install_ids)}
    if work_types:
        parameters["work_types"] = list(work_types)
    if flow_versions:
        parameters["flow_versions"] = list(flow_versions)
    decided = tuple(operated is None or pack in operated for pack in pack_install_ids)
    statement = _claimable_statement(decided, bool(work_types), bool(flow_versions))
    rows = map(ClaimCandidate._make, connection.execute(statement, parameters))
    return sorted(rows, key=lambda row: row.ClaimableAt)[:limit]


def work_items_claim(
    connection: Connection, work_ids: Sequence[str], now: dt.datetime, grant: Mapping[str, Any]
) -> int:
    """Lease every generation of ``work_ids`` that is still claimable at ``now``, in one UPDATE.

    The compare-and-set is the claimability condition itself, evaluated on each row's current
    version under its row lock: pending or retry, or processing with an expired lease and an
    attempt left, and ClaimableAt <= ``now``. A row another claim took meanwhile carries a
    future ClaimableAt and is skipped, so ``grant`` (``LeaseToken`` and the other lease
    columns, ``ClaimedAt`` among them) marks exactly the rows this statement won: the caller reads them back by token.
    An expired lease counts as a failed attempt (Attempt + 1). Primary-key lookups; returns
    the row count.
    """
    if not work_ids:
        return 0
    parameters = {"work_ids": list(work_ids), "now": now, **{f"grant_{name}": value for name, value in grant.items()}}
    return connection.execute(_claim_statement(tuple(grant)), parameters).rowcount


@functools.lru_cache(maxsize=4)
def _claim_statement(granted: tuple[str, ...]) -> sa.Update:
    """The lease UPDATE of ``work_items_claim`` setting the ``granted`` columns; built once.

    Parameters: ``work_ids``, ``now`` and ``grant_<column>`` for each granted column.
    """
    expired = WorkItem.c.Status == WorkStatus.PROCESSING
    claimable = sa.or_(
        WorkItem.c.Status.in_([WorkStatus.PENDING, WorkStatus.RETRY]),
        sa.and_(expired, WorkItem.c.Attempt + 1 < WorkItem.c.MaxAttempts),
    )
    # Attempt first: MySQL evaluates SET assignments left to right, so the CASE must see the
    # old Status (SQLite and TiDB read old values anyway).
    attempt = WorkItem.c.Attempt + sa.case((expired, 1), else_=0)
    assignments = [
        (WorkItem.c.Attempt, attempt),
        *((WorkItem.c[name], sa.bindparam(f"grant_{name}", type_=WorkItem.c[name].type)) for name in granted),
    ]
    return (
        sa.update(WorkItem)
        .where(
            WorkItem.c.WorkId.in_(sa.bindparam("work_ids", expanding=True)),
            WorkItem.c.ClaimableAt <= sa.bindparam("now", type_=WorkItem.c.ClaimableAt.type),
            claimable,
        )
        .ordered_values(*assignments)
    )


_MEMBER_COUNT_RECORD = (
    sa.update(WorkItem)
    .where(
        WorkItem.c.WorkId.in_(sa.bindparam("work_ids", expanding=True)),
        WorkItem.c.LeaseToken == sa.bindparam("lease_token"),
        WorkItem.c.ClaimedMemberCount.is_(None),
    )
    .values(
        ClaimedMemberCount=sa.select(sa.func.count())
        .select_from(Event)
        .where(
            Event.c.PackInstallId == WorkItem.c.PackInstallId,
            Event.c.ProjectionKey == MEMBER_KEY,
            Event.c.EnqueueOrdinal.between(WorkItem.c.InputStartOrdinal, WorkItem.c.LaneOrdinal),
        )
        .with_hint(Event, "FORCE INDEX (ix_event_source_lane)", dialect_name="mysql")
        .correlate(WorkItem)
        .scalar_subquery()
    )
)


def work_items_record_member_count(connection: Connection, work_ids: Sequence[str], lease_token: str) -> int:
    """Record the member count of each generation of ``work_ids`` that ``lease_token`` leased for the first time.

    ``ClaimedMemberCount`` is the number of the identity's Events in the generation's range,
    counted on ix_event_source_lane; the range is frozen from the first claim, so LoadInputs
    can detect a lost member; later claims keep the first count. A statement
    of its own, after the lease UPDATE: an UPDATE that waited for the row lock of an
    admission extending the generation re-reads the row, but on MySQL-protocol servers its
    subqueries keep the read view taken before the wait and would miss the extension's
    Events. A new statement reads them (READ COMMITTED). Primary-key lookups, and the count
    named to ix_event_source_lane (``FORCE INDEX`` on MySQL-protocol servers): with the
    statistics InnoDB keeps by itself MariaDB counted on the primary key by PackInstallId
    alone, reading every Event of the pack for each claimed generation.
    """
    return connection.execute(_MEMBER_COUNT_RECORD, {"work_ids": list(work_ids), "lease_token": lease_token}).rowcount


_LEASED = (
    sa.select(WorkItem, Event.c.EnqueueOrdinal.label("SelectedOrdinal"))
    .select_from(
        WorkItem.outerjoin(
            Event,
            sa.and_(
                Event.c.PackInstallId == WorkItem.c.PackInstallId,
                Event.c.EnqueueOrdinal == WorkItem.c.LaneOrdinal,
                Event.c.ProjectionKey == MEMBER_KEY,
            ),
        )
    )
    .where(
        WorkItem.c.WorkId.in_(sa.bindparam("work_ids", expanding=True)),
        WorkItem.c.LeaseToken == sa.bindparam("lease_token"),
    )
)


def work_items_leased(connection: Connection, work_ids: Sequence[str], lease_token: str) -> list[LeasedWork]:
    """The generations of ``work_ids`` that hold ``lease_token``, each with its selected Event's ordinal.

    ``SelectedOrdinal`` is None when the Event at the generation's LaneOrdinal (its selected
    Event, of its identity) is missing. Primary-key lookups of WorkItem and Event.
    """
    rows = connection.execute(_LEASED, {"work_ids": list(work_ids), "lease_token": lease_token})
    return [LeasedWork(*row) for row in rows]


def work_item_update_if(connection: Connection, work_id: str, expect: dict[str, Any], values: dict[str, Any]) -> int:
    """Compare-and-set one WorkItem; return the row count (0 or 1).

    The update applies only if every column in ``expect`` still holds its value (None
    compares with IS NULL).
    """
    compared = tuple((column, value is None) for column, value in expect.items())
    parameters = {
        "work_id": work_id,
        **{f"expect_{column}": value for column, value in expect.items() if value is not None},
        **{f"value_{column}": value for column, value in values.items()},
    }
    return connection.execute(_update_if_statement(compared, tuple(values)), parameters).rowcount


@functools.lru_cache(maxsize=64)
def _update_if_statement(compared: tuple[tuple[str, bool], ...], written: tuple[str, ...]) -> sa.Update:
    """``work_item_update_if``'s statement; built once per shape.

    ``compared``: (column, whether it must be NULL); ``written``: the columns set. Parameters:
    ``work_id``, ``expect_<column>`` for each compared column not NULL, ``value_<column>``.
    """
    conditions = [WorkItem.c.WorkId == sa.bindparam("work_id")]
    for column, null in compared:
        expected = sa.bindparam(f"expect_{column}", type_=WorkItem.c[column].type)
        conditions.append(WorkItem.c[column].is_(None) if null else WorkItem.c[column] == expected)
    assignments = {column: sa.bindparam(f"value_{column}", type_=WorkItem.c[column].type) for column in written}
    return sa.update(WorkItem).where(*conditions).values(assignments)


# Every installed pack with its protocol row (Native is None without one) and whether an operator's
# pause or order policy may apply to it; and those named.
_PACKS = sa.select(
    PackInstall.c.PackInstallId,
    ConnectorProjectionProtocol.c.PackInstallId.label("Native"),
    order_policy_sql.pack_operated(PackInstall.c.PackInstallId, NOW_PARAMETER).label("Operated"),
).outerjoin(ConnectorProjectionProtocol, ConnectorProjectionProtocol.c.PackInstallId == PackInstall.c.PackInstallId)
_PACKS_NAMED = _PACKS.where(PackInstall.c.PackInstallId.in_(sa.bindparam("requested", expanding=True)))


def packs_with_protocol(connection: Connection, requested: Sequence[str], clock: DatabaseClock) -> list[ServedPack]:
    """The requested packs (every pack when none) with ``Native``, their protocol row's key (None without one)."""
    if requested:
        rows = connection.execute(_PACKS_NAMED, {"requested": list(requested), **clock.parameters()})
    else:
        rows = connection.execute(_PACKS, clock.parameters())
    return list(map(ServedPack._make, rows))
