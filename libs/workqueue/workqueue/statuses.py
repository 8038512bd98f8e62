"""Statuses shared by every owner (see docs/state-machine.md)."""

from __future__ import annotations

import enum


class WorkStatus(enum.StrEnum):
    """Status of a WorkItem (one generation)."""

    PENDING = "pending"
    BLOCKED = "blocked"  # waits for its predecessor of the same identity
    PROCESSING = "processing"
    RETRY = "retry"  # waits for NextAttemptAt
    COMPLETED = "completed"
    FAILED = "failed"


TERMINAL_WORK_STATUSES = frozenset({WorkStatus.COMPLETED, WorkStatus.FAILED})
# Every other status, in the order operators read them (queue depth, drain counts). A tuple,
# so every IN list built from it has the same order wherever it is built.
NONTERMINAL_WORK_STATUSES = (WorkStatus.PENDING, WorkStatus.BLOCKED, WorkStatus.RETRY, WorkStatus.PROCESSING)


class AttemptOutcome(enum.StrEnum):
    """How an attempt that did not complete its generation ended (``WorkAttempt.Outcome``)."""

    FAILED = "failed"  # failed for good: not retryable, or attempts ran out
    RETRY = "retry"  # failed; another attempt follows after the backoff
    RETRY_LATER = "retry_later"  # the Flow asked to run later: not counted
    EXPIRED = "expired"  # the lease expired without Complete or Fail


class EventStatus(enum.StrEnum):
    """Status of an Event; claim moves only the selected Event to processing."""

    PENDING = "pending"
    PROCESSING = "processing"
    PROCESSED = "processed"
    SKIPPED = "skipped"
    FAILED = "failed"


class ReceiptState(enum.StrEnum):
    """State of an ingress receipt."""

    # Durable, not admitted, payload kept: fenced (no Event yet). A receipt of an older
    # release may also be stored beside its Event (it stopped between the admission commit
    # and its separate confirmation); the duplicate path confirms it.
    STORED = "stored"
    CONFIRMED = "confirmed"
    COVERAGE_MISSING = "coverage_missing"  # a duplicate whose input has no generation
