"""``nexuscrm``: the operator command line over the services' RPCs.

Subcommands: ``packs list|install|activate|protocol|show|find``,
``fences arm|disarm|list|override``, ``drain status|wait``, ``queue state|wait``,
``cutover audit|run``, ``work show|list|members``, ``receipts list|missing``,
``retention set|show|prune``, ``schema contract-payloads``, ``why``, ``activation``,
``workers``, ``version``, ``health``, ``claims pause|resume|list``, ``dead-letters list|count|replay|skip``
``order-policy set|show``, ``retry-policy set|show``, ``work retry-now``, ``coverage``, ``identities``, ``send``
and ``versions build|list|switch|rollback|retire|verify`` (Flow versions, decision 185).
A pack is named by its id or as ``NAMESPACE/NAME[@VERSION]``, and an identity by the identity
flags that name exactly one of the pack's (decision 178).
Tables by default, ``--json`` for scripts (docs/output-conventions.md).
Services are found through the variables NEXUSCRM_SCHEMA_CATALOG_TARGET,
NEXUSCRM_CONTROLPLANE_TARGET, NEXUSCRM_CONNECTORS_TARGET and NEXUSCRM_INTEGRATION_TARGET
(host:port; ``nexuscrm-run --serve`` prints them). With NEXUSCRM_TLS_CA / _CERT / _KEY set, it
speaks mutual TLS as the principal of that certificate (docs/security.md). Durations are Go
durations (``30s``, ``5m``, ``1h30m``), as in the runbook commands. A fence is named by its id or
by the short id the dashboard shows (a unique prefix of at least 8 hex digits).

Exit codes come from the one table of every operator command (``nexuscrm_tools.exits``; the
list below ``--help``): 0 done, the check passed; 2 usage error, or a pack, fence, receipt or
WorkId the service does not know; 3 a service is unreachable or does not implement the RPC
yet (the message names the service and the variable to set), or is not SERVING (``health``);
4, 5, 6 the cutover refused by
gate, audit or missing prerequisite (as ``connector-projection-cutover``); 7 timeout
(``drain wait`` or ``queue wait`` ended undrained, or an RPC's deadline passed); 8 the service
refused a valid request; 9 the check did not pass (not drained, receipts whose coverage is
missing, no protocol row, host not activated, services outside each other's declared ranges:
``version``).
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from nexuscrm_runtime import pack_names
from nexuscrm_runtime.targets import Targets
from nexuscrm_schema.tables import NAMESPACE_SCOPE
from nexuscrm_tools import identities, tables
from nexuscrm_tools.clients import Clients, ServiceCallFailed
from nexuscrm_tools.commands import (
    claims,
    coverage,
    cutover,
    dead_letters,
    deployment,
    drain,
    fences,
    flow_versions,
    order_policy,
    pack_identities,
    packs,
    queue,
    receipts,
    retention,
    retry_policy,
    schema,
    send,
    work,
)
from nexuscrm_tools.commands.shared import IDENTITY_FLAGS, RPC_TIMEOUT, Outcome, UsageError, help_of
from nexuscrm_tools.exits import ExitCode, help_epilog, rpc_exit_code

# Each adds its commands; --help lists them in this order.
COMMAND_GROUPS = (
    packs.add_commands,
    fences.add_commands,
    drain.add_commands,
    queue.add_commands,
    cutover.add_commands,
    work.add_commands,
    receipts.add_commands,
    retention.add_commands,
    schema.add_commands,
    receipts.add_why,
    deployment.add_commands,
    claims.add_commands,
    dead_letters.add_commands,
    order_policy.add_commands,
    retry_policy.add_commands,
    coverage.add_commands,
    pack_identities.add_commands,
    send.add_commands,
    flow_versions.add_commands,
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; each leaf sets ``handler``."""
    parser = argparse.ArgumentParser(
        prog="nexuscrm",
        description=help_of(__doc__),
        epilog=help_epilog("nexuscrm"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    commands = parser.add_subparsers(dest="command", required=True)
    for add_commands in COMMAND_GROUPS:
        add_commands(commands)
    return parser


def _named_packs(clients: Clients, args: argparse.Namespace) -> None:
    """Put the PackInstallId in place of each pack argument given as ``NAMESPACE/NAME[@VERSION]``.

    The arguments are ``pack`` unless the command says otherwise (``fences arm --scope``);
    each name resolved is said on stderr.
    """
    for field in getattr(args, "pack_fields", ("pack",)):
        text = getattr(args, field, None)
        if text and text != NAMESPACE_SCOPE:
            resolved = pack_names.resolve(clients.controlplane, text, timeout=RPC_TIMEOUT)
            if resolved != text:
                print(f"nexuscrm: pack {text} is {resolved}", file=sys.stderr)
            setattr(args, field, resolved)


def _named_identity(clients: Clients, args: argparse.Namespace) -> None:
    """Fill in the identity flags a partial identity left out, from the one identity of the pack it names.

    ``identities.resolve``; nothing to do without identity flags or with all five. ``--work-type``
    alone is a work type where the command says so, and claims name an identity only with
    ``--scope identity``.
    """
    # No pack to look in: ``dead-letters skip WORK_ID``, which refuses identity flags.
    wanted = identities.given(args) if hasattr(args, "lane") and getattr(args, "pack", None) else {}
    if not wanted or len(wanted) == len(IDENTITY_FLAGS) or getattr(args, "scope", "identity") != "identity":
        return
    if set(wanted) == {"work_type"} and getattr(args, "work_type_alone", False):
        return
    route = identities.resolve(clients.connectors, args.pack, wanted, timeout=RPC_TIMEOUT)
    for flag, field in identities.FLAG_FIELDS.items():
        setattr(args, flag.removeprefix("--").replace("-", "_"), getattr(route, field))


def main(argv: list[str] | None = None) -> ExitCode:
    """Run one subcommand; return its exit code (``nexuscrm_tools.exits``)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    console = Console()
    clients = Clients(Targets.from_env())
    try:
        _named_packs(clients, args)
        _named_identity(clients, args)
        outcome: Outcome = args.handler(clients, args)
    except UsageError as error:
        args.command_parser.error(str(error))
    except (pack_names.PackNameError, identities.IdentityUnresolved) as error:
        print(f"nexuscrm: {error}", file=sys.stderr)
        return ExitCode.USAGE
    except ServiceCallFailed as error:
        print(f"nexuscrm: {error.message}", file=sys.stderr)
        return rpc_exit_code(error.code())
    finally:
        clients.close()
    if args.json:
        print(json.dumps(outcome.data, indent=2, sort_keys=True))
    elif isinstance(outcome.view, Table):
        tables.print_whole(console, outcome.view)
    else:
        console.print(outcome.view)
    return outcome.code


if __name__ == "__main__":
    raise SystemExit(main())
