"""``nexuscrm claims``: claim pauses of a pack, one identity or one work type, while admission goes on."""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

from nexuscrm.connectors.v1 import connectors_pb2 as cn_pb
from nexuscrm_runtime.durations import parse_duration
from nexuscrm_tools.clients import Clients
from nexuscrm_tools.commands.shared import (
    IDENTITY_FLAGS,
    RPC_TIMEOUT,
    Outcome,
    UsageError,
    _instant,
    identity_of,
    leaf,
)
from nexuscrm_tools.json_view import enum_word, message_data, timestamp_text
from nexuscrm_tools.tables import listing
from nexuscrm_wire import convert

PAUSE_SCOPES = {
    "pack": cn_pb.PAUSE_SCOPE_PACK,
    "identity": cn_pb.PAUSE_SCOPE_IDENTITY,
    "work_type": cn_pb.PAUSE_SCOPE_WORK_TYPE,
}
PAUSE_COLUMNS = ("pause", "scope", "by", "reason", "since", "until")


def _claim_scope(args: argparse.Namespace) -> cn_pb.ClaimScope:
    """The scope ``--scope`` names, with the identity flags (identity) or ``--work-type`` (work_type)."""
    scope = cn_pb.ClaimScope(pack_install_id=args.pack, scope=PAUSE_SCOPES[args.scope])
    if args.scope == "identity":
        route = identity_of(args)
        if route is None:
            raise UsageError(f"--scope identity needs identity flags ({', '.join(IDENTITY_FLAGS)}) naming one identity")
        scope.route.CopyFrom(convert.route_to_proto(route))
    elif args.scope == "work_type":
        scope.work_type = args.work_type or ""
    return scope


def pause_row(pause: cn_pb.ClaimPause) -> tuple[object, ...]:
    """A claim pause as ``PAUSE_COLUMNS`` show it: id, scope, who, why, since and until."""
    scope = pause.scope
    what = enum_word(cn_pb.PauseScope.DESCRIPTOR, scope.scope)
    if scope.HasField("route"):
        what += f" lane {scope.route.source_lane} ({scope.route.event_kind}, {scope.route.work_type})"
    elif scope.work_type:
        what += f" {scope.work_type}"
    until = timestamp_text(pause.expires_at) if pause.HasField("expires_at") else "until resumed"
    return (pause.pause_id, what, pause.paused_by, pause.reason, timestamp_text(pause.paused_at), until)


def claims_pause(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Stop claims of a pack, one identity or one work type; admission goes on, leases granted finish.

    ``--for`` or ``--until`` end it by itself (on the database's clock); otherwise it holds until
    ``claims resume``. Refused: an unknown pack, identity or work type, an expiry in the past
    (exit 2), a scope already paused (exit 8).
    """
    request = cn_pb.PauseClaimsRequest(scope=_claim_scope(args), paused_by=args.by, reason=args.reason)
    if args.duration is not None and args.until is not None:
        raise UsageError("give --for or --until, not both")
    if args.duration is not None:
        request.expires_at.FromDatetime(dt.datetime.now(dt.UTC) + args.duration)
    elif args.until is not None:
        request.expires_at.FromDatetime(args.until)
    response = clients.connectors.PauseClaims(request, timeout=RPC_TIMEOUT)
    return Outcome(
        data=message_data(response.pause), view=listing("claims paused", PAUSE_COLUMNS, [pause_row(response.pause)])
    )


def claims_resume(clients: Clients, args: argparse.Namespace) -> Outcome:
    """End the active pause of a scope; its work is claimable again at once."""
    response = clients.connectors.ResumeClaims(
        cn_pb.ResumeClaimsRequest(scope=_claim_scope(args), resumed_by=args.by), timeout=RPC_TIMEOUT
    )
    pause = response.pause
    view = f"claims resumed: pause {pause.pause_id} ended at {timestamp_text(pause.resumed_at)} by {pause.resumed_by}"
    return Outcome(data=message_data(pause), view=view)


def claims_list(clients: Clients, args: argparse.Namespace) -> Outcome:
    """A pack's active claim pauses."""
    response = clients.connectors.ListClaimPauses(
        cn_pb.ListClaimPausesRequest(pack_install_id=args.pack), timeout=RPC_TIMEOUT
    )
    rows = [pause_row(p) for p in response.pauses]
    return Outcome(data=message_data(response), view=listing(f"claim pauses of {args.pack}", PAUSE_COLUMNS, rows))


def add_commands(commands: Any) -> None:
    """``claims pause|resume|list``."""
    claims = commands.add_parser("claims", help="claim pauses").add_subparsers(dest="action", required=True)
    for name, handler, text in (
        ("pause", claims_pause, "stop claims of a pack, identity or work type"),
        ("resume", claims_resume, "end a pause"),
    ):
        sub = leaf(claims, name, handler, text)
        sub.add_argument("pack")
        sub.add_argument("--scope", choices=tuple(PAUSE_SCOPES), default="pack", help="default: %(default)s")
        for flag in IDENTITY_FLAGS:
            sub.add_argument(flag, help="--scope identity: those naming one identity; --scope work_type: --work-type")
        sub.add_argument("--by", required=True, help="who, as recorded")
        if name == "pause":
            sub.add_argument("--reason", required=True, help="why, as recorded")
            sub.add_argument("--for", dest="duration", type=parse_duration, metavar="DURATION", help="ends by itself")
            sub.add_argument("--until", type=_instant, metavar="INSTANT", help="ends by itself then (ISO 8601)")
    leaf(claims, "list", claims_list, "a pack's active pauses").add_argument("pack")
