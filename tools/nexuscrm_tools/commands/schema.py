"""``nexuscrm schema contract-payloads``: after the v10 roll, the payloads moved out of Event.Payload."""

from __future__ import annotations

import argparse
from typing import Any

from nexuscrm_tools import payload_contract
from nexuscrm_tools.clients import Clients
from nexuscrm_tools.commands.shared import Outcome, fields, leaf


def schema_contract_payloads(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Set the payload contract once no v7 Connectors runs, then move payloads out of Event.Payload.

    Idempotent and resumable (``nexuscrm_tools.payload_contract``); refused below schema v10.
    ``--dry-run`` counts what it would move and changes nothing (the contract included).
    """
    counted = payload_contract.count_moves(clients.schema_catalog)
    if args.dry_run:
        view = {
            "payload contract": f"set at {counted.set_at} by {counted.set_by}" if counted.set_at else "not set",
            "Event payloads to empty": counted.emptied,
            "of them to move into EventPayload": counted.moved,
            "bytes": counted.emptied_bytes,
        }
        data = {
            "dry_run": True,
            "set_at": counted.set_at,
            "set_by": counted.set_by,
            "emptied": counted.emptied,
            "emptied_bytes": counted.emptied_bytes,
            "moved": counted.moved,
        }
        return Outcome(data=data, view=fields("payload move (dry run: nothing changed)", view))
    with payload_contract.shown_progress(counted.emptied) as progress:
        first, totals = payload_contract.contract_payloads(
            clients.schema_catalog,
            after_pack=args.after_pack,
            after_ordinal=args.after_ordinal,
            batches_per_call=args.batches_per_call,
            progress=progress,
        )
    view = {
        "payload contract": "set now" if first.newly_set else "already set",
        "set at": first.set_at,
        "set by": first.set_by,
        "Event payloads emptied": totals.emptied,
        "of them moved into EventPayload": totals.moved,
        "bytes": totals.emptied_bytes,
    }
    data = {
        "dry_run": False,
        "newly_set": first.newly_set,
        "set_at": first.set_at,
        "set_by": first.set_by,
        "emptied": totals.emptied,
        "emptied_bytes": totals.emptied_bytes,
        "moved": totals.moved,
    }
    return Outcome(data=data, view=fields("payload move", view))


def add_commands(commands: Any) -> None:
    """``schema contract-payloads``."""
    schema = commands.add_parser("schema", help="the canonical schema").add_subparsers(dest="action", required=True)
    sub = leaf(
        schema, "contract-payloads", schema_contract_payloads, "after the v10 roll: move payloads out of Event.Payload"
    )
    sub.add_argument("--dry-run", action="store_true", help="count what would move, change nothing")
    sub.add_argument("--after-pack", default="", metavar="PACK", help="resume after this pack (default: the start)")
    sub.add_argument("--after-ordinal", type=int, default=-1, metavar="N", help="and this ordinal of it")
    sub.add_argument(
        "--batches-per-call",
        type=int,
        default=payload_contract.BATCHES_PER_CALL,
        metavar="N",
        help="batches each call empties (default %(default)s)",
    )
