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
import logging

from sqlalchemy.engine import Connection, Engine

from nexuscrm_connectors import pruned
from nexuscrm_connectors.context import Context
from nexuscrm_connectors.errors import ConnectorsError, UnknownPack
from nexuscrm_connectors.operating.claim_pauses import check_recorded
from nexuscrm_connectors.operating.order_policy import require_work_type
from nexuscrm_connectors.queries import claims as claims_sql
from nexuscrm_connectors.queries import operator_reads as operator_reads_sql
from nexuscrm_connectors.queries import packs as packs_sql
from nexuscrm_connectors.queries import retry_policy as retry_policy_sql
from nexuscrm_connectors.queries import work_items as work_items_sql
from nexuscrm_connectors.queue import retries
from nexuscrm_runtime.database import run_transaction
from workqueue import WorkStatus
from workqueue.errors import ErrorKind, InvalidArgument
from workqueue.identity import FIELD_MAX_LENGTHS, validate_text
from workqueue.values import WorkItemRow

log = logging.getLogger(__name__)

MAX_ATTEMPTS_LIMIT = 100  # the most attempts a policy may give: beyond it a poison input burns hours
MAX_BACKOFF_SECONDS = 86_400  # seconds: a day, as the longest delay a Flow may ask for (RetryLater)


class RetryNowRefused(ConnectorsError):
    """A retry-now of work that does not wait in retry."""

    kind = ErrorKind.FAILED_PRECONDITION


def _in_range(field: str, value: int, low: int, high: int, low_name: str = "") -> None:
    if not low <= value <= high:
        lowest = f"{low_name} ({low})" if low_name else str(low)
        raise InvalidArgument(f"{field} must be between {lowest} and {high}, got {value}", field=field)


def set_policy(
    context: Context,
    pack_install_id: str,
    work_type: str,
    *,
    max_attempts: int,
    backoff_base_seconds: int | None,
    backoff_max_seconds: int | None,
    set_by: str,
    reason: str,
) -> retries.RetryPolicy:
    """Set ``work_type``'s retry policy in the pack; a backoff bound left None is Connectors' setting.

    The maximum left None is at least the base: an operator who asks for a longer first delay
    than Connectors' longest gets that delay, not a refusal.

    Refuses (``InvalidArgument`` naming the field) a missing pack, work type, operator or reason,
    ``max_attempts`` outside 1..``MAX_ATTEMPTS_LIMIT``, a base outside 0..``MAX_BACKOFF_SECONDS``
    and a maximum outside base..``MAX_BACKOFF_SECONDS``; an unknown pack (``UnknownPack``) and a
    work type the pack has no generation of (``UnknownWorkType``). Nothing is written then.
    """
    engine, settings, clock = context.engine, context.settings, context.clock
    if not pack_install_id:
        raise InvalidArgument("pack_install_id is required", field="pack_install_id")
    if not work_type:
        raise InvalidArgument("work_type is required: a retry policy is one work type's", field="work_type")
    validate_text("work_type", work_type, FIELD_MAX_LENGTHS["work_type"])
    check_recorded("set_by", set_by, reason)
    base = settings.retry_base_seconds if backoff_base_seconds is None else backoff_base_seconds
    ceiling = max(settings.retry_max_seconds, base) if backoff_max_seconds is None else backoff_max_seconds
    _in_range("max_attempts", max_attempts, 1, MAX_ATTEMPTS_LIMIT)
    _in_range("backoff_base_seconds", base, 0, MAX_BACKOFF_SECONDS)
    _in_range("backoff_max_seconds", ceiling, base, MAX_BACKOFF_SECONDS, "backoff_base_seconds")

    def run(connection: Connection) -> retries.RetryPolicy:
        pack = packs_sql.pack_lock(connection, pack_install_id, clock)
        require_work_type(connection, pack_install_id, work_type)
        packs_sql.pack_control_version_bump(connection, pack_install_id)  # on Galera too, one decision at a time
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
        return retries.RetryPolicy(
            pack_install_id=pack_install_id,
            work_type=work_type,
            max_attempts=max_attempts,
            backoff_base_seconds=base,
            backoff_max_seconds=ceiling,
            source=retries.Source.WORK_TYPE,
            set_by=set_by,
            reason=reason,
            set_at=pack.now,
        )

    return run_transaction(engine, run, name="set retry policy")


def get_policy(context: Context, pack_install_id: str, work_type: str = "") -> retries.RetryPolicy:
    """``work_type``'s effective retry policy (its own, else Connectors' settings); without one, Connectors' default.

    Raises ``UnknownPack``, and ``UnknownWorkType`` for a work type the pack has no generation of.
    """
    engine, settings = context.engine, context.settings
    if not pack_install_id:
        raise InvalidArgument("pack_install_id is required", field="pack_install_id")
    if work_type:
        validate_text("work_type", work_type, FIELD_MAX_LENGTHS["work_type"])
    with engine.connect() as connection:
        if operator_reads_sql.pack_namespace(connection, pack_install_id) is None:
            raise UnknownPack(f"pack_install_id {pack_install_id!r} is not installed", field="pack_install_id")
        require_work_type(connection, pack_install_id, work_type)
        own = retry_policy_sql.work_type_retry_policy_get(connection, pack_install_id, work_type) if work_type else None
    return retries.from_row(own) if own is not None else retries.default_policy(settings, pack_install_id, work_type)


def work_type_policies(engine: Engine, pack_install_id: str) -> list[retries.RetryPolicy]:
    """Every work type of the pack with a retry policy of its own, by work type (the pack is checked by the caller)."""
    with engine.connect() as connection:
        rows = retry_policy_sql.work_type_retry_policies_of_pack(connection, pack_install_id)
    return [retries.from_row(row) for row in rows]


def retry_now(context: Context, work_id: str, *, retried_by: str, reason: str) -> WorkItemRow:
    """End the backoff of generation ``work_id``, waiting in retry: claimable at the database's now.

    Refuses (``RetryNowRefused``, naming its status) work in any other status, unknown
    (``WorkNotFound``) or pruned (``WorkPruned``) work; nothing changes then. A generation whose
    retry is already due is answered unchanged. Who and why go to the log (one line).
    """
    engine, clock = context.engine, context.clock
    if not work_id:
        raise InvalidArgument("work_id is required", field="work_id")
    check_recorded("retried_by", retried_by, reason)

    def run(connection: Connection) -> WorkItemRow:
        row = work_items_sql.work_item_held(connection, work_id, clock, lock=True)
        if row is None:
            pruned.refuse_if_pruned(connection, work_id)
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
