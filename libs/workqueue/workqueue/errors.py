"""The root of every domain error, and the kinds that the RPC layer maps to status codes."""

from __future__ import annotations

import enum


class ErrorKind(enum.StrEnum):
    """What went wrong, in the caller's terms; each kind maps to one gRPC status code."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    ABORTED = "ABORTED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    UNAVAILABLE = "UNAVAILABLE"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    DATA_LOSS = "DATA_LOSS"  # durable facts that must exist are missing


class DomainError(Exception):
    """An expected refusal with a message fit for the caller.

    Each owner derives its own root from this class; the RPC layer turns any ``DomainError``
    into a status with ``kind``'s code and ``str(self)`` as details. ``field`` names the
    request field at fault, when there is one.
    """

    kind: ErrorKind = ErrorKind.FAILED_PRECONDITION

    def __init__(self, message: str, *, kind: ErrorKind | None = None, field: str | None = None):
        super().__init__(message)
        if kind is not None:
            self.kind = kind
        self.field = field


class InvalidArgument(DomainError):
    """A request field is missing, malformed or out of range."""

    kind = ErrorKind.INVALID_ARGUMENT
