"""What is deployed and how it stands: each service's version and health, the host's activation gate and workers."""

from __future__ import annotations

import argparse
from typing import Any

from nexuscrm.integration.v1 import integration_pb2 as in_pb
from nexuscrm_tools import service_health, tables, versions
from nexuscrm_tools.clients import SERVICES, Clients, deployed
from nexuscrm_tools.commands.shared import RPC_TIMEOUT, Outcome, leaf
from nexuscrm_tools.exits import ExitCode
from nexuscrm_tools.json_view import message_data
from nexuscrm_tools.tables import listing


def activation(clients: Clients, args: argparse.Namespace) -> Outcome:
    """The host's activation gate; exit 9 when not active."""
    response = clients.integration.GetActivation(in_pb.GetActivationRequest(), timeout=RPC_TIMEOUT)
    view = listing(
        "activation: " + ("active" if response.active else "NOT active") + "; missing",
        ("missing",),
        [(m,) for m in response.missing],
    )
    return Outcome(
        data=message_data(response), view=view, code=ExitCode.OK if response.active else ExitCode.CHECK_FAILED
    )


def workers(clients: Clients, args: argparse.Namespace) -> Outcome:
    """The host's workers and what they are doing."""
    response = clients.integration.ListWorkers(in_pb.ListWorkersRequest(), timeout=RPC_TIMEOUT)
    rows = [
        (
            w.worker_id,
            w.pack_install_id,
            w.work_type,
            w.flow,
            w.state,
            w.current_work_id,
            w.executions,
            f"{w.clock_skew_seconds:+.3f}" if w.HasField("clock_skew_seconds") else "",
        )
        for w in response.workers
    ]
    columns = ("worker", "pack", "work type", "flow", "state", "work", "executions", "clock skew s")
    return Outcome(data=[message_data(w) for w in response.workers], view=listing("workers", columns, rows))


def version(clients: Clients, args: argparse.Namespace) -> Outcome:
    """What each deployed service is (GetBuildInfo), side by side.

    The deployed services are those whose NEXUSCRM_<SERVICE>_TARGET is set (with none set,
    all four at their default local addresses). Exit 9 when the combination is outside the
    declared ranges (a service that does not serve the database's schema version, different
    contract major versions), else 3 when a service did not answer (the line names the
    variable that sets its target), else 0.
    """
    answers = clients.build_infos(deployed())
    view = tables.table(f"versions: {versions.summary(answers)}", versions.COLUMNS, versions.rows(answers))
    return Outcome(data=versions.to_json(answers), view=view, code=versions.exit_code(answers))


def health(clients: Clients, args: argparse.Namespace) -> Outcome:
    """The gRPC health of each deployed service (or of ``--service``), for its full name.

    The deployed services are those whose NEXUSCRM_<SERVICE>_TARGET is set (with none set,
    all four at their default local addresses). Exit 0 when every one answers SERVING, else 3
    (the line names the variable that sets its target).
    """
    services = [s for s in SERVICES if s.name == args.service] if args.service else deployed()
    answers = clients.health(services)
    view = tables.table(
        f"health: {service_health.summary(answers)}", service_health.COLUMNS, service_health.rows(answers)
    )
    return Outcome(data=service_health.to_json(answers), view=view, code=service_health.exit_code(answers))


def add_commands(commands: Any) -> None:
    """``activation``, ``workers``, ``version`` and ``health``."""
    leaf(commands, "activation", activation, "the host's activation gate")
    leaf(commands, "workers", workers, "the host's workers")
    leaf(commands, "version", version, "what each service is, and whether they fit together")
    sub = leaf(commands, "health", health, "each service's gRPC health: exit 3 when one is not SERVING")
    sub.add_argument("--service", choices=[s.name for s in SERVICES], help="only this one (default: each deployed one)")
