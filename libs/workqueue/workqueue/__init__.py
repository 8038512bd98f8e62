"""The shared workqueue vocabulary: every owner imports these names, none owns them."""

from workqueue.errors import DomainError, ErrorKind
from workqueue.identity import (
    KEY_VERSION,
    ProjectionIdentity,
    ProjectionKey,
    decode_projection_key,
)
from workqueue.statuses import TERMINAL_WORK_STATUSES, EventStatus, ReceiptState, WorkStatus
from workqueue.values import InputRow  # after the names values.py imports from this package

__all__ = [
    "KEY_VERSION",
    "TERMINAL_WORK_STATUSES",
    "DomainError",
    "ErrorKind",
    "EventStatus",
    "InputRow",
    "ProjectionIdentity",
    "ProjectionKey",
    "ReceiptState",
    "WorkStatus",
    "decode_projection_key",
]
