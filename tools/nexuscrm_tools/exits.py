"""Which codes of the one exit-code table each operator tool returns (docs/decisions/102-one-operator-convention.md).

The table itself (``ExitCode``, ``DESCRIPTIONS``, ``describe``) lives in
``nexuscrm_runtime.exit_codes``, shared with the schema catalog's ``nexuscrm-schema``; it is
re-exported here so every command of the tools imports it from one place.
``COMMAND_EXIT_CODES`` says which codes each command returns; its ``--help`` prints exactly
those lines, from ``DESCRIPTIONS``.
"""

from __future__ import annotations

import grpc

from nexuscrm_controlplane.audit import Category
from nexuscrm_runtime.exit_codes import DESCRIPTIONS, ExitCode, describe

__all__ = [
    "COMMAND_EXIT_CODES",
    "DESCRIPTIONS",
    "REFUSAL_EXIT_CODES",
    "ExitCode",
    "describe",
    "help_epilog",
    "rpc_exit_code",
]

# What every command but the RPC client (whose failures are refusals, 8) may return; the cutover's refusals.
_ANY_COMMAND = (ExitCode.OK, ExitCode.FAILURE, ExitCode.USAGE, ExitCode.UNREACHABLE)
_CUTOVER_REFUSALS = (ExitCode.REFUSED_GATE, ExitCode.REFUSED_AUDIT, ExitCode.MISSING_PREREQUISITE)

# Which codes each command returns; its --help lists exactly these (``help_epilog``).
COMMAND_EXIT_CODES: dict[str, tuple[ExitCode, ...]] = {
    "nexuscrm": (
        ExitCode.OK,
        ExitCode.USAGE,
        ExitCode.UNREACHABLE,
        *_CUTOVER_REFUSALS,
        ExitCode.TIMEOUT,
        ExitCode.REFUSED,
        ExitCode.CHECK_FAILED,
    ),
    "nexuscrm-run": (*_ANY_COMMAND, ExitCode.CHECK_FAILED, ExitCode.INTERRUPTED),
    "connector-projection-cutover": (*_ANY_COMMAND, *_CUTOVER_REFUSALS, ExitCode.TIMEOUT),
    "connector-projection-drain": (*_ANY_COMMAND, ExitCode.TIMEOUT),
    "connector-admission-fence": _ANY_COMMAND,
}

# A cutover refusal's exit code by the family of the first refusing check.
REFUSAL_EXIT_CODES: dict[str, ExitCode] = {
    Category.PREREQUISITE: ExitCode.MISSING_PREREQUISITE,
    Category.GATE: ExitCode.REFUSED_GATE,
    Category.AUDIT: ExitCode.REFUSED_AUDIT,
}


# How ``nexuscrm`` exits when a service answers a call with a status other than OK. A request
# naming a pack, fence, receipt or WorkId the service does not know (NOT_FOUND), or a field it
# cannot accept (INVALID_ARGUMENT), is a usage error as the table says: the operator typed
# something wrong. Every other status of a reachable service refuses a valid request (8).
_RPC_STATUS_EXIT_CODES: dict[grpc.StatusCode, ExitCode] = {
    grpc.StatusCode.NOT_FOUND: ExitCode.USAGE,
    grpc.StatusCode.INVALID_ARGUMENT: ExitCode.USAGE,
    grpc.StatusCode.UNAVAILABLE: ExitCode.UNREACHABLE,
    grpc.StatusCode.UNIMPLEMENTED: ExitCode.UNREACHABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: ExitCode.TIMEOUT,
}


def rpc_exit_code(status: grpc.StatusCode | None) -> ExitCode:
    """The exit code of a call that ended with ``status``: 2, 3 or 7 as above, else 8 (refused)."""
    return _RPC_STATUS_EXIT_CODES.get(status, ExitCode.REFUSED) if status is not None else ExitCode.REFUSED


def help_epilog(command: str) -> str:
    """The "exit codes" section of ``command``'s ``--help`` (see ``COMMAND_EXIT_CODES``)."""
    return f"exit codes (nexuscrm_tools.exits):\n{describe(COMMAND_EXIT_CODES[command])}"
