"""``nexuscrm order-policy``: what a generation that failed for good means for its identity's successors."""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from nexuscrm.connectors.v1 import connectors_pb2 as cn_pb
from nexuscrm_tools.clients import Clients
from nexuscrm_tools.commands.shared import RPC_TIMEOUT, Outcome, fields, leaf
from nexuscrm_tools.json_view import enum_word, message_data, timestamp_text

ORDER_POLICIES = {"block": cn_pb.ORDER_POLICY_KIND_BLOCK, "continue": cn_pb.ORDER_POLICY_KIND_CONTINUE}


POLICY_SOURCES = {"work_type": "its work type's own", "pack": "the pack's", "default": "the default"}


def _policy_view(policy: cn_pb.OrderPolicy, title: str) -> Outcome:
    word = enum_word(cn_pb.OrderPolicyKind.DESCRIPTOR, policy.policy)
    view = {
        "policy": word,
        "set": f"{timestamp_text(policy.set_at)} by {policy.set_by}: {policy.reason}"
        if policy.HasField("set_at")
        else "never: the default",
    }
    if policy.work_type:
        view["from"] = POLICY_SOURCES.get(policy.source, policy.source)
    return Outcome(data=message_data(policy), view=fields(title, view))


def _policy_scope(args: argparse.Namespace) -> str:
    return f"work type {args.work_type} of {args.pack}" if args.work_type else args.pack


def order_policy_set(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Set what a generation that failed for good means for its identity's successors in a pack or one work type.

    block: Claim holds them back until it is replayed or skipped; continue (the default): they
    run, and the failed range stays listed by ``dead-letters list`` for replay. A work type's
    policy overrides its pack's for that type's generations; an unknown work type is refused (exit 3).
    """
    response = clients.connectors.SetOrderPolicy(
        cn_pb.SetOrderPolicyRequest(
            pack_install_id=args.pack,
            policy=ORDER_POLICIES[args.policy],
            set_by=args.by,
            reason=args.reason,
            work_type=args.work_type or "",
        ),
        timeout=RPC_TIMEOUT,
    )
    return _policy_view(response.policy, f"order policy of {_policy_scope(args)} set")


def order_policy_show(clients: Clients, args: argparse.Namespace) -> Outcome:
    """A pack's order policy, or one work type's effective one, who set it, when and why."""
    response = clients.connectors.GetOrderPolicy(
        cn_pb.GetOrderPolicyRequest(pack_install_id=args.pack, work_type=args.work_type or ""), timeout=RPC_TIMEOUT
    )
    outcome = _policy_view(response.policy, f"order policy of {_policy_scope(args)}")
    if not args.work_type:
        outcome.data["work_type_policies"] = [message_data(policy) for policy in response.work_type_policies]
        if isinstance(outcome.view, Table):
            for own in response.work_type_policies:
                word = enum_word(cn_pb.OrderPolicyKind.DESCRIPTOR, own.policy)
                set_ = f"{timestamp_text(own.set_at)} by {own.set_by}: {own.reason}"
                outcome.view.add_row(f"work type {own.work_type}", f"{word}, set {set_}")
    return outcome


def add_commands(commands: Any) -> None:
    """``order-policy set|show``."""
    order = commands.add_parser("order-policy", help="what a failure means for its identity").add_subparsers(
        dest="action", required=True
    )
    sub = leaf(order, "set", order_policy_set, "block or continue")
    sub.add_argument("pack")
    sub.add_argument("policy", choices=tuple(ORDER_POLICIES))
    sub.add_argument("--by", required=True, help="who, as recorded")
    sub.add_argument("--reason", required=True, help="why, as recorded")
    sub.add_argument("--work-type", help="set the policy of this work type of the pack, not the pack's")
    sub = leaf(order, "show", order_policy_show, "a pack's order policy")
    sub.add_argument("pack")
    sub.add_argument("--work-type", help="this work type's effective policy: its own, else the pack's")
