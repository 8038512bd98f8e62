"""Worker payload reads: exactly the members of the claimed generation, in ordinal order.

Membership comes only from the persisted interval [InputStartOrdinal, LaneOrdinal] and the
exact projection key of the WorkId remembered at claim: never from timestamps, Event status,
delivery order or retained history. Missing membership is an error, never a fallback to the
selected payload. The member count its admission recorded (``AdmittedMemberCount``, when
known: decision 149) and the one recorded by the first claim (``ClaimedMemberCount``) must
still hold: a lost middle member answers DATA_LOSS, never the remaining members (decision 110).
A replay generation's worker also reads the members of the generations it replays
(``load_replayed_inputs``), by their persisted ranges and with the same checks (decision 173).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from sqlalchemy.engine import Connection, Engine

from nexuscrm_connectors import pruned
from nexuscrm_connectors.context import Context
from nexuscrm_connectors.errors import MembershipMissing, NotAReplay, ProtocolMissing
from nexuscrm_connectors.queries import DbRow
from nexuscrm_connectors.queries import events as events_sql
from nexuscrm_connectors.queries import work_items as work_items_sql
from nexuscrm_connectors.queries.claims import LeasedWork
from nexuscrm_connectors.queries.work_items import WorkRow
from nexuscrm_connectors.queue.claims import current_lease
from nexuscrm_connectors.settings import Settings
from nexuscrm_runtime.clock import DatabaseClock
from nexuscrm_schema.member_counts import admitted_count
from workqueue.values import InputPage


def load_inputs(context: Context, work_id: str, lease_token: str, page_size: int = 0) -> Iterator[InputPage]:
    """Stream the members of a held generation in pages of ``page_size`` (0 = default) members.

    A page also holds at most ``settings.max_page_bytes`` of payload (at least one member),
    so a page of large payloads stays below a client's message limit (gRPC's 4 MiB default).

    The lease is checked before every page, so a worker that lost its lease stops reading.
    Raises ``MembershipMissing`` when the range is absent (old-protocol work), when the first
    or selected member is missing, when the range holds another number of Events than its
    admission recorded (when known), or fewer than it did when the generation was first
    claimed (a member lost since), or when the streamed set disagrees with the counted one.
    """
    engine, settings, clock = context.engine, context.settings, context.clock
    size = settings.page_size(page_size)
    # The first page shares the lease check and the count's connection: most generations
    # fit in one page, and each checkout costs the pool's liveness ping.
    with engine.connect() as connection:
        row = current_lease(connection, work_id, lease_token, clock)
        count = _member_count(connection, row)
        first = _page(connection, settings, row, _start(row) - 1, row.LaneOrdinal, size)
    pages = _Pages(engine, settings, clock, work_id, lease_token, size)
    for rows, last in pages.checked(row, count, first):
        yield InputPage(inputs=tuple(events_sql.input_value(r) for r in rows), last=last, member_count=count)


def load_replayed_inputs(context: Context, work_id: str, lease_token: str, page_size: int = 0) -> Iterator[InputPage]:
    """Stream, for a held replay generation, the members of every generation it replays, oldest first.

    The replayed generation's members, and before them those of the generation it replays in
    turn (a replay of a replay), each generation's in ordinal order and each input marked
    with its generation's WorkId; the held generation's own members are ``load_inputs``'.
    Every replayed range is read and checked as ``load_inputs`` reads and checks a claimed
    one (by its persisted range and exact identity; a lost member is ``MembershipMissing``),
    under the held generation's lease, checked before every page. Raises ``NotAReplay`` for
    a generation without ReplayOfWorkId and ``WorkPruned`` when retention pruned a replayed
    generation (its inputs are gone).
    """
    engine, settings, clock = context.engine, context.settings, context.clock
    size = settings.page_size(page_size)
    with engine.connect() as connection:
        row = current_lease(connection, work_id, lease_token, clock)
        if row.ReplayOfWorkId is None:
            raise NotAReplay(f"work {work_id} is not a replay: its inputs are all its own (LoadInputs)")
        chain = replayed_chain(connection, row.ReplayOfWorkId)
        counts = [_member_count(connection, replayed) for replayed in chain]
    pages = _Pages(engine, settings, clock, work_id, lease_token, size)
    total = sum(counts)
    for index, (replayed, count) in enumerate(zip(chain, counts, strict=True)):
        first = pages.after(replayed, _start(replayed) - 1)
        for rows, last in pages.checked(replayed, count, first):
            yield InputPage(
                inputs=tuple(events_sql.input_value(r, replayed_work_id=replayed.WorkId) for r in rows),
                last=last and index == len(chain) - 1,
                member_count=total,
            )


def replayed_chain(connection: Connection, replay_of_work_id: str) -> list[WorkRow]:
    """The generation ``replay_of_work_id`` names and those it replays in turn, oldest first.

    Raises ``WorkPruned`` (or ``WorkNotFound``) naming the first one retention took, and
    ``ProtocolMissing`` for old-protocol work, whose range was never recorded.
    """
    chain: list[WorkRow] = []
    link: str | None = replay_of_work_id
    while link is not None:
        found = work_items_sql.work_item_get(connection, link)
        if found is None:
            pruned.refuse_if_pruned(connection, link)
        if found.InputStartOrdinal is None:
            raise ProtocolMissing(f"work {link} is old-protocol work; its inputs cannot be replayed")
        chain.append(found)
        link = found.ReplayOfWorkId
    chain.reverse()
    return chain


def _start(row: WorkRow) -> int:
    """``row``'s InputStartOrdinal; ``MembershipMissing`` for a range never recorded (old-protocol work)."""
    if row.InputStartOrdinal is None:
        raise MembershipMissing(f"work {row.WorkId} has no InputStartOrdinal: its membership was never recorded")
    return row.InputStartOrdinal


