"""``nexuscrm dead-letters``: generations that failed for good, listed, counted, replayed or skipped."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from nexuscrm.connectors.v1 import connectors_pb2 as cn_pb
from nexuscrm_tools.clients import Clients
from nexuscrm_tools.commands.generations import attempts_text, range_text
from nexuscrm_tools.commands.shared import (
    IDENTITY_FLAGS,
    RPC_TIMEOUT,
    WORK_TYPE_OR_IDENTITY,
    Outcome,
    UsageError,
    _instant,
    leaf,
    narrow_to_identity,
    paged,
    title_count,
)
from nexuscrm_tools.exits import ExitCode
from nexuscrm_tools.json_view import enum_word, message_data, timestamp_text
from nexuscrm_tools.tables import listing, plural

BulkResponse = cn_pb.ReplayDeadLettersResponse | cn_pb.SkipDeadLettersResponse


def _dead_letter_filter(args: argparse.Namespace) -> cn_pb.DeadLetterFilter:
    """The filter the flags name: an identity (all five identity flags) or a work type alone, times, error text."""
    wanted = cn_pb.DeadLetterFilter(pack_install_id=args.pack, error_contains=args.error or "")
    narrow_to_identity(args, wanted)
    if args.after is not None:
        wanted.finished_after.FromDatetime(args.after)
    if args.before is not None:
        wanted.finished_before.FromDatetime(args.before)
    return wanted


def _dead_letter_row(work: cn_pb.WorkItem) -> tuple[object, ...]:
    return (
        work.work_id,
        work.route.source_lane,
        range_text(work),
        attempts_text(work),
        timestamp_text(work.finished_at),
        work.last_error,
    )


def dead_letters_list(clients: Clients, args: argparse.Namespace) -> Outcome:
    """A pack's generations that failed for good and were never replayed, oldest finished first.

    Range, attempts and last error of each; paged (a filtered page may be short: it examines at
    most ten failed generations per row asked for).
    """
    response = clients.connectors.ListDeadLetters(
        cn_pb.ListDeadLettersRequest(
            filter=_dead_letter_filter(args), page_size=args.page_size, page_token=args.page_token
        ),
        timeout=RPC_TIMEOUT,
    )
    rows = [_dead_letter_row(w) for w in response.dead_letters]
    title = f"dead letters of {args.pack}{title_count(rows, response.next_page_token)}"
    columns = ("work", "lane", "range", "attempts", "failed at", "last error")
    return Outcome(data=message_data(response), view=listing(title, columns, rows))


def dead_letters_count(clients: Clients, args: argparse.Namespace) -> Outcome:
    """A pack's dead letters per identity (among its 100 000 oldest failed generations)."""
    response = clients.connectors.CountDeadLetters(
        cn_pb.CountDeadLettersRequest(filter=_dead_letter_filter(args)), timeout=RPC_TIMEOUT
    )
    rows = [(i.route.source_lane, i.route.event_kind, i.route.work_type, i.dead_letters) for i in response.identities]
    complete = "" if response.complete else f" (stopped after {response.examined} failed generations)"
    title = f"{plural(response.total, 'dead letter')} of {args.pack}{complete}"
    return Outcome(
        data=message_data(response), view=listing(title, ("lane", "event kind", "work type", "dead letters"), rows)
    )


def dead_letters_replay(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Replay every dead letter the filters keep, page by page, one transaction per WorkId; ``--dry-run`` lists them.

    One identity's are replayed in ordinal order. Each WorkId is answered: replayed (its new
    generation), would replay (dry run) or refused and why. Exit 9 when any was refused; a
    filter that keeps no dead letter exits 2, nothing changed.
    """

    def call(token: str) -> BulkResponse:
        request = cn_pb.ReplayDeadLettersRequest(
            filter=_dead_letter_filter(args), dry_run=args.dry_run, max_generations=args.batch, page_token=token
        )
        response: cn_pb.ReplayDeadLettersResponse = clients.connectors.ReplayDeadLetters(request, timeout=RPC_TIMEOUT)
        return response

    return _bulk_dead_letters(args, call, verb="replay", done="replayed", detail="replay or reason")


def dead_letters_skip(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Skip a dead letter (WORK_ID), or with ``--pack`` every one the filters keep, as ``replay`` takes them.

    Each skip is recorded (who, when, why): the generation stays failed, leaves the queue and no
    longer holds its identity. One WorkId: refused (exit 8) when it is not failed, was replayed
    or skipped. ``--pack``: page by page, one transaction per WorkId, each answered skipped,
    would skip (``--dry-run``: nothing changes) or refused and why (exit 9 when any was); a
    filter that keeps no dead letter exits 2, nothing changed. The filters, ``--dry-run`` and
    ``--batch`` need ``--pack``.
    """
    if args.pack is None:
        flags = [
            flag
            for flag in (*IDENTITY_FLAGS, "--after", "--before", "--error", "--dry-run", "--batch")
            if _given(args, flag)
        ]
        if flags:
            raise UsageError(f"{', '.join(flags)}: only with --pack PACK, not with a WORK_ID")
        response = clients.connectors.SkipDeadLetter(
            cn_pb.SkipDeadLetterRequest(work_id=args.work_id, skipped_by=args.by, reason=args.reason),
            timeout=RPC_TIMEOUT,
        )
        view = f"skipped {response.work_id} at {timestamp_text(response.skipped_at)} by {response.skipped_by}"
        return Outcome(data=message_data(response), view=view)

    def call(token: str) -> BulkResponse:
        request = cn_pb.SkipDeadLettersRequest(
            filter=_dead_letter_filter(args),
            skipped_by=args.by,
            reason=args.reason,
            dry_run=args.dry_run,
            max_generations=args.batch,
            page_token=token,
        )
        response: cn_pb.SkipDeadLettersResponse = clients.connectors.SkipDeadLetters(request, timeout=RPC_TIMEOUT)
        return response

    return _bulk_dead_letters(args, call, verb="skip", done="skipped", detail="reason refused")


