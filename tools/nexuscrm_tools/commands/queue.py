"""``nexuscrm queue``: a pack's native queue, its depth, oldest waiting generation and claim pauses."""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from nexuscrm.connectors.v1 import connectors_pb2 as cn_pb
from nexuscrm_runtime.clock import iso_utc
from nexuscrm_runtime.durations import parse_duration
from nexuscrm_tools.clients import Clients
from nexuscrm_tools.commands.claims import pause_row
from nexuscrm_tools.commands.shared import RPC_TIMEOUT, Outcome, fields, leaf
from nexuscrm_tools.exits import ExitCode
from nexuscrm_tools.json_view import message_data
from nexuscrm_wire import convert
from workqueue.values import QueueState


def _queue_outcome(state: QueueState, undrained: ExitCode) -> Outcome:
    counts = ", ".join(
        f"{name} {getattr(state, name)}" for name in ("pending", "blocked", "retry", "processing", "receipts_waiting")
    )
    # Drained with dead letters: nothing runs any more, yet some inputs were never applied.
    settled = state.drained and not state.dead_letters
    drained: object = state.drained
    if state.drained and state.dead_letters:
        drained = (
            f"yes, but {state.dead_letters} dead letters: their inputs were never applied; replay or skip them"
            f" (nexuscrm dead-letters list {state.pack_install_id})"
        )
    view: dict[str, object] = {
        "drained": drained,
        "depth": f"{state.depth} generations ({counts.replace('_', ' ')})",
        "oldest waiting": state.oldest_waiting_work_id or "-",
        "waiting since": iso_utc(state.oldest_waiting_since) or "-",
        "waiting for": f"{state.oldest_waiting_age.total_seconds():.1f}s" if state.oldest_waiting_age else "-",
    }
    return Outcome(
        data=message_data(convert.queue_state_to_proto(state)),
        view=fields(f"native queue of {state.pack_install_id}", view),
        code=ExitCode.OK if settled else undrained,
    )


def queue_state(clients: Clients, args: argparse.Namespace) -> Outcome:
    """A pack's native queue: depth per status, receipts waiting, the oldest waiting generation, its claim pauses.

    Also how many generations failed for good, how many of those are dead letters, and how many
    pending ones the order policy holds behind one. Exit 9 (check failed) unless drained without
    dead letters.
    """
    state = clients.connectors_client.queue_state(args.pack)
    outcome = _queue_outcome(state, ExitCode.CHECK_FAILED)
    pauses = clients.connectors.ListClaimPauses(
        cn_pb.ListClaimPausesRequest(pack_install_id=args.pack), timeout=RPC_TIMEOUT
    ).pauses
    outcome.data["paused"] = [message_data(pause) for pause in pauses]
    if isinstance(outcome.view, Table):
        outcome.view.add_row("claims paused", "; ".join(" ".join(map(str, pause_row(p)[1:4])) for p in pauses) or "no")
        outcome.view.add_row("failed for good", f"{state.failed} generations, {state.dead_letters} dead letters")
        held = f"{state.held} pending, held by the order policy block (nexuscrm work list {args.pack} says behind what)"
        outcome.view.add_row("held", held if state.held else "0")
    return outcome


def queue_wait(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Wait until a pack's native queue is drained (Connectors WaitQueueDrained); never changes anything.

    Exit 7 (timeout) with the last state when ``--timeout`` passes first.
    """
    state = clients.connectors_client.wait_queue_drained(args.pack, timeout=args.timeout)
    return _queue_outcome(state, ExitCode.TIMEOUT)


def add_commands(commands: Any) -> None:
    """``queue state|wait``."""
    queue = commands.add_parser("queue", help="a pack's native queue").add_subparsers(dest="action", required=True)
    leaf(queue, "state", queue_state, "depth, oldest waiting generation, drained or not").add_argument("pack")
    sub = leaf(queue, "wait", queue_wait, "wait until drained (never mutates)")
    sub.add_argument("pack")
    sub.add_argument("--timeout", type=parse_duration, required=True, metavar="DURATION", help="bound on the wait")
