"""The one exit-code table of every operator command (docs/decisions/102-one-operator-convention.md).

=== ====================== ================================================================
 0  OK                     done: written, already written, dry run passed, drained, check passed
 1  FAILURE                any other failure (the message says what)
 2  USAGE                  usage error: bad flags or durations, an unknown pack, fence,
                           receipt or WorkId (the service answered NOT_FOUND or
                           INVALID_ARGUMENT)
 3  UNREACHABLE            a service or the database is unreachable, or does not implement the
                           RPC yet; CONNECTOR_CUTOVER_DSN missing or malformed; a service did
                           not start
 4  REFUSED_GATE           refused gate: schema incomplete, no qualifying namespace fence,
                           old work not drained
 5  REFUSED_AUDIT          refused audit: retained old-protocol responsibility is missing or
                           ambiguous
 6  MISSING_PREREQUISITE   missing prerequisite: the WorkItem-only handoff is not recorded
 7  TIMEOUT                the command's bound passed first: nothing was written (a wait
                           prints its last report)
 8  REFUSED                the service refused a valid request (the message names the gRPC
                           status and why)
 9  CHECK_FAILED           a check did not pass: not drained, receipts whose coverage is
                           missing, no protocol row, host not activated, demo invariants,
                           a database schema newer than the command knows
130 INTERRUPTED            interrupted (SIGINT/SIGTERM) before the result
=== ====================== ================================================================

0 to 7 are the cutover runbook's codes as the specification states them
(``connector-projection-cutover``); the RPC command ``nexuscrm``, ``nexuscrm-run`` and
``nexuscrm-schema`` use the same numbers for the same meanings and add 8 and 9, which no
runbook command returns. The table lives here, below every command, so that the service
distributions' commands (``nexuscrm-schema``; the runbook commands of
``nexuscrm_controlplane.runbook``) share it with the operator tools (``nexuscrm_tools.exits``):
each command's module says which codes it returns, and its ``--help`` prints their lines
(``help_epilog``). A cutover refusal exits with the code of the family of its first refusing
check (``REFUSAL_EXIT_CODES``), whether the runbook command or the RPC command ``nexuscrm``
reports it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable


@enum.unique
class ExitCode(enum.IntEnum):
    """Exit status of an operator command (the table in this module's docstring)."""

    OK = 0
    FAILURE = 1
    USAGE = 2
    UNREACHABLE = 3
    REFUSED_GATE = 4
    REFUSED_AUDIT = 5
    MISSING_PREREQUISITE = 6
    TIMEOUT = 7
    REFUSED = 8
    CHECK_FAILED = 9
    INTERRUPTED = 130


DESCRIPTIONS: dict[ExitCode, str] = {
    ExitCode.OK: "done: written, already written, dry run passed, drained, check passed",
    ExitCode.FAILURE: "any other failure (the message says what)",
    ExitCode.USAGE: "usage error: bad flags or durations, an unknown pack, fence, receipt or WorkId",
    ExitCode.UNREACHABLE: "a service or the database is unreachable (or CONNECTOR_CUTOVER_DSN is missing "
    "or malformed, or a service did not start)",
    ExitCode.REFUSED_GATE: "refused gate: schema incomplete, no qualifying namespace fence, old work not drained",
    ExitCode.REFUSED_AUDIT: "refused audit: retained old-protocol responsibility is missing or ambiguous",
    ExitCode.MISSING_PREREQUISITE: "missing prerequisite: the WorkItem-only handoff is not recorded",
    ExitCode.TIMEOUT: "timeout: the bound passed first; nothing was written (a wait prints its last report)",
    ExitCode.REFUSED: "the service refused a valid request (the message names the gRPC status and why)",
    ExitCode.CHECK_FAILED: "a check did not pass: not drained, receipts missing coverage, no protocol row, "
    "host not activated, demo invariants, a database schema newer than the command knows",
    ExitCode.INTERRUPTED: "interrupted (SIGINT or SIGTERM) before the result",
}

# A cutover refusal's code by the family of its first refusing check, named as the wire names
# it (controlplane.v1 AuditFinding.category; the Controlplane audit's ``Category``), in code order.
REFUSAL_EXIT_CODES: dict[str, ExitCode] = {
    "gate": ExitCode.REFUSED_GATE,
    "audit": ExitCode.REFUSED_AUDIT,
    "prerequisite": ExitCode.MISSING_PREREQUISITE,
}


def describe(codes: Iterable[ExitCode]) -> str:
    """The table's lines for ``codes``: ``"  3  a service or the database is unreachable ..."``."""
    return "\n".join(f"  {code.value:>3}  {DESCRIPTIONS[code]}" for code in codes)


def help_epilog(codes: Iterable[ExitCode]) -> str:
    """The "exit codes" section of the ``--help`` of a command that returns ``codes``."""
    return f"exit codes (nexuscrm_runtime.exit_codes):\n{describe(codes)}"
