"""``nexuscrm cutover``: the one-time cutover's gates and audit, and the checkpoint it writes once."""

from __future__ import annotations

import argparse
from typing import Any

from nexuscrm.controlplane.v1 import controlplane_pb2 as cp_pb
from nexuscrm_runtime.durations import parse_duration, whole_seconds
from nexuscrm_tools import tables
from nexuscrm_tools.clients import Clients
from nexuscrm_tools.commands.shared import RPC_TIMEOUT, Outcome, leaf
from nexuscrm_tools.exits import REFUSAL_EXIT_CODES, ExitCode
from nexuscrm_tools.json_view import message_data


def _report_outcome(report: cp_pb.CutoverReport, title: str, data: dict[str, Any]) -> Outcome:
    rows = [(f.category, f.rule, f.count, ", ".join(f.sample_ids), f.detail) for f in report.refusals]
    table = tables.table(
        f"{title}: {'passed' if report.passed else 'REFUSED'} (cutoff {report.legacy_max_ordinal}, "
        f"{report.events_audited} events, {report.work_items_audited} work items audited)",
        ("category", "rule", "count", "samples", "detail"),
        rows,
    )
    return Outcome(data=data, view=table, code=ExitCode.OK if report.passed else refusal_code(report))


def refusal_code(report: cp_pb.CutoverReport) -> ExitCode:
    """The runbook's code for the first refusing family (gate 4, audit 5, prerequisite 6)."""
    if report.refusals and report.refusals[0].category in REFUSAL_EXIT_CODES:
        return REFUSAL_EXIT_CODES[report.refusals[0].category]
    return ExitCode.CHECK_FAILED


def cutover_audit(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Run every cutover gate and the audit; writes nothing. Exit 4, 5 or 6 when refused."""
    response = clients.controlplane.AuditCutover(
        cp_pb.AuditCutoverRequest(pack_install_id=args.pack, timeout_seconds=whole_seconds(args.timeout)),
        timeout=args.timeout.total_seconds() + RPC_TIMEOUT,
    )
    return _report_outcome(response.report, f"cutover audit of {args.pack}", message_data(response))


def cutover_run(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Audit and, when everything passes, write the protocol row exactly once."""
    response = clients.controlplane.Cutover(
        cp_pb.CutoverRequest(pack_install_id=args.pack, timeout_seconds=whole_seconds(args.timeout)),
        timeout=args.timeout.total_seconds() + RPC_TIMEOUT,
    )
    title = "cutover (checkpoint already written)" if response.already_written else "cutover"
    return _report_outcome(response.report, f"{title} of {args.pack}", message_data(response))


def add_commands(commands: Any) -> None:
    """``cutover audit|run``."""
    cutover = commands.add_parser("cutover", help="the one-time cutover").add_subparsers(dest="action", required=True)
    for name, handler, text in (
        ("audit", cutover_audit, "audit only; writes nothing"),
        ("run", cutover_run, "audit and write the checkpoint"),
    ):
        sub = leaf(cutover, name, handler, text)
        sub.add_argument("pack")
        sub.add_argument(
            "--timeout", type=parse_duration, default="1m", metavar="DURATION", help="bound (default %(default)s)"
        )
