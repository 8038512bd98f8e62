"""Operator reads of generations: an identity's or a pack's generations, a generation's members.

Neither needs a lease nor changes a row; both page by keyset over the runtime's indexes
(``page_tokens``). Only LoadInputs refuses a damaged range.
"""

from __future__ import annotations

from nexuscrm_connectors import page_tokens
from nexuscrm_connectors.context import Context
from nexuscrm_connectors.errors import RangeNotRecorded, UnknownPack, WorkNotFound
from nexuscrm_connectors.queries import events as events_sql
from nexuscrm_connectors.queries import operator_reads as operator_reads_sql
from nexuscrm_connectors.queries import work_items as work_items_sql
from nexuscrm_runtime.causal import causal_read
from workqueue import WorkStatus
from workqueue.errors import InvalidArgument
from workqueue.values import GenerationPage, MemberPage, Route

STATUS_SCAN_FACTOR = 10  # generations a status-filtered page examines per row asked for


def list_generations(
    context: Context,
    pack_install_id: str,
    route: Route | None,
    page_size: int = 0,
    page_token: str = "",
    status: WorkStatus | None = None,
) -> GenerationPage:
    """One page of the generations of (pack, route), newest first, with range, status, attempts and replay origin.

    ``route`` None lists the pack's generations, identity after identity (newest first in
    each); ``status`` keeps only generations with that status. Raises ``InvalidArgument``
    naming the route field at fault, ``UnknownPack``.
    """
    engine, settings = context.engine, context.settings
    if not pack_install_id:
        raise InvalidArgument("pack_install_id is required", field="pack_install_id")
    key = identity_key(pack_install_id, route) if route is not None else None
    size = settings.page_size(page_size)
    scan = size if status is None else size * STATUS_SCAN_FACTOR
    with engine.connect() as connection:
        causal_read(connection)  # an operator acts on it: it sees every acknowledged write
        if operator_reads_sql.pack_namespace(connection, pack_install_id) is None:
            raise UnknownPack(f"pack_install_id {pack_install_id!r} is not installed", field="pack_install_id")
        if key is not None:
            below = page_tokens.decode_token(page_token, "ListGenerations", _ordinal_position)
            rows = operator_reads_sql.work_items_of_identity(connection, pack_install_id, key, below, scan)
        else:
            before = page_tokens.decode_token(page_token, "ListGenerations", _identity_position)
            rows = operator_reads_sql.work_items_of_pack(connection, pack_install_id, before, scan)
    kept, examined = page_tokens.first_kept(rows, lambda row: status is None or row.Status == status, size)
    token = ""
    if examined and (len(kept) == size or len(rows) == scan):  # more may follow the last row examined
        last = rows[examined - 1]
        token = page_tokens.encode_token(
            (last.LaneOrdinal,) if key is not None else (last.ProjectionKey, last.LaneOrdinal)
        )
    return GenerationPage(generations=tuple(work_items_sql.work_item_value(row) for row in kept), next_page_token=token)


def identity_key(pack_install_id: str, route: Route) -> str:
    """The projection key of (pack, route); ``InvalidArgument`` names the route field at fault."""
    try:
        return route.identity(pack_install_id).key
    except InvalidArgument as error:
        if error.field == "pack_install_id":
            raise
        raise InvalidArgument(f"route.{error}", field=f"route.{error.field}") from None


def list_members(context: Context, work_id: str, page_size: int = 0, page_token: str = "") -> MemberPage:
    """One page of a generation's members in ordinal order, and how many it has now.

    Raises ``WorkNotFound``, and ``RangeNotRecorded`` for old-protocol work.
    """
    engine, settings = context.engine, context.settings
    if not work_id:
        raise InvalidArgument("work_id is required", field="work_id")
    size = settings.page_size(page_size)
    after = page_tokens.decode_token(page_token, "ListMembers", _ordinal_position)
    with engine.connect() as connection:
        row = work_items_sql.work_item_get(connection, work_id)
        if row is None:
            raise WorkNotFound(f"work {work_id} does not exist", field="work_id")
        start, end = row.InputStartOrdinal, row.LaneOrdinal
        if start is None:
            raise RangeNotRecorded(
                f"work {work_id} is old-protocol work: its coverage was inferred, it has no member range",
                field="work_id",
            )
        count = events_sql.event_range_count(connection, row.PackInstallId, row.member_key, start, end)
        rows = events_sql.event_range_page(
            connection,
            row.PackInstallId,
            row.member_key,
            max(start - 1, after or 0),
            end,
            size,
            settings.max_page_bytes,
        )
    # Members follow when the byte budget cut the page or the candidates filled it.
    more = bool(rows) and (len(rows) < rows[0].Candidates or len(rows) == size) and rows[-1].EnqueueOrdinal < end
    return MemberPage(
        inputs=tuple(events_sql.input_value(r) for r in rows),
        next_page_token=page_tokens.encode_token((rows[-1].EnqueueOrdinal,)) if more else "",
        member_count=count,
    )


def _identity_position(values: list[object]) -> tuple[str, int]:
    """The position a page token of a pack's generations carries: a ProjectionKey and a LaneOrdinal."""
    key, ordinal = values
    return page_tokens.string(key), page_tokens.ordinal(ordinal)


def _ordinal_position(values: list[object]) -> int:
    """The one ordinal a page token of ListGenerations (a LaneOrdinal) or ListMembers (an ordinal) carries."""
    (ordinal,) = values
    return page_tokens.ordinal(ordinal)
