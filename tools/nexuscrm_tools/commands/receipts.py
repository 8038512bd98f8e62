"""``nexuscrm receipts`` and ``why``: ingress receipts by state, and which generation covers one, or why none does."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from nexuscrm.connectors.v1 import connectors_pb2 as cn_pb
from nexuscrm_tools.clients import Clients
from nexuscrm_tools.commands.shared import RPC_TIMEOUT, Outcome, fields, leaf, paged, title_count
from nexuscrm_tools.exits import ExitCode
from nexuscrm_tools.json_view import message_data, timestamp_text
from nexuscrm_tools.tables import listing
from workqueue import ReceiptState


def _receipts(clients: Clients, state: str, pack: str, args: argparse.Namespace) -> Outcome:
    response = clients.connectors.ListReceipts(
        cn_pb.ListReceiptsRequest(state=state, pack_install_id=pack, page_size=args.limit, page_token=args.page_token),
        timeout=RPC_TIMEOUT,
    )
    rows = [
        (r.pack_install_id, r.receipt_key, r.route.source_lane, timestamp_text(r.received_at))
        for r in response.receipts
    ]
    title = f"{state.replace('_', ' ')} receipts{title_count(rows, response.next_page_token)}"
    return Outcome(data=message_data(response), view=listing(title, ("pack", "receipt", "lane", "received at"), rows))


def receipts_list(clients: Clients, args: argparse.Namespace) -> Outcome:
    """A pack's receipts in one state (``--state``), oldest first; paged (``--limit``, ``--page-token``)."""
    return _receipts(clients, args.state, args.pack, args)


def receipts_missing(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Receipts whose coverage is missing (of ``--pack``, or of every pack), oldest first; exit 9 if any.

    ``receipts list PACK --state coverage_missing`` for one pack, with the check's exit code.
    """
    outcome = _receipts(clients, ReceiptState.COVERAGE_MISSING, args.pack or "", args)
    missing = bool(outcome.data["receipts"])
    return dataclasses.replace(outcome, code=ExitCode.CHECK_FAILED if missing else ExitCode.OK)


def why(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Which generation covers a receipt's input, or why none does."""
    response = clients.connectors.ExplainReceipt(
        cn_pb.ExplainReceiptRequest(pack_install_id=args.pack, receipt_key=args.receipt_key), timeout=RPC_TIMEOUT
    )
    view = {
        "receipt": args.receipt_key,
        "state": response.receipt_state,
        "ordinal": response.enqueue_ordinal or "-",
        "covered by": response.covered_by.work_id if response.HasField("covered_by") else "-",
        "why": response.explanation,
    }
    code = ExitCode.CHECK_FAILED if response.receipt_state == ReceiptState.COVERAGE_MISSING else ExitCode.OK
    return Outcome(data=message_data(response), view=fields(f"receipt {args.receipt_key}", view), code=code)


def add_commands(commands: Any) -> None:
    """``receipts list|missing``."""
    receipts = commands.add_parser("receipts", help="ingress receipts").add_subparsers(dest="action", required=True)
    sub = leaf(receipts, "list", receipts_list, "a pack's receipts in one state")
    sub.add_argument("pack")
    states = [s.value for s in ReceiptState]
    sub.add_argument("--state", choices=states, default=ReceiptState.CONFIRMED, help="default: %(default)s")
    paged(sub, dest="limit")
    sub = leaf(receipts, "missing", receipts_missing, "receipts whose coverage is missing")
    sub.add_argument("--pack", default=None, help="only this pack (default: every pack)")
    paged(sub, dest="limit")


def add_why(commands: Any) -> None:
    """``why``: a command of its own, listed after ``schema`` in --help."""
    sub = leaf(commands, "why", why, "why a receipt has (no) work")
    sub.add_argument("pack")
    sub.add_argument("receipt_key")
