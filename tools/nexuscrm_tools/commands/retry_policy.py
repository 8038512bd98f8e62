"""``nexuscrm retry-policy``: how many attempts a work type's generations get, and the backoff between them."""

from __future__ import annotations

import argparse
from typing import Any

from nexuscrm.connectors.v1 import connectors_pb2 as cn_pb
from nexuscrm_tools import tables
from nexuscrm_tools.clients import Clients
from nexuscrm_tools.commands.shared import RPC_TIMEOUT, Outcome, leaf
from nexuscrm_tools.json_view import message_data, timestamp_text
from nexuscrm_tools.tables import plural


def _retry_policy_row(policy: cn_pb.RetryPolicy) -> str:
    """A retry policy in a line: attempts, backoff, and who set it when and why."""
    backoff = f"backoff {policy.backoff_base_seconds}s doubling up to {policy.backoff_max_seconds}s"
    set_ = (
        f"set {timestamp_text(policy.set_at)} by {policy.set_by}: {policy.reason}"
        if policy.HasField("set_at")
        else "Connectors' default"
    )
    return f"{plural(policy.max_attempts, 'attempt')}, {backoff}; {set_}"


def retry_policy_set(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Set how many attempts a work type's generations get before they fail for good, and the backoff between them.

    A backoff bound left out is Connectors' setting; out of range or an unknown work type is
    refused (exit 2), nothing changed.
    """
    request = cn_pb.SetRetryPolicyRequest(
        pack_install_id=args.pack,
        work_type=args.work_type,
        max_attempts=args.max_attempts,
        set_by=args.by,
        reason=args.reason,
    )
    if args.backoff_base is not None:
        request.backoff_base_seconds = args.backoff_base
    if args.backoff_max is not None:
        request.backoff_max_seconds = args.backoff_max
    response = clients.connectors.SetRetryPolicy(request, timeout=RPC_TIMEOUT)
    title = f"retry policy of work type {args.work_type} of {args.pack} set"
    return Outcome(data=message_data(response.policy), view=f"{title}: {_retry_policy_row(response.policy)}")


def retry_policy_show(clients: Clients, args: argparse.Namespace) -> Outcome:
    """A work type's effective retry policy; without ``--work-type``, Connectors' default and each work type's own."""
    response = clients.connectors.GetRetryPolicy(
        cn_pb.GetRetryPolicyRequest(pack_install_id=args.pack, work_type=args.work_type or ""), timeout=RPC_TIMEOUT
    )
    data = message_data(response.policy)
    if args.work_type:
        rows = [(f"work type {args.work_type}", _retry_policy_row(response.policy))]
    else:
        data["work_type_policies"] = [message_data(policy) for policy in response.work_type_policies]
        rows = [("default", _retry_policy_row(response.policy))]
        rows += [(f"work type {own.work_type}", _retry_policy_row(own)) for own in response.work_type_policies]
    return Outcome(data=data, view=tables.table(f"retry policy of {args.pack}", ("scope", "policy"), rows))


def add_commands(commands: Any) -> None:
    """``retry-policy set|show``."""
    retry = commands.add_parser("retry-policy", help="attempts and backoff per work type").add_subparsers(
        dest="action", required=True
    )
    sub = leaf(retry, "set", retry_policy_set, "a work type's attempts and backoff")
    sub.add_argument("pack")
    sub.add_argument("--work-type", required=True, help="the work type of the pack it is for")
    sub.add_argument("--max-attempts", type=int, required=True, metavar="N", help="1 to 100")
    for flag, text in (("--backoff-base", "first delay, 0 to 86400"), ("--backoff-max", "longest delay, to 86400")):
        sub.add_argument(flag, type=int, metavar="SECONDS", help=f"{text} (default: the service's)")
    sub.add_argument("--by", required=True, help="who, as recorded")
    sub.add_argument("--reason", required=True, help="why, as recorded")
    sub = leaf(retry, "show", retry_policy_show, "Connectors' default and each work type's own")
    sub.add_argument("pack")
    sub.add_argument("--work-type", help="this work type's effective policy: its own, else Connectors' default")
