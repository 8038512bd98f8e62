"""Errors of the Controlplane domain; the RPC layer maps each kind to a status code."""

from __future__ import annotations

from workqueue.errors import DomainError, ErrorKind


class ControlplaneError(DomainError):
    """Root of every Controlplane refusal."""


class UnknownPack(ControlplaneError):
    """No PackInstall row has this id."""

    kind = ErrorKind.NOT_FOUND


class UnknownFence(ControlplaneError):
    """No fence (or no override of it) has this id."""

    kind = ErrorKind.NOT_FOUND


class PackHasHistory(ControlplaneError):
    """Greenfield activation of a pack that already admitted inputs under the old protocol."""

    kind = ErrorKind.FAILED_PRECONDITION


class CutoverRefused(ControlplaneError):
    """A cutover prerequisite, gate or audit rule refused; the message lists every finding."""

    kind = ErrorKind.FAILED_PRECONDITION


class CutoverTimeout(ControlplaneError):
    """The cutover (or a drain wait) did not finish within its bound; nothing was written."""

    kind = ErrorKind.DEADLINE_EXCEEDED