def _bulk_dead_letters(
    args: argparse.Namespace, call: Callable[[str], BulkResponse], *, verb: str, done: str, detail: str
) -> Outcome:
    """Call a bulk replay or skip page by page to its last page (a progress line each), then one table of every answer.

    ``call`` takes the page token. Exit 9 when any dead letter was refused.
    """
    answers: list[cn_pb.DeadLetterReplay] = []
    token = ""
    while True:
        response = call(token)
        answers += response.answers
        print(f"nexuscrm: {f'would {verb}' if args.dry_run else done} {len(answers)} so far", file=sys.stderr)
        token = response.next_page_token
        if not token:
            break
    refused = [a for a in answers if a.verdict == cn_pb.DEAD_LETTER_VERDICT_REFUSED]
    rows = [
        (
            a.work_id,
            a.route.source_lane,
            a.lane_ordinal,
            enum_word(cn_pb.DeadLetterVerdict.DESCRIPTOR, a.verdict),
            a.replay_work_id or a.message or "-",
        )
        for a in answers
    ]
    dry = " (dry run: nothing changed)" if args.dry_run else ""
    title = f"{plural(len(answers), 'dead letter')} of {args.pack}, {len(refused)} refused{dry}"
    data = {"dry_run": args.dry_run, "answers": [message_data(a) for a in answers], "refused": len(refused)}
    view = listing(title, ("work", "lane", "last ordinal", "verdict", detail), rows)
    return Outcome(data=data, view=view, code=ExitCode.CHECK_FAILED if refused else ExitCode.OK)


def _given(args: argparse.Namespace, flag: str) -> bool:
    """Whether ``flag`` was given (a flag left out keeps its default: None, False or 0)."""
    return bool(getattr(args, flag.removeprefix("--").replace("-", "_")))


def add_commands(commands: Any) -> None:
    """``dead-letters list|count|replay|skip``."""
    dead = commands.add_parser("dead-letters", help="work that failed for good").add_subparsers(
        dest="action", required=True
    )
    for name, handler, text in (
        ("list", dead_letters_list, "failed generations never replayed, oldest first"),
        ("count", dead_letters_count, "dead letters per identity"),
        ("replay", dead_letters_replay, "replay them page by page (or --dry-run)"),
        ("skip", dead_letters_skip, "skip one, or --pack those the filters keep; recorded (it stays failed)"),
    ):
        sub = leaf(dead, name, handler, text)
        if name == "skip":  # one WorkId, or a pack's dead letters by the filters below
            target = sub.add_mutually_exclusive_group(required=True)
            target.add_argument("work_id", nargs="?", help="the dead letter to skip")
            target.add_argument("--pack", help="skip the dead letters of PACK the filters keep")
            sub.add_argument("--by", required=True, help="who, as recorded")
            sub.add_argument("--reason", required=True, help="why, as recorded")
        else:
            sub.add_argument("pack")
        for flag in IDENTITY_FLAGS:
            sub.add_argument(flag, help=WORK_TYPE_OR_IDENTITY)
        sub.set_defaults(work_type_alone=True)
        sub.add_argument("--after", type=_instant, metavar="INSTANT", help="failed at or after (ISO 8601)")
        sub.add_argument("--before", type=_instant, metavar="INSTANT", help="failed before (ISO 8601)")
        sub.add_argument("--error", metavar="TEXT", help="last error contains TEXT")
        if name == "list":
            paged(sub)
        if name in ("replay", "skip"):
            sub.add_argument("--dry-run", action="store_true", help="list what it would do, change nothing")
            sub.add_argument("--batch", type=int, default=0, metavar="N", help="per call (default: the service's)")
