"""``nexuscrm drain``: a pack's old-protocol work that is not terminal yet, read once or until drained."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from nexuscrm.controlplane.v1 import controlplane_pb2 as cp_pb
from nexuscrm_runtime.durations import parse_duration
from nexuscrm_runtime.polling import poll_until
from nexuscrm_tools import tables
from nexuscrm_tools.clients import Clients
from nexuscrm_tools.commands.shared import RPC_TIMEOUT, Outcome, leaf
from nexuscrm_tools.exits import ExitCode
from nexuscrm_tools.json_view import message_data


def _drain_outcome(response: cp_pb.GetDrainStatusResponse, undrained: ExitCode) -> Outcome:
    data = message_data(response)
    rows = [(h.reason, h.count, ", ".join(h.sample_work_ids)) for h in response.holds]
    counts = ", ".join(f"{name} {getattr(response, name)}" for name in ("pending", "blocked", "retry", "processing"))
    table = tables.table(
        f"{response.pack_install_id}: {'drained' if response.drained else 'not drained'} ({counts})",
        ("held by", "count", "sample work ids"),
        rows,
    )
    return Outcome(data=data, view=table, code=ExitCode.OK if response.drained else undrained)


def _drain_read(clients: Clients, pack_install_id: str) -> Callable[[], cp_pb.GetDrainStatusResponse]:
    stub = clients.controlplane

    def read() -> cp_pb.GetDrainStatusResponse:
        response: cp_pb.GetDrainStatusResponse = stub.GetDrainStatus(
            cp_pb.GetDrainStatusRequest(pack_install_id=pack_install_id), timeout=RPC_TIMEOUT
        )
        return response

    return read


def drain_status(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Old-protocol work of a pack that is not terminal yet; exit 9 (check failed) unless drained."""
    return _drain_outcome(_drain_read(clients, args.pack)(), ExitCode.CHECK_FAILED)


def drain_wait(
    clients: Clients,
    args: argparse.Namespace,
    *,
    monotonic: Callable[[], float] = time.monotonic,
    wait: Callable[[float], bool] | None = None,
) -> Outcome:
    """Poll the drain status until drained or ``--timeout``; never changes anything.

    The loop is ``nexuscrm_runtime.polling.poll_until``, as in ``connector-projection-drain``;
    exit 7 (timeout) with what holds the drain when the bound passes first.
    """
    polled = poll_until(
        _drain_read(clients, args.pack),
        lambda response: response.drained,
        timeout=args.timeout,
        interval=args.interval,
        monotonic=monotonic,
        wait=wait,
    )
    return _drain_outcome(polled.status, ExitCode.TIMEOUT)


def add_commands(commands: Any) -> None:
    """``drain status|wait``."""
    drain = commands.add_parser("drain", help="old-protocol drain").add_subparsers(dest="action", required=True)
    leaf(drain, "status", drain_status, "what is not terminal yet").add_argument("pack")
    sub = leaf(drain, "wait", drain_wait, "wait until drained (never mutates)")
    sub.add_argument("pack")
    sub.add_argument("--timeout", type=parse_duration, required=True, metavar="DURATION", help="bound on the wait")
    sub.add_argument(
        "--interval", type=parse_duration, default="2s", metavar="DURATION", help="between checks (default %(default)s)"
    )