def _member_count(connection: Connection, row: WorkRow) -> int:
    """How many Events ``row``'s range holds now."""
    return events_sql.event_range_count(connection, row.PackInstallId, row.member_key, _start(row), row.LaneOrdinal)


class _Pages:
    """The pages of generations' ranges read under one held lease (checked before each page)."""

    def __init__(
        self, engine: Engine, settings: Settings, clock: DatabaseClock, work_id: str, lease_token: str, size: int
    ) -> None:
        self._engine, self._settings, self._clock = engine, settings, clock
        self._work_id, self._lease_token, self._size = work_id, lease_token, size

    def after(self, work: WorkRow, ordinal: int) -> tuple[list[DbRow], bool]:
        """The page of ``work``'s members after ``ordinal``, once the lease is checked again."""
        with self._engine.connect() as connection:
            current_lease(connection, self._work_id, self._lease_token, self._clock)
            return _page(connection, self._settings, work, ordinal, work.LaneOrdinal, self._size)

    def checked(self, work: WorkRow, count: int, first: tuple[list[DbRow], bool]) -> Iterator[tuple[list[DbRow], bool]]:
        """``work``'s members page by page from ``first`` on, each page checked against its counts.

        ``count``: the members its range held when the read began.
        """
        start, end, work_id = work.InputStartOrdinal, work.LaneOrdinal, work.WorkId
        admitted = admitted_count(work)
        rows, last = first
        streamed = 0
        while True:
            if streamed == 0 and (not rows or rows[0].EnqueueOrdinal != start):
                raise MembershipMissing(f"work {work_id}: its first input (ordinal {start}) is missing")
            if streamed == 0 and admitted is not None and count != admitted:
                raise MembershipMissing.admitted_count_differs(work_id, start, end, count, admitted)
            # Fewer only: counts recorded before decision 110's second amendment may be low.
            if streamed == 0 and work.ClaimedMemberCount is not None and count < work.ClaimedMemberCount:
                raise MembershipMissing(
                    f"work {work_id}: its range [{start}, {end}] holds {count} inputs "
                    f"but held {work.ClaimedMemberCount} when it was claimed"
                )
            streamed += len(rows)
            last = last or not rows or rows[-1].EnqueueOrdinal == end
            if last and (not rows or rows[-1].EnqueueOrdinal != end):
                raise MembershipMissing(f"work {work_id}: its selected input (ordinal {end}) is missing")
            if last and streamed != count:
                raise MembershipMissing(f"work {work_id}: streamed {streamed} inputs but the range holds {count}")
            yield rows, last
            if last:
                return
            rows, last = self.after(work, rows[-1].EnqueueOrdinal)


def _page(
    connection: Connection, settings: Settings, work: WorkRow, after: int, end: int, size: int
) -> tuple[list[DbRow], bool]:
    """The next members after ``after`` within ``size`` members and the byte budget; and whether none follow.

    One statement (``event_range_page``): a page's sizes come from Event.PayloadBytes.
    """
    rows = events_sql.event_range_page(
        connection, work.PackInstallId, work.member_key, after, end, size, settings.max_page_bytes
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
        events_sql.EventRange(w.PackInstallId, w.member_key, w.InputStartOrdinal - 1, w.LaneOrdinal) for w in works
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
