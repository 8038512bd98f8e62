"""The rows admission, replay and the legacy runtime write, typed as their tables' columns.

Built by ``queue.deliveries`` and inserted by ``queries.receipts``, ``events``, ``packs`` and
``work_items``: typed, so mypy checks every key and value of the write path.
"""

from __future__ import annotations

import datetime as dt
from typing import NotRequired, TypedDict


class ReceiptRow(TypedDict):
    """An IngressReceipt row as received."""

    PackInstallId: str
    ReceiptKey: str
    ProjectionKey: str
    PayloadHash: str
    Payload: bytes
    SourceTime: dt.datetime | None
    State: str
    ReceivedAt: dt.datetime
    ConfirmedAt: dt.datetime | None


class EventRow(TypedDict):
    """A new Event row: a fresh input, or a replay Event (no receipt key)."""

    PackInstallId: str
    EnqueueOrdinal: int
    ProjectionKey: str
    ReceiptKey: str | None
    PayloadHash: str
    Payload: bytes
    SourceTime: dt.datetime | None
    Status: str
    IsReplay: bool
    CreatedAt: dt.datetime


class GenerationRow(TypedDict):
    """A new WorkItem row: a generation; ``RunsBeforeWorkId`` only on a replay run first."""

    WorkId: str
    PackInstallId: str
    ProjectionKey: str
    WorkType: str
    InputStartOrdinal: int
    LaneOrdinal: int
    ReplayOfWorkId: str | None
    Status: str
    Attempt: int
    MaxAttempts: int
    ClaimableAt: dt.datetime | None
    CreatedAt: dt.datetime
    AdmittedMemberCount: int
    AdmittedThroughOrdinal: int
    RunsBeforeWorkId: NotRequired[str]
    # A generation of a Flow version's track (decision 185): all three, or none.
    FlowVersion: NotRequired[str | None]
    InputKey: NotRequired[str | None]
    BuildRun: NotRequired[bool]
