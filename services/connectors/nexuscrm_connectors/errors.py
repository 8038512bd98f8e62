"""Errors of the Connectors domain; the RPC layer maps each kind to a status code."""

from __future__ import annotations

from workqueue.errors import DomainError, ErrorKind


class ConnectorsError(DomainError):
    """Root of every Connectors refusal."""


class UnknownPack(ConnectorsError):
    """No PackInstall row has this id."""

    kind = ErrorKind.NOT_FOUND


class ProtocolMissing(ConnectorsError):
    """A native operation on a pack that has no projection protocol row."""

    kind = ErrorKind.FAILED_PRECONDITION


class LegacyRefused(ConnectorsError):
    """The legacy (v0) runtime was asked to write for a pack that has been cut over."""

    kind = ErrorKind.FAILED_PRECONDITION


class WorkNotFound(ConnectorsError):
    """No WorkItem has this WorkId."""

    kind = ErrorKind.NOT_FOUND


class LeaseLost(ConnectorsError):
    """The caller's lease token is not the current lease of a processing WorkItem."""

    kind = ErrorKind.FAILED_PRECONDITION


class ReplayRefused(ConnectorsError):
    """Replay of work that is not terminal, or whose earlier replay is still live."""

    kind = ErrorKind.FAILED_PRECONDITION


class WorkPruned(ConnectorsError):
    """The WorkId named a generation that the pack's retention policy pruned: its inputs are gone.

    FAILED_PRECONDITION, not NOT_FOUND: the WorkId is known, and the answer says when it went.
    """

    kind = ErrorKind.FAILED_PRECONDITION


class NotAReplay(ConnectorsError):
    """A read of replayed inputs for a generation that replays nothing."""

    kind = ErrorKind.FAILED_PRECONDITION


class MembershipMissing(ConnectorsError):
    """A generation's persisted membership is missing or inconsistent: never a fallback."""

    kind = ErrorKind.DATA_LOSS

    @classmethod
    def admitted_count_differs(
        cls, work_id: str, start: int | None, end: int, found: int | None, admitted: int
    ) -> MembershipMissing:
        """The refusal of a range [``start``, ``end``] of ``found`` members where admission recorded ``admitted``."""
        return cls(f"work {work_id}: its range [{start}, {end}] holds {found} inputs but admission recorded {admitted}")


class OrdinalCollision(ConnectorsError):
    """A retained Event holds an ordinal the pack's counter has not handed out yet (or hands out now).

    The counter and the history disagree: a data inconsistency, not a conflict to retry.
    Admission and replay of the pack refuse until an operator repairs it.
    """

    kind = ErrorKind.DATA_LOSS


class LimitExceeded(ConnectorsError):
    """A request is larger than a configured limit."""

    kind = ErrorKind.RESOURCE_EXHAUSTED


class RangeNotRecorded(ConnectorsError):
    """Old-protocol work: its coverage was inferred, so it has no member range to read."""

    kind = ErrorKind.FAILED_PRECONDITION
