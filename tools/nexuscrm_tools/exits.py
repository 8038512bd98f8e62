"""Which codes of the one exit-code table each operator tool returns (docs/decisions/102-one-operator-convention.md).

The table itself (``ExitCode``, ``DESCRIPTIONS``, ``describe``, ``REFUSAL_EXIT_CODES``) lives
in ``nexuscrm_runtime.exit_codes``, shared with ``nexuscrm-schema`` and the Controlplane's
runbook commands (``nexuscrm_controlplane.runbook``, decision 154); it is re-exported here so
every command of the tools imports it from one place. ``COMMAND_EXIT_CODES`` says which codes
each of the tools' commands returns; its ``--help`` prints exactly those lines, from
``DESCRIPTIONS``.
"""

from __future__ import annotations

import grpc

from nexuscrm_runtime import exit_codes
from nexuscrm_runtime.exit_codes import DESCRIPTIONS, REFUSAL_EXIT_CODES, ExitCode, describe

__all__ = [
    "COMMAND_EXIT_CODES",
    "DESCRIPTIONS",
    "REFUSAL_EXIT_CODES",
    "ExitCode",
    "describe",
    "help_epilog",
    "rpc_exit_code",
]

# Which codes each command returns; its --help lists exactly these (``help_epilog``).
COMMAND_EXIT_CODES: dict[str, tuple[ExitCode, ...]] = {
    "nexuscrm": (
        ExitCode.OK,
        ExitCode.USAGE,
        ExitCode.UNREACHABLE,
        *REFUSAL_EXIT_CODES.values(),
        ExitCode.TIMEOUT,
        ExitCode.REFUSED,
        ExitCode.CHECK_FAILED,
    ),
    "nexuscrm-run": (
        ExitCode.OK,
        ExitCode.FAILURE,
        ExitCode.USAGE,
        ExitCode.UNREACHABLE,
        ExitCode.CHECK_FAILED,
        ExitCode.INTERRUPTED,
    ),
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
    return exit_codes.help_epilog(COMMAND_EXIT_CODES[command])
