"""A generation's retry policy: its work type's, else Connectors' settings (decision 175); read where Fail decides.

The operator sets and shows policies with ``operating.retry_policy``; the hot path only reads
the effective one here (one primary-key read in Fail's transaction).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from typing import Any

from sqlalchemy.engine import Connection

from nexuscrm_connectors.queries import retry_policy as retry_policy_sql
from nexuscrm_connectors.queries.work_items import WorkRow
from nexuscrm_connectors.settings import Settings, exponential_backoff


class Source(enum.StrEnum):
    """Where an effective retry policy comes from."""

    WORK_TYPE = "work_type"
    DEFAULT = "default"


@dataclasses.dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """A work type's effective retry policy, or Connectors' default (``work_type`` empty).

    ``source`` DEFAULT: nothing was set (``set_by`` and ``reason`` empty, ``set_at`` None).
    """

    pack_install_id: str
    work_type: str
    max_attempts: int
    backoff_base_seconds: int
    backoff_max_seconds: int
    source: Source
    set_by: str = ""
    reason: str = ""
    set_at: dt.datetime | None = None

    def backoff_seconds(self, attempt: int) -> int:
        """Delay before attempt ``attempt + 1`` after ``attempt`` failed attempts."""
        return exponential_backoff(self.backoff_base_seconds, self.backoff_max_seconds, attempt)


def default_policy(
    settings: Settings, pack_install_id: str, work_type: str = "", *, max_attempts: int = 0
) -> RetryPolicy:
    """Connectors' settings as a policy; ``max_attempts``: what admission recorded (0: the setting)."""
    return RetryPolicy(
        pack_install_id=pack_install_id,
        work_type=work_type,
        max_attempts=max_attempts or settings.max_attempts,
        backoff_base_seconds=settings.retry_base_seconds,
        backoff_max_seconds=settings.retry_max_seconds,
        source=Source.DEFAULT,
    )


def from_row(row: Any) -> RetryPolicy:
    """The policy a WorkTypeRetryPolicy row records."""
    return RetryPolicy(
        pack_install_id=row.PackInstallId,
        work_type=row.WorkType,
        max_attempts=row.MaxAttempts,
        backoff_base_seconds=row.RetryBaseSeconds,
        backoff_max_seconds=row.RetryMaxSeconds,
        source=Source.WORK_TYPE,
        set_by=row.SetBy,
        reason=row.Reason,
        set_at=row.SetAt,
    )


def effective(connection: Connection, settings: Settings, work: WorkRow) -> RetryPolicy:
    """Generation ``work``'s retry policy: its work type's (one primary-key read), else Connectors' settings.

    Without a policy of its work type the attempts are what admission recorded on the row.
    """
    row = retry_policy_sql.work_type_retry_policy_get(connection, work.PackInstallId, work.WorkType)
    if row is None:
        return default_policy(settings, work.PackInstallId, work.WorkType, max_attempts=work.MaxAttempts)
    return from_row(row)
