"""Failed work as a dead-letter queue: list, count, replay and skip a pack's generations that failed for good.

A dead letter is a native generation whose status is failed and of which no replay exists
(a replay that failed in turn is a dead letter of its own). Reads never change a row; they
examine a bounded window of the pack's failed generations, oldest finished first
(``dead_letters_sql``), so a page filtered down to few rows may be short, and its token
continues after the last generation examined.

A bulk replay is paged the same way: one call replays at most ``max_generations`` dead
letters, each in its own transaction (``replay.replay``, under the pack's row lock like
admission), and answers each WorkId: replayed (with its new generation), would be replayed
(dry run), or refused and why. Never one transaction for a filter that matches many rows.
One identity's dead letters are replayed in ordinal order: the window is ordered by
FinishedAt, and a successor is claimed only after its predecessor is terminal, so an
identity's generations finish in ordinal order; a page's dead letters are also replayed
identity by identity in LaneOrdinal order. Each replay of an identity whose newest generation
is not terminal (an earlier replay of this bulk replay) queues blocked behind it.

A bulk skip is the same paging with ``order_policy.skip`` as the act (decision 176). A bulk
call whose filter keeps no dead letter at all, on this page or an earlier one (the page token
says whether one did), is refused with ``NothingMatches`` (NOT_FOUND) and changes nothing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from collections.abc import Callable

from sqlalchemy.engine import Connection, Engine

from nexuscrm_connectors import page_tokens
from nexuscrm_connectors.context import Context
from nexuscrm_connectors.errors import ConnectorsError, UnknownPack
from nexuscrm_connectors.operating import generations
from nexuscrm_connectors.queries import dead_letters as dead_letters_sql
from nexuscrm_connectors.queries import operator_reads as operator_reads_sql
from nexuscrm_connectors.queries import work_items as work_items_sql
from nexuscrm_connectors.queries.dead_letters import Filter
from nexuscrm_connectors.queries.work_items import WorkRow
from nexuscrm_runtime.clock import iso_utc
from workqueue.errors import DomainError, ErrorKind, InvalidArgument
from workqueue.identity import FIELD_MAX_LENGTHS, decode_projection_key, validate_text
from workqueue.values import Route, WorkItemRow

SCAN_FACTOR = 10  # failed generations a page examines per dead letter asked for
COUNT_LIMIT = 100_000  # failed generations a count examines, oldest finished first
ERROR_TEXT_MAX_LENGTH = 1024  # characters of an error_contains filter
DEFAULT_BULK_BATCH = 100  # dead letters one bulk replay or skip call handles when the request says 0


def filter_of(
    pack_install_id: str,
    *,
    route: Route | None = None,
    work_type: str = "",
    finished_after: dt.datetime | None = None,
    finished_before: dt.datetime | None = None,
    error_contains: str = "",
) -> Filter:
    """A validated filter; ``InvalidArgument`` names the field at fault.

    ``route``: one identity (every field); ``work_type``: one work type (with a route, it must
    be the route's); the time bounds are naive UTC, ``finished_after`` before ``finished_before``.
    """
    if not pack_install_id:
        raise InvalidArgument("pack_install_id is required", field="pack_install_id")
    key = None
    if route is not None:
        key = generations.identity_key(pack_install_id, route)
        if work_type and work_type != route.work_type:
            raise InvalidArgument(
                f"work_type {work_type!r} differs from the route's {route.work_type!r}", field="work_type"
            )
    if work_type:
        validate_text("work_type", work_type, FIELD_MAX_LENGTHS["work_type"])
    if finished_after is not None and finished_before is not None and finished_after >= finished_before:
        raise InvalidArgument(
            f"finished_after ({iso_utc(finished_after)}) must be before finished_before ({iso_utc(finished_before)})",
            field="finished_after",
        )
    if error_contains:
        validate_text("error_contains", error_contains, ERROR_TEXT_MAX_LENGTH)
    return Filter(
        projection_key=key,
        work_type=work_type,
        finished_after=finished_after,
        finished_before=finished_before,
        error_contains=error_contains,
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeadLetterPage:
    """One page of dead letters, oldest finished first; ``next_page_token`` is "" after the last."""

    dead_letters: tuple[WorkItemRow, ...]
    next_page_token: str
    examined: int  # failed generations this page examined (dead or replayed, matching or not)


@dataclasses.dataclass(frozen=True, kw_only=True)
class IdentityCount:
    """How many dead letters one identity has."""

    route: Route
    dead_letters: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeadLetterCount:
    """Dead letters per identity; ``complete`` False when the count stopped at ``COUNT_LIMIT`` examined."""

    identities: tuple[IdentityCount, ...]
    total: int
    examined: int
    complete: bool


class Verdict(enum.StrEnum):
    """What a bulk replay or skip did with one dead letter."""

    REPLAYED = "replayed"
    WOULD_REPLAY = "would_replay"  # dry run
    SKIPPED = "skipped"
    WOULD_SKIP = "would_skip"  # dry run
    REFUSED = "refused"


class NothingMatches(ConnectorsError):
    """A bulk replay or skip whose filter keeps no dead letter of the pack: nothing to act on."""

    kind = ErrorKind.NOT_FOUND


@dataclasses.dataclass(frozen=True, kw_only=True)
class BulkAnswer:
    """One dead letter's answer: its replay's WorkId when replayed, the refusal's message (and code) when refused."""

    work_id: str
    route: Route
    lane_ordinal: int
    verdict: Verdict
    replay_work_id: str = ""
    error_kind: str = ""
    message: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class BulkCall:
    """One call of a bulk replay or skip: an answer per dead letter, in the order handled, and where the next starts."""

    answers: tuple[BulkAnswer, ...]
    next_page_token: str
    examined: int
    dry_run: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Window:
    """One page's dead letters, the next token, rows examined, and whether this page or an earlier one kept any."""

    rows: list[WorkRow]
    next_page_token: str
    examined: int
    matched: bool


def _pack_known(connection: Connection, pack_install_id: str) -> None:
    if operator_reads_sql.pack_namespace(connection, pack_install_id) is None:
        raise UnknownPack(f"pack_install_id {pack_install_id!r} is not installed", field="pack_install_id")


def _position(values: list[object]) -> tuple[dt.datetime, str, bool]:
    """The position a dead-letter page token carries: a FinishedAt, a WorkId, and whether a page before kept a row.

    A token of a release before decision 176 carries no flag: read as "kept one", so it is never
    refused as matching nothing.
    """
    finished, work_id, *rest = values
    matched = rest.pop() if rest else True
    if rest or not isinstance(matched, bool):
        raise ValueError("not a dead-letter position")
    return dt.datetime.fromisoformat(page_tokens.string(finished)), page_tokens.string(work_id), matched


def _page(engine: Engine, pack_install_id: str, wanted: Filter, size: int, page_token: str, rpc: str) -> _Window:
    """Up to ``size`` dead letters from ``page_token`` on, the next token, and how many rows were examined."""
    after = page_tokens.decode_token(page_token, rpc, _position)
    scan = size * SCAN_FACTOR
    with engine.connect() as connection:
        _pack_known(connection, pack_install_id)
        rows = dead_letters_sql.dead_letters_window(
            connection, pack_install_id, wanted, None if after is None else after[:2], scan
        )
    kept, examined = page_tokens.first_kept(rows, lambda row: row.Matches, size)
    matched = bool(kept) or (after is not None and after[2])
    token = ""
    if examined and (len(kept) == size or len(rows) == scan):  # more may follow the last row examined
        last = rows[examined - 1]
        token = page_tokens.encode_token((last.FinishedAt.isoformat(), last.work.WorkId, matched))
    return _Window(rows=[row.work for row in kept], next_page_token=token, examined=examined, matched=matched)


def list_dead_letters(
    context: Context, pack_install_id: str, wanted: Filter, page_size: int = 0, page_token: str = ""
) -> DeadLetterPage:
    """One page of the pack's dead letters that ``wanted`` keeps, with range, attempts and LastError.

    Raises ``UnknownPack``, and ``InvalidArgument`` for a page size out of range or a token
    that is not one of this read's.
    """
    engine, settings = context.engine, context.settings
    page = _page(engine, pack_install_id, wanted, settings.page_size(page_size), page_token, "ListDeadLetters")
    return DeadLetterPage(
        dead_letters=tuple(work_items_sql.work_item_value(row) for row in page.rows),
        next_page_token=page.next_page_token,
        examined=page.examined,
    )


def count_dead_letters(engine: Engine, pack_install_id: str, wanted: Filter) -> DeadLetterCount:
    """The pack's dead letters that ``wanted`` keeps, per identity, among its ``COUNT_LIMIT`` oldest failures."""
    with engine.connect() as connection:
        _pack_known(connection, pack_install_id)
        rows = dead_letters_sql.dead_letters_identities(connection, pack_install_id, wanted, COUNT_LIMIT)
    counts: dict[str, int] = {}
    for row in rows:
        if row.Matches:
            counts[row.ProjectionKey] = counts.get(row.ProjectionKey, 0) + 1
    identities = tuple(
        IdentityCount(route=Route.of(decode_projection_key(key)), dead_letters=count)
        for key, count in sorted(counts.items())
    )
    return DeadLetterCount(
        identities=identities, total=sum(counts.values()), examined=len(rows), complete=len(rows) < COUNT_LIMIT
    )


def failure_tally(engine: Engine, pack_install_id: str) -> tuple[int, int]:
    """How many of the pack's ``COUNT_LIMIT`` oldest finished failures there are, and how many are dead letters.

    The read ``count_dead_letters`` makes, unfiltered; raises ``UnknownPack``.
    """
    with engine.connect() as connection:
        _pack_known(connection, pack_install_id)
        rows = dead_letters_sql.dead_letters_identities(
            connection, pack_install_id, filter_of(pack_install_id), COUNT_LIMIT
        )
    return len(rows), sum(1 for row in rows if row.Matches)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Act:
    """What a bulk call does to each dead letter: its RPC (for tokens), verdicts and the act on one WorkId.

    ``one`` acts in a transaction of its own and returns the WorkId of the generation it
    queued ("" for none); a ``DomainError`` it raises is that dead letter's refusal.
    """

    rpc: str
    verb: str
    done: Verdict
    would: Verdict
    one: Callable[[str], str]


def _bulk(
    context: Context,
    pack_install_id: str,
    wanted: Filter,
    act: _Act,
    *,
    dry_run: bool,
    max_generations: int,
    page_token: str,
) -> BulkCall:
    """One page of dead letters that ``wanted`` keeps, each acted on (or with ``dry_run``, only answered)."""
    engine, settings = context.engine, context.settings
    if max_generations < 0 or max_generations > settings.max_page_size:
        raise InvalidArgument(
            f"max_generations must be between 0 and {settings.max_page_size}, got {max_generations}",
            field="max_generations",
        )
    page = _page(engine, pack_install_id, wanted, max_generations or DEFAULT_BULK_BATCH, page_token, act.rpc)
    if not page.matched and not page.next_page_token:
        raise NothingMatches(
            f"no dead letter of pack {pack_install_id} matches the filter: nothing to {act.verb}", field="filter"
        )
    answers: list[BulkAnswer] = []
    for row in sorted(page.rows, key=lambda r: (r.ProjectionKey, r.LaneOrdinal)):  # one identity in ordinal order
        answer = BulkAnswer(
            work_id=row.WorkId,
            route=Route.of(decode_projection_key(row.ProjectionKey)),
            lane_ordinal=row.LaneOrdinal,
            verdict=act.would,
        )
        if not dry_run:
            try:
                made = act.one(row.WorkId)
            except DomainError as error:
                answer = dataclasses.replace(
                    answer, verdict=Verdict.REFUSED, error_kind=error.kind.value, message=str(error)
                )
            else:
                answer = dataclasses.replace(answer, verdict=act.done, replay_work_id=made)
        answers.append(answer)
    return BulkCall(
        answers=tuple(answers), next_page_token=page.next_page_token, examined=page.examined, dry_run=dry_run
    )


def replay_dead_letters(
    context: Context,
    pack_install_id: str,
    wanted: Filter,
    replay_one: Callable[[str], str],
    *,
    dry_run: bool,
    max_generations: int = 0,
    page_token: str = "",
) -> BulkCall:
    """Replay (or with ``dry_run``, only list) up to ``max_generations`` dead letters that ``wanted`` keeps.

    ``replay_one`` replays one WorkId in its own transaction (``Connectors.replay``) and returns
    its replay's WorkId; a refusal (``DomainError``) is that WorkId's answer and the others go
    on. 0 means ``DEFAULT_BULK_BATCH``; more than ``settings.max_page_size`` is refused. The
    caller continues with ``next_page_token`` until it is "". Raises ``UnknownPack``, and
    ``NothingMatches`` when neither this page nor an earlier one of the same walk kept a dead letter.
    """
    act = _Act(
        rpc="ReplayDeadLetters",
        verb="replay",
        done=Verdict.REPLAYED,
        would=Verdict.WOULD_REPLAY,
        one=replay_one,
    )
    return _bulk(
        context,
        pack_install_id,
        wanted,
        act,
        dry_run=dry_run,
        max_generations=max_generations,
        page_token=page_token,
    )


def skip_dead_letters(
    context: Context,
    pack_install_id: str,
    wanted: Filter,
    skip_one: Callable[[str], object],
    *,
    dry_run: bool,
    max_generations: int = 0,
    page_token: str = "",
) -> BulkCall:
    """Skip (or with ``dry_run``, only list) up to ``max_generations`` dead letters that ``wanted`` keeps.

    Paged and refused as ``replay_dead_letters``; ``skip_one`` records one skip in its own
    transaction (``order_policy.skip``, with the caller's operator and reason).
    """

    def skipped(work_id: str) -> str:
        skip_one(work_id)
        return ""  # a skip queues no generation

    act = _Act(rpc="SkipDeadLetters", verb="skip", done=Verdict.SKIPPED, would=Verdict.WOULD_SKIP, one=skipped)
    return _bulk(
        context,
        pack_install_id,
        wanted,
        act,
        dry_run=dry_run,
        max_generations=max_generations,
        page_token=page_token,
    )
