"""``nexuscrm coverage``: the proof, per identity of a pack, that its generations tile every input admitted."""

from __future__ import annotations

import argparse
from typing import Any

from nexuscrm.connectors.v1 import connectors_pb2 as cn_pb
from nexuscrm_tools.clients import Clients
from nexuscrm_tools.commands.shared import (
    IDENTITY_FLAGS,
    RPC_TIMEOUT,
    WORK_TYPE_OR_IDENTITY,
    Outcome,
    leaf,
    narrow_to_identity,
    paged,
    title_count,
)
from nexuscrm_tools.exits import ExitCode
from nexuscrm_tools.json_view import enum_word, message_data
from nexuscrm_tools.tables import listing


def coverage(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Prove, per identity of a pack, that its generations tile every input it was admitted.

    Each identity's high-water ordinal, whether it is tiled (no gap, no overlap), its ranges
    by state (completed, in flight, queued, failed, replayed, skipped, pruned) and its first
    exceptions; paged by identity. Exit 9 when an identity on the page is not tiled.
    """
    request = cn_pb.GetCoverageRequest(pack_install_id=args.pack, page_size=args.page_size, page_token=args.page_token)
    narrow_to_identity(args, request)
    response = clients.connectors.GetCoverage(request, timeout=RPC_TIMEOUT)
    rows = [
        (
            i.route.source_lane,
            i.route.work_type,
            i.high_water_ordinal,
            "yes" if i.tiled else "NO",
            _runs(i),
            _exceptions(i),
        )
        for i in response.identities
    ]
    broken = sum(not i.tiled for i in response.identities)
    untiled = f" ({broken} not tiled)" if broken else ""
    title = f"coverage of {args.pack}{untiled}{title_count(rows, response.next_page_token)}"
    columns = ("lane", "work type", "high water", "tiled", "ranges", "exceptions")
    code = ExitCode.CHECK_FAILED if broken else ExitCode.OK
    return Outcome(data=message_data(response), view=listing(title, columns, rows), code=code)


def _runs(identity: cn_pb.IdentityCoverage) -> str:
    """An identity's ranges as runs of one state: ``completed 1 to 40; failed 41 to 41``."""
    runs: list[tuple[str, int, int]] = []
    for r in identity.ranges:
        state = enum_word(cn_pb.CoverageRangeState.DESCRIPTOR, r.state)
        if runs and runs[-1][0] == state:
            runs[-1] = (state, runs[-1][1], r.end_ordinal)
        else:
            runs.append((state, r.start_ordinal, r.end_ordinal))
    return "; ".join(f"{state} {start} to {end}" for state, start, end in runs) or "-"


def _exceptions(identity: cn_pb.IdentityCoverage) -> str:
    listed = [
        f"{enum_word(cn_pb.CoverageExceptionKind.DESCRIPTOR, e.kind)} {e.start_ordinal} to {e.end_ordinal}"
        + (f" ({', '.join(e.work_ids)})" if e.work_ids else "")
        for e in identity.exceptions
    ]
    more = identity.exception_count - len(listed)
    return "; ".join(listed + ([f"{more} more"] if more > 0 else [])) or "-"


def add_commands(commands: Any) -> None:
    """``coverage``."""
    sub = leaf(commands, "coverage", coverage, "prove each identity's generations tile its inputs")
    sub.add_argument("pack")
    for flag in IDENTITY_FLAGS:
        sub.add_argument(flag, help=WORK_TYPE_OR_IDENTITY)
    sub.set_defaults(work_type_alone=True)
    paged(sub)
