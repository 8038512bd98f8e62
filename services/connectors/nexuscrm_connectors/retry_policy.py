"""A work type's retry policy, and the operator's retry-now that ends one generation's backoff (decision 175).

The policy of a work type of a pack: how many attempts its generations get before they fail
for good, and the exponential backoff between them. A work type without one has Connectors'
settings: the attempts admission recorded on each generation (``WorkItem.MaxAttempts``, from
NEXUSCRM_MAX_ATTEMPTS) and the settings' backoff (NEXUSCRM_RETRY_BASE_SECONDS,
NEXUSCRM_RETRY_MAX_SECONDS). Fail reads the effective policy (``effective``: one primary-key
read in its transaction); admission and the claim never read it, so a lease that expires
counts against the attempts admission recorded. Set under the PackInstall row lock with who
and why, like the order policy (``order_policy``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import logging
from typing import Any

from sqlalchemy.engine import Connection, Engine

from nexuscrm_connectors import retention
from nexuscrm_connectors.claim_pauses import OPERATOR_MAX_LENGTH, REASON_MAX_LENGTH
from nexuscrm_connectors.errors import ConnectorsError, UnknownPack
from nexuscrm_connectors.order_policy import require_work_type
from nexuscrm_connectors.queries import claims as claims_sql
from nexuscrm_connectors.queries import operator_reads as operator_reads_sql
from nexuscrm_connectors.queries import packs as packs_sql
from nexuscrm_connectors.queries import retry_policy as retry_policy_sql
from nexuscrm_connectors.queries import work_items as work_items_sql
from nexuscrm_connectors.queries.work_items import WorkRow
from nexuscrm_connectors.settings import Settings, exponential_backoff
from nexuscrm_runtime.clock import DatabaseClock
from nexuscrm_runtime.database import run_transaction
from workqueue import WorkStatus
from workqueue.errors import ErrorKind, InvalidArgument
from workqueue.identity import FIELD_MAX_LENGTHS, validate_text
from workqueue.values import WorkItemRow

log = logging.getLogger(__name__)

MAX_ATTEMPTS_LIMIT = 100  # the most attempts a policy may give: beyond it a poison input burns hours
MAX_BACKOFF_SECONDS = 86_400  # seconds: a day, as the longest delay a Flow may ask for (RetryLater)


class Source(enum.StrEnum):
    """Where an effective retry policy comes from."""

    WORK_TYPE = "work_type"
    DEFAULT = "default"


class RetryNowRefused(ConnectorsError):
    """A retry-now of work that does not wait in retry."""

    kind = ErrorKind.FAILED_PRECONDITION


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


def _from_row(row: Any) -> RetryPolicy:
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
    return _from_row(row)


def _recorded(operator_field: str, operator: str, reason: str) -> None:
    validate_text(operator_field, operator, OPERATOR_MAX_LENGTH)
    validate_text("reason", reason, REASON_MAX_LENGTH)


def _in_range(field: str, value: int, low: int, high: int, low_name: str = "") -> None:
    if not low <= value <= high:
        lowest = f"{low_name} ({low})" if low_name else str(low)
        raise InvalidArgument(f"{field} must be between {lowest} and {high}, got {value}", field=field)


def set_policy(
    engine: Engine,
    settings: Settings,
    clock: DatabaseClock,
    pack_install_id: str,
    work_type: str,
    *,
    max_attempts: int,
    backoff_base_seconds: int | None,
    backoff_max_seconds: int | None,
    set_by: str,
    reason: str,
) -> RetryPolicy:
    """Set ``work_type``'s retry policy in the pack; a backoff bound left None is Connectors' setting.

    The maximum left None is at least the base: an operator who asks for a longer first delay
    than Connectors' longest gets that delay, not a refusal.

    Refuses (``InvalidArgument`` naming the field) a missing pack, work type, operator or reason,
    ``max_attempts`` outside 1..``MAX_ATTEMPTS_LIMIT``, a base outside 0..``MAX_BACKOFF_SECONDS``
    and a maximum outside base..``MAX_BACKOFF_SECONDS``; an unknown pack (``UnknownPack``) and a
    work type the pack has no generation of (``UnknownWorkType``). Nothing is written then.
    """
    if not pack_install_id:
        raise InvalidArgument("pack_install_id is required", field="pack_install_id")
    if not work_type:
        raise InvalidArgument("work_type is required: a retry policy is one work type's", field="work_type")
    validate_text("work_type", work_type, FIELD_MAX_LENGTHS["work_type"])
    _recorded("set_by", set_by, reason)
    base = settings.retry_base_seconds if backoff_base_seconds is None else backoff_base_seconds
    ceiling = max(settings.retry_max_seconds, base) if backoff_max_seconds is None else backoff_max_seconds
    _in_range("max_attempts", max_attempts, 1, MAX_ATTEMPTS_LIMIT)
    _in_range("backoff_base_seconds", base, 0, MAX_BACKOFF_SECONDS)
    _in_range("backoff_max_seconds", ceiling, base, MAX_BACKOFF_SECONDS, "backoff_base_seconds")

    def run(connection: Connection) -> RetryPolicy:
        pack = packs_sql.pack_lock(connection, pack_install_id, clock)
        require_work_type(connection, pack_install_id, work_type)
        found = retry_policy_sql.work_type_retry_policy_get(connection, pack_install_id, work_type)
        row = {
            "PackInstallId": pack_install_id,
            "WorkType": work_type,
            "MaxAttempts": max_attempts,
            "RetryBaseSeconds": base,
            "RetryMaxSeconds": ceiling,
            "SetBy": set_by,
            "Reason": reason,
            "SetAt": pack.now,
        }
        retry_policy_sql.work_type_retry_policy_set(connection, row, exists=found is not None)
        return RetryPolicy(
            pack_install_id=pack_install_id,
            work_type=work_type,
            max_attempts=max_attempts,
            backoff_base_seconds=base,
            backoff_max_seconds=ceiling,
            source=Source.WORK_TYPE,
            set_by=set_by,
            reason=reason,
            set_at=pack.now,
        )

    return run_transaction(engine, run, name="set retry policy")


def get_policy(engine: Engine, settings: Settings, pack_install_id: str, work_type: str = "") -> RetryPolicy:
    """``work_type``'s effective retry policy (its own, else Connectors' settings); without one, Connectors' default.

    Raises ``UnknownPack``, and ``UnknownWorkType`` for a work type the pack has no generation of.
    """
    if not pack_install_id:
        raise InvalidArgument("pack_install_id is required", field="pack_install_id")
    if work_type:
        validate_text("work_type", work_type, FIELD_MAX_LENGTHS["work_type"])
    with engine.connect() as connection:
        if operator_reads_sql.pack_namespace(connection, pack_install_id) is None:
            raise UnknownPack(f"pack_install_id {pack_install_id!r} is not installed", field="pack_install_id")
        require_work_type(connection, pack_install_id, work_type)
        own = retry_policy_sql.work_type_retry_policy_get(connection, pack_install_id, work_type) if work_type else None
    return _from_row(own) if own is not None else default_policy(settings, pack_install_id, work_type)


def work_type_policies(engine: Engine, pack_install_id: str) -> list[RetryPolicy]:
    """Every work type of the pack with a retry policy of its own, by work type (the pack is checked by the caller)."""
    with engine.connect() as connection:
        rows = retry_policy_sql.work_type_retry_policies_of_pack(connection, pack_install_id)
    return [_from_row(row) for row in rows]


def retry_now(engine: Engine, clock: DatabaseClock, work_id: str, *, retried_by: str, reason: str) -> WorkItemRow:
    """End the backoff of generation ``work_id``, waiting in retry: claimable at the database's now.

    Refuses (``RetryNowRefused``, naming its status) work in any other status, unknown
    (``WorkNotFound``) or pruned (``WorkPruned``) work; nothing changes then. A generation whose
    retry is already due is answered unchanged. Who and why go to the log (one line).
    """
    if not work_id:
        raise InvalidArgument("work_id is required", field="work_id")
    _recorded("retried_by", retried_by, reason)

    def run(connection: Connection) -> WorkItemRow:
        row = work_items_sql.work_item_held(connection, work_id, clock, lock=True)
        if row is None:
            retention.refuse_if_pruned(connection, work_id)
        if row.Status != WorkStatus.RETRY:
            raise RetryNowRefused(
                f"work {work_id} is {row.Status}; only a generation waiting in retry can be retried now",
                field="work_id",
            )
        if row.ClaimableAt is None or row.ClaimableAt <= row.Now:
            return work_items_sql.work_item_value(row)  # due already
        expect = {"Status": WorkStatus.RETRY, "ClaimableAt": row.ClaimableAt}
        if claims_sql.work_item_update_if(connection, work_id, expect, {"ClaimableAt": row.Now}) != 1:
            raise RetryNowRefused(f"work {work_id} changed concurrently; nothing was changed", field="work_id")
        return work_items_sql.work_item_value(dataclasses.replace(row, ClaimableAt=row.Now))

    work = run_transaction(engine, run, name="retry now")
    log.info("work %s made claimable now by %s (retry-now): %s", work_id, retried_by, reason)
    return work
