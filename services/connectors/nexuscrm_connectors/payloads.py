"""Worker payload reads: exactly the members of the claimed generation, in ordinal order.

Membership comes only from the persisted interval [InputStartOrdinal, LaneOrdinal] and the
exact projection key of the WorkId remembered at claim: never from timestamps, Event status,
delivery order or retained history. Missing membership is an error, never a fallback to the
selected payload. The member count its admission recorded (``AdmittedMemberCount``, when
known: decision 149) and the one recorded by the first claim (``ClaimedMemberCount``) must
still hold: a lost middle member answers DATA_LOSS, never the remaining members (decision 110).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from sqlalchemy.engine import Connection, Engine

from nexuscrm_connectors.claims import current_lease
from nexuscrm_connectors.errors import MembershipMissing
from nexuscrm_connectors.queries import DbRow
from nexuscrm_connectors.queries import events as events_sql
from nexuscrm_connectors.queries.claims import LeasedWork
from nexuscrm_connectors.queries.work_items import WorkRow
from nexuscrm_connectors.settings import Settings
from nexuscrm_runtime.clock import DatabaseClock
from nexuscrm_schema.member_counts import admitted_count
from workqueue.values import InputPage


def load_inputs(
    engine: Engine, settings: Settings, clock: DatabaseClock, work_id: str, lease_token: str, page_size: int = 0
) -> Iterator[InputPage]:
    """Stream the members of a held generation in pages of ``page_size`` (0 = default) members.

    A page also holds at most ``settings.max_page_bytes`` of payload (at least one member),
    so a page of large payloads stays below a client's message limit (gRPC's 4 MiB default).

    The lease is checked before every page, so a worker that lost its lease stops reading.
    Raises ``MembershipMissing`` when the range is absent (old-protocol work), when the first
    or selected member is missing, when the range holds another number of Events than its
    admission recorded (when known), or fewer than it did when the generation was first
    claimed (a member lost since), or when the streamed set disagrees with the counted one.
    """
    size = settings.page_size(page_size)
    # The first page shares the lease check and the count's connection: most generations
    # fit in one page, and each checkout costs the pool's liveness ping.
    with engine.connect() as connection:
        row = current_lease(connection, work_id, lease_token, clock)
        start, end = row.InputStartOrdinal, row.LaneOrdinal
        if start is None:
            raise MembershipMissing(f"work {work_id} has no InputStartOrdinal: its membership was never recorded")
        count = events_sql.event_range_count(connection, row.PackInstallId, row.ProjectionKey, start, end)
        rows, last = _page(connection, settings, row, start - 1, end, size)
    admitted = admitted_count(row)
    streamed = 0
    while True:
        if streamed == 0 and (not rows or rows[0].EnqueueOrdinal != start):
            raise MembershipMissing(f"work {work_id}: its first input (ordinal {start}) is missing")
        if streamed == 0 and admitted is not None and count != admitted:
            raise MembershipMissing.admitted_count_differs(work_id, start, end, count, admitted)
        # Fewer only: counts recorded before decision 110's second amendment may be low.
        if streamed == 0 and row.ClaimedMemberCount is not None and count < row.ClaimedMemberCount:
            raise MembershipMissing(
                f"work {work_id}: its range [{start}, {end}] holds {count} inputs "
                f"but held {row.ClaimedMemberCount} when it was claimed"
            )
        streamed += len(rows)
        last = last or not rows or rows[-1].EnqueueOrdinal == end
        if last and (not rows or rows[-1].EnqueueOrdinal != end):
            raise MembershipMissing(f"work {work_id}: its selected input (ordinal {end}) is missing")
        if last and streamed != count:
            raise MembershipMissing(f"work {work_id}: streamed {streamed} inputs but the range holds {count}")
        yield InputPage(
            inputs=tuple(events_sql.input_value(r) for r in rows),
            last=last,
            member_count=count,
        )
        if last:
            return
        with engine.connect() as connection:
            current_lease(connection, work_id, lease_token, clock)
            rows, last = _page(connection, settings, row, rows[-1].EnqueueOrdinal, end, size)


def _page(
    connection: Connection, settings: Settings, work: WorkRow, after: int, end: int, size: int
) -> tuple[list[DbRow], bool]:
    """The next members after ``after`` within ``size`` members and the byte budget; and whether none follow.

    One statement (``event_range_page``): a page's sizes come from Event.PayloadBytes.
    """
    rows = events_sql.event_range_page(
        connection, work.PackInstallId, work.ProjectionKey, after, end, size, settings.max_page_bytes
    )
    return rows, not rows or (rows[0].Candidates < size and len(rows) == rows[0].Candidates)


def whole_pages(connection: Connection, settings: Settings, works: Sequence[LeasedWork]) -> dict[str, InputPage]:
    """The whole membership of those of ``works`` that fit together in one page, by WorkId: a claim's inline inputs.

    ``works`` are WorkItem rows a claim has just leased, oldest first: their bounds are frozen
    (a claimed generation is never extended, invariant B), whether this runs in the claim's
    transaction or after its commit (decision 142). Two statements whatever their number: the
    members' sizes, then the payloads of those that fit. Together the inline inputs of one claim are at
    most one LoadInputs page: ``default_page_size`` members and ``max_page_bytes`` of payload
    (the claim's answer stays below a client's message limit); each generation takes its place
    if its whole membership fits in what the ones before it left. One that does not fit, or
    whose membership fails a check LoadInputs makes (first and selected member present, no
    fewer members than the first claim counted, as many as admission recorded), is left out:
    the worker streams it with LoadInputs, which answers every refusal.
    """
    room = size = settings.page_size(0)
    budget = settings.max_page_bytes
    ranges = [
        events_sql.EventRange(w.PackInstallId, w.ProjectionKey, w.InputStartOrdinal - 1, w.LaneOrdinal) for w in works
    ]
    fitting: list[tuple[WorkRow, events_sql.EventRange, int]] = []
    for work, members, sizes in zip(
        works, ranges, events_sql.event_ranges_sizes(connection, ranges, size), strict=True
    ):
        payload_bytes = sum(r.PayloadBytes for r in sizes)
        if len(sizes) <= room and payload_bytes <= budget and _whole(work, [r.EnqueueOrdinal for r in sizes]):
            room -= len(sizes)
            budget -= payload_bytes
            fitting.append((work, members, len(sizes)))
    if not fitting:
        return {}
    pages = events_sql.event_ranges_members(connection, [members for _, members, _ in fitting])
    return {
        work.WorkId: InputPage(inputs=tuple(events_sql.input_value(r) for r in rows), last=True, member_count=len(rows))
        for (work, _, count), rows in zip(fitting, pages, strict=True)
        if len(rows) == count
    }


def _whole(work: WorkRow, ordinals: Sequence[int]) -> bool:
    """Whether ``ordinals`` are a membership LoadInputs would stream whole: both ends, the counts it checks."""
    admitted = admitted_count(work)
    return (
        bool(ordinals)
        and ordinals[0] == work.InputStartOrdinal
        and ordinals[-1] == work.LaneOrdinal
        and (work.ClaimedMemberCount is None or len(ordinals) >= work.ClaimedMemberCount)
        and (admitted is None or len(ordinals) == admitted)
    )
