"""``nexuscrm work``: generations, one at a time (with its attempts) or listed, their members, and retry now."""

from __future__ import annotations

import argparse
from typing import Any

from rich.text import Text

from nexuscrm.connectors.v1 import connectors_pb2 as cn_pb
from nexuscrm_tools import payload_view
from nexuscrm_tools.clients import Clients
from nexuscrm_tools.commands.generations import attempts_text, listed_status, range_text, skip_text, status_text
from nexuscrm_tools.commands.shared import (
    IDENTITY_FLAGS,
    RPC_TIMEOUT,
    Outcome,
    fields,
    identity_of,
    leaf,
    next_page,
    paged,
    title_count,
)
from nexuscrm_tools.json_view import enum_word, message_data, timestamp_text
from nexuscrm_tools.tables import listing
from nexuscrm_wire import convert
from workqueue import WorkStatus


def work_show(clients: Clients, args: argparse.Namespace) -> Outcome:
    """One generation: range, member count, status, attempts (those used, and how it ended)."""
    response = clients.connectors.GetWork(cn_pb.GetWorkRequest(work_id=args.work_id), timeout=RPC_TIMEOUT)
    work = response.work
    view = {
        "work_id": work.work_id,
        "pack_install_id": work.pack_install_id,
        "route": f"{work.route.event_kind} v{work.route.route_version} {work.route.companion_version} "
        f"{work.route.work_type} lane {work.route.source_lane}",
        "range": range_text(work),
        "members": response.member_count,
        "status": status_text(work),
        "attempts": attempts_text(work),
        "replay of": work.replay_of_work_id or "-",
        "last error": work.last_error or "-",
    }
    if work.blocked_behind_work_id:
        view["blocked behind"] = f"{work.blocked_behind_work_id}: {work.blocked_reason}"
    if work.HasField("skip"):
        view["skipped"] = skip_text(work.skip)
    view |= _attempt_history(response)
    return Outcome(data=message_data(response), view=fields(f"work {work.work_id}", view))


def _attempt_history(response: cn_pb.GetWorkResponse) -> dict[str, str]:
    """Each attempt that did not complete the generation (outcome, worker, start, end, error), the last traceback."""
    rows: dict[str, str] = {}
    if response.attempt_count > len(response.attempts):
        rows["attempts listed"] = f"the newest {len(response.attempts)} of {response.attempt_count}"
    for attempt in response.attempts:
        started = timestamp_text(attempt.started_at) if attempt.HasField("started_at") else "-"
        ended = timestamp_text(attempt.finished_at)
        outcome = enum_word(cn_pb.AttemptOutcome.DESCRIPTOR, attempt.outcome)
        rows[f"attempt {attempt.attempt}"] = (
            f"{outcome}, worker {attempt.worker_id}, {started} to {ended}: {attempt.error}"
        )
    traceback = next((a.traceback for a in reversed(response.attempts) if a.traceback), "")
    if traceback:
        rows["last traceback"] = traceback
    return rows


def work_retry_now(clients: Clients, args: argparse.Namespace) -> Outcome:
    """End the backoff of a generation waiting in retry: claimable at once.

    Refused (exit 8) for a generation in any other status; who and why go to Connectors' log.
    """
    response = clients.connectors.RetryNow(
        cn_pb.RetryNowRequest(work_id=args.work_id, retried_by=args.by, reason=args.reason), timeout=RPC_TIMEOUT
    )
    work = response.work
    return Outcome(data=message_data(response), view=f"work {work.work_id} is claimable now ({attempts_text(work)})")


def work_list(clients: Clients, args: argparse.Namespace) -> Outcome:
    """A pack's generations (one identity's with identity flags naming it), newest first; ``--status`` filters.

    Without an identity, identity after identity, newest first in each. Range, status,
    attempts and replay origin of each; paged (a page filtered by status may be short).
    """
    route = identity_of(args)
    request = cn_pb.ListGenerationsRequest(
        pack_install_id=args.pack,
        page_size=args.page_size,
        page_token=args.page_token,
        status=convert.STATUSES[WorkStatus(args.status)] if args.status else cn_pb.WORK_STATUS_UNSPECIFIED,
    )
    if route is not None:
        request.route.CopyFrom(convert.route_to_proto(route))
    response = clients.connectors.ListGenerations(request, timeout=RPC_TIMEOUT)
    rows = [
        (w.work_id, w.route.source_lane, range_text(w), listed_status(w), attempts_text(w), w.replay_of_work_id or "-")
        for w in response.generations
    ]
    whose = f"lane {args.lane} of {args.pack}" if route is not None else args.pack
    status = f"{args.status} " if args.status else ""
    title = f"{status}generations of {whose}{title_count(rows, response.next_page_token)}"
    columns = ("work", "lane", "range", "status", "attempts", "replay of")
    return Outcome(data=message_data(response), view=listing(title, columns, rows))


def work_members(clients: Clients, args: argparse.Namespace) -> Outcome:
    """A generation's members in ordinal order, read without a lease, each payload decoded (JSON, text or escaped).

    ``--json`` gives each payload base64-encoded and decoded (``nexuscrm_tools.payload_view``).
    """
    response = clients.connectors.ListMembers(
        cn_pb.ListMembersRequest(work_id=args.work_id, page_size=args.page_size, page_token=args.page_token),
        timeout=RPC_TIMEOUT,
    )
    data = message_data(response)
    for listed, member in zip(data["inputs"], response.inputs, strict=True):
        listed["payload_format"], listed["payload_decoded"] = payload_view.decoded(member.payload)
    rows = [
        (
            i.enqueue_ordinal,
            i.receipt_key or "-",
            "replay" if i.replay else "",
            timestamp_text(i.source_time) if i.HasField("source_time") else "-",
            len(i.payload),
            Text(payload_view.preview(i.payload)),  # a payload's brackets are not markup
        )
        for i in response.inputs
    ]
    title = f"members of {args.work_id}: {len(rows)} of {response.member_count}{next_page(response.next_page_token)}"
    columns = ("ordinal", "receipt", "replay", "source time", "payload bytes", "payload")
    return Outcome(data=data, view=listing(title, columns, rows))


def add_commands(commands: Any) -> None:
    """``work show|retry-now|list|members``."""
    work = commands.add_parser("work", help="generations").add_subparsers(dest="action", required=True)
    leaf(work, "show", work_show, "range, members, status, attempts").add_argument("work_id")
    sub = leaf(work, "retry-now", work_retry_now, "end the backoff of a generation waiting in retry")
    sub.add_argument("work_id")
    sub.add_argument("--by", required=True, help="who, as logged")
    sub.add_argument("--reason", required=True, help="why, as logged")
    sub = leaf(work, "list", work_list, "a pack's (or one identity's) generations, newest first")
    sub.add_argument("pack")
    sub.add_argument("--status", choices=[s.value for s in WorkStatus], help="only generations with this status")
    for flag in IDENTITY_FLAGS:
        sub.add_argument(flag, help="all five identity flags together: one identity's generations")
    paged(sub)
    sub = leaf(work, "members", work_members, "a generation's members, in ordinal order")
    sub.add_argument("work_id")
    paged(sub)
