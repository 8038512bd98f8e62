"""``nexuscrm send``: test deliveries of one identity through the SDK's pipelined ingest."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from nexuscrm_tools import identities, sending
from nexuscrm_tools.clients import Clients
from nexuscrm_tools.commands.shared import IDENTITY_FLAGS, Outcome, UsageError, _instant, identity_of, leaf
from nexuscrm_tools.exits import ExitCode
from nexuscrm_tools.tables import listing, plural
from workqueue.values import Outcome as IngestOutcome


def send(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Send test deliveries of one identity through the SDK's pipelined ingest, each answered on its own.

    PAYLOAD is the text itself, @PATH the bytes of a file, - those of standard input. The
    identity flags name one identity of the pack, as everywhere (a new identity takes all
    five). Exit 8 when a delivery was rejected, 9 when a duplicate's coverage is missing.
    """
    route = identity_of(args)
    if route is None:  # --lane is required: the identity flags always name one
        raise UsageError(f"send needs {', '.join(IDENTITY_FLAGS)}")
    try:
        payloads = sending.read_payloads(args.payloads, sys.stdin.buffer)
        items = sending.deliveries(route, payloads, args.key or [], args.source_time)
    except sending.PayloadUnreadable as error:
        raise UsageError(str(error)) from None
    results = sending.send(clients.connectors_client, args.pack, items)
    rows = [(r.receipt_key, r.outcome, r.enqueue_ordinal or "-", r.work_id or "-", r.message) for r in results]
    outcomes = {r.outcome for r in results}
    code = ExitCode.OK
    if IngestOutcome.REJECTED in outcomes:
        code = ExitCode.REFUSED
    elif IngestOutcome.COVERAGE_MISSING in outcomes:
        code = ExitCode.CHECK_FAILED
    data = {
        "pack_install_id": args.pack,
        "route": dataclasses.asdict(route),
        "deliveries": [dataclasses.asdict(r) for r in results],
    }
    title = f"{plural(len(rows), 'delivery', 'deliveries')} to {args.pack}, {identities.describe(route)}"
    view = listing(title, ("receipt", "outcome", "ordinal", "work", "message"), rows)
    return Outcome(data=data, view=view, code=code)


def add_commands(commands: Any) -> None:
    """``send``."""
    sub = leaf(commands, "send", send, "send test deliveries through the SDK's pipelined ingest")
    sub.add_argument("pack")
    sub.add_argument("payloads", nargs="+", metavar="PAYLOAD", help="the text, @PATH (a file's bytes) or - (stdin)")
    for flag in IDENTITY_FLAGS:
        sub.add_argument(flag, required=flag == "--lane", help="those naming one identity; a new one: all five")
    sub.add_argument("--key", action="append", metavar="KEY", help="receipt key, one per PAYLOAD (default: new ones)")
    sub.add_argument("--source-time", type=_instant, metavar="INSTANT", help="of every delivery (ISO 8601)")
