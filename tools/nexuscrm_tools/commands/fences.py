"""``nexuscrm fences``: admission fences on a namespace or one pack, and the packs released from them."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from rich.table import Table

from nexuscrm.controlplane.v1 import controlplane_pb2 as cp_pb
from nexuscrm_runtime.durations import parse_duration, whole_seconds
from nexuscrm_schema.tables import NAMESPACE_SCOPE
from nexuscrm_tools.clients import Clients
from nexuscrm_tools.commands.shared import RPC_TIMEOUT, Outcome, leaf
from nexuscrm_tools.json_view import message_data, timestamp_text
from nexuscrm_tools.tables import listing


def _fence_rows(fences: Sequence[cp_pb.Fence]) -> Table | str:
    rows = [
        (
            f.fence_id,
            f.namespace,
            f.scope,
            timestamp_text(f.expires_at) if f.HasField("expires_at") else "never",
            f.reason,
            ", ".join(o.pack_install_id for o in f.overrides),
        )
        for f in fences
    ]
    return listing("fences", ("fence", "namespace", "scope", "expires", "reason", "overrides"), rows)


def fences_arm(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Arm a fence on a namespace (``*``) or one pack."""
    response = clients.controlplane.ArmFence(
        cp_pb.ArmFenceRequest(
            namespace=args.namespace,
            scope=args.scope,
            expires_in_seconds=whole_seconds(args.expires_in),
            reason=args.reason,
        ),
        timeout=RPC_TIMEOUT,
    )
    return Outcome(data=message_data(response.fence), view=_fence_rows([response.fence]))


def fences_disarm(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Disarm a fence."""
    clients.controlplane.DisarmFence(cp_pb.DisarmFenceRequest(fence_id=args.fence), timeout=RPC_TIMEOUT)
    return Outcome(data={"fence_id": args.fence, "disarmed": True}, view=f"fence {args.fence} disarmed")


def fences_list(clients: Clients, args: argparse.Namespace) -> Outcome:
    """List a namespace's fences and overrides."""
    response = clients.controlplane.ListFences(cp_pb.ListFencesRequest(namespace=args.namespace), timeout=RPC_TIMEOUT)
    return Outcome(data=[message_data(f) for f in response.fences], view=_fence_rows(response.fences))


def fences_override(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Release a pack from a fence (``add``), or end that release (``remove``)."""
    if args.action == "remove":
        clients.controlplane.RemoveFenceOverride(
            cp_pb.RemoveFenceOverrideRequest(fence_id=args.fence, pack_install_id=args.pack), timeout=RPC_TIMEOUT
        )
        return Outcome(
            data={"fence_id": args.fence, "pack_install_id": args.pack, "removed": True}, view="override removed"
        )
    response = clients.controlplane.AddFenceOverride(
        cp_pb.AddFenceOverrideRequest(
            fence_id=args.fence, pack_install_id=args.pack, expires_in_seconds=whole_seconds(args.expires_in)
        ),
        timeout=RPC_TIMEOUT,
    )
    return Outcome(data=message_data(response.fence), view=_fence_rows([response.fence]))


def add_commands(commands: Any) -> None:
    """``fences arm|disarm|list|override``."""
    fences = commands.add_parser("fences", help="admission fences").add_subparsers(dest="action", required=True)
    sub = leaf(fences, "arm", fences_arm, "arm a fence")
    sub.add_argument("--namespace", required=True)
    sub.add_argument("--scope", default=NAMESPACE_SCOPE, help=f'"{NAMESPACE_SCOPE}" (default) or a pack')
    sub.set_defaults(pack_fields=("scope",))
    sub.add_argument("--expires-in", type=parse_duration, metavar="DURATION", help="default: never expires")
    sub.add_argument("--reason", default="")
    leaf(fences, "disarm", fences_disarm, "disarm a fence").add_argument("fence")
    leaf(fences, "list", fences_list, "list fences").add_argument("--namespace", required=True)
    sub = leaf(fences, "override", fences_override, "add or remove a pack's release from a fence")
    sub.add_argument("action", choices=("add", "remove"))
    sub.add_argument("fence")
    sub.add_argument("pack")
    sub.add_argument("--expires-in", type=parse_duration, metavar="DURATION", help="default: until removed")
