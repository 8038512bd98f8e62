"""Errors of the Integration domain; the RPC layer maps each kind to a status code."""

from __future__ import annotations

from collections.abc import Sequence

from workqueue.errors import DomainError, ErrorKind


class IntegrationError(DomainError):
    """Root of every Integration Service refusal."""


class ActivationRefused(IntegrationError):
    """The activation gate did not pass; ``missing`` names every missing piece."""

    kind = ErrorKind.FAILED_PRECONDITION

    def __init__(self, missing: Sequence[str]) -> None:
        super().__init__("activation refused; missing: " + "; ".join(missing))
        self.missing = tuple(missing)


class HostConfigError(IntegrationError):
    """The host configuration (file or environment) is malformed; the message says where."""

    kind = ErrorKind.INVALID_ARGUMENT


class NotGranted(IntegrationError):
    """A worker was asked to serve a pack that its activation grant does not cover."""

    kind = ErrorKind.PERMISSION_DENIED
