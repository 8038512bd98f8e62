"""``nexuscrm retention``: a pack's retention policy and horizon, and a pruning pass on demand."""

from __future__ import annotations

import argparse
from collections import defaultdict
from typing import Any

import grpc

from nexuscrm.connectors.v1 import connectors_pb2 as cn_pb
from nexuscrm_runtime.durations import parse_duration, whole_seconds
from nexuscrm_tools.clients import Clients
from nexuscrm_tools.commands.flow_versions import list_versions, state_word
from nexuscrm_tools.commands.shared import RPC_TIMEOUT, Outcome, fields, leaf
from nexuscrm_tools.json_view import message_data, timestamp_text


def _policy_outcome(policy: cn_pb.RetentionPolicy, title: str, kept: dict[str, str] | None = None) -> Outcome:
    """The policy's fields; ``kept``: work types with Flow versions, which retention does not prune yet."""
    view = {
        "keep generations": policy.keep_generations if policy.HasField("keep_generations") else "-",
        "keep age": f"{policy.keep_seconds}s" if policy.HasField("keep_seconds") else "-",
        "horizon ordinal": policy.horizon_ordinal,
        "duplicate window": f"{policy.duplicate_window_seconds}s"
        if policy.HasField("duplicate_window_seconds")
        else "-",
        "horizon source time": (
            timestamp_text(policy.horizon_source_time) if policy.HasField("horizon_source_time") else "-"
        ),
        "generations pruned": policy.pruned_generations,
        "last pruned at": timestamp_text(policy.last_pruned_at) if policy.HasField("last_pruned_at") else "-",
    }
    if policy.HasField("backlog_oldest_finished_at"):  # GetRetentionPolicy's; the pruner has not caught up
        view["backlog"] = (
            f"{policy.backlog_generations} generations let go but not pruned yet, the oldest finished at "
            f"{timestamp_text(policy.backlog_oldest_finished_at)}"
        )
    elif policy.keep_generations or policy.HasField("keep_seconds"):
        view["backlog"] = "none (the pruner keeps up)"
    data = message_data(policy)
    if kept:
        types = "; ".join(f"work type {work_type} ({versions})" for work_type, versions in kept.items())
        view["not pruned"] = f"{types}: a work type with Flow versions keeps its whole history"
        data["not_pruned_work_types"] = sorted(kept)
    return Outcome(data=data, view=fields(title, view))


def _with_flow_versions(clients: Clients, pack: str) -> dict[str, str]:
    """Each work type of ``pack`` that has Flow versions, and its versions' states (none before contract 1.7.0)."""
    try:
        versions = list_versions(clients, pack)
    except grpc.RpcError as error:
        if error.code() == grpc.StatusCode.UNIMPLEMENTED:  # a Connectors from before Flow versions
            return {}
        raise
    states: dict[str, list[str]] = defaultdict(list)
    for version in versions:
        states[version.work_type].append(f"{version.version} {state_word(version)}")
    return {work_type: ", ".join(states[work_type]) for work_type in sorted(states)}


def retention_set(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Set a pack's retention policy; with neither limit, retention is off (the horizon stays)."""
    request = cn_pb.SetRetentionPolicyRequest(pack_install_id=args.pack)
    if args.keep_generations is not None:
        request.keep_generations = args.keep_generations
    if args.keep_age is not None:
        request.keep_seconds = whole_seconds(args.keep_age)
    if args.duplicate_window is not None:
        request.duplicate_window_seconds = whole_seconds(args.duplicate_window)
    response = clients.connectors.SetRetentionPolicy(request, timeout=RPC_TIMEOUT)
    return _policy_outcome(response.policy, f"retention of {args.pack}")


def retention_show(clients: Clients, args: argparse.Namespace) -> Outcome:
    """A pack's retention policy and horizon, and the work types it does not prune (Flow versions)."""
    response = clients.connectors.GetRetentionPolicy(
        cn_pb.GetRetentionPolicyRequest(pack_install_id=args.pack), timeout=RPC_TIMEOUT
    )
    return _policy_outcome(response.policy, f"retention of {args.pack}", _with_flow_versions(clients, args.pack))


def retention_prune(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Prune what the pack's policy lets go now (one bounded pass); ``--dry-run`` only counts it."""
    response = clients.connectors.Prune(
        cn_pb.PruneRequest(pack_install_id=args.pack, dry_run=args.dry_run, max_generations=args.max_generations),
        timeout=RPC_TIMEOUT,
    )
    verb = "would prune" if response.dry_run else "pruned"
    view = {
        f"generations {verb}": response.generations,
        f"events {verb}": response.events,
        f"receipts {verb}": response.receipts,
        "old generations kept": response.kept,
        "horizon ordinal": response.horizon_ordinal,
        f"tombstones {'would expire' if response.dry_run else 'expired'}": response.expired_receipts,
        "generation records expired": response.expired_generations,
    }
    return Outcome(data=message_data(response), view=fields(f"retention pass over {args.pack}", view))


def add_commands(commands: Any) -> None:
    """``retention set|show|prune``."""
    retention = commands.add_parser("retention", help="retention policies").add_subparsers(dest="action", required=True)
    sub = leaf(retention, "set", retention_set, "set a pack's retention policy")
    sub.add_argument("pack")
    sub.add_argument("--keep-generations", type=int, metavar="N", help="newest generations kept per identity")
    sub.add_argument("--keep-age", type=parse_duration, metavar="DURATION", help="keep generations finished since")
    sub.add_argument(
        "--duplicate-window",
        type=parse_duration,
        metavar="DURATION",
        help="expire tombstones of inputs whose source time is older (every delivery then needs a source time)",
    )
    leaf(retention, "show", retention_show, "a pack's policy and horizon").add_argument("pack")
    sub = leaf(retention, "prune", retention_prune, "one pruning pass now (or a dry-run report)")
    sub.add_argument("pack")
    sub.add_argument("--dry-run", action="store_true", help="count what would go, change nothing")
    sub.add_argument("--max-generations", type=int, default=0, metavar="N", help="default: the server's per-pass limit")
