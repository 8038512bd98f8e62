"""``nexuscrm identities``: a pack's identities, each with its depth, newest generation and coverage."""

from __future__ import annotations

import argparse
from typing import Any

from nexuscrm.connectors.v1 import connectors_pb2 as cn_pb
from nexuscrm_tools.clients import Clients
from nexuscrm_tools.commands.generations import listed_status, range_text
from nexuscrm_tools.commands.shared import RPC_TIMEOUT, Outcome, leaf, paged, title_count
from nexuscrm_tools.json_view import message_data
from nexuscrm_tools.tables import listing, plural


def pack_identities(clients: Clients, args: argparse.Namespace) -> Outcome:
    """A pack's identities by projection key: the identity flags' values, depth, newest generation and coverage.

    Depth counts its generations not terminal yet; coverage says whether its generations tile
    its inputs (``coverage`` shows the ranges). Paged by identity.
    """
    response = clients.connectors.ListIdentities(
        cn_pb.ListIdentitiesRequest(pack_install_id=args.pack, page_size=args.page_size, page_token=args.page_token),
        timeout=RPC_TIMEOUT,
    )
    rows = [
        (
            i.route.event_kind,
            i.route.route_version,
            i.route.companion_version,
            i.route.work_type,
            i.route.source_lane,
            i.depth,
            _newest(i),
            _coverage_state(i),
        )
        for i in response.identities
    ]
    title = f"identities of {args.pack}{title_count(rows, response.next_page_token)}"
    columns = ("event kind", "route version", "companion version", "work type", "lane", "depth", "newest", "coverage")
    return Outcome(data=message_data(response), view=listing(title, columns, rows))


def _newest(identity: cn_pb.IdentityOverview) -> str:
    if not identity.HasField("newest"):
        return "- (all pruned)"
    return f"{identity.newest.work_id}: {range_text(identity.newest)}, {listed_status(identity.newest)}"


def _coverage_state(identity: cn_pb.IdentityOverview) -> str:
    if not identity.HasField("coverage"):
        return "old protocol: no proof"
    state = identity.coverage
    if state.tiled:
        return f"tiled up to {state.high_water_ordinal}"
    return f"NOT tiled: {plural(state.exception_count, 'exception')} (nexuscrm coverage)"


def add_commands(commands: Any) -> None:
    """``identities``."""
    sub = leaf(commands, "identities", pack_identities, "a pack's identities: depth, newest generation, coverage")
    sub.add_argument("pack")
    paged(sub)
