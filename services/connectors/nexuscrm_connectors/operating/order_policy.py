"""A pack's (or one work type's) order policy, and the operator's explicit skip of a generation that failed for good.

"block": a dead letter (failed, never replayed nor skipped) holds back the next generation of
its identity, and with it every later one, until it is replayed or skipped; the claim enforces
it (``order_policy_sql.candidate_not_held`` in the candidate read). "continue" (the default,
decision 160): successors run, the failed range stays listed as a dead letter for replay.
A work type's policy overrides its pack's for that type's generations (decision 165): the
effective policy is the work type's if set, else the pack's, else "continue".
A skip is a recorded act (who, when, why) in SkippedWork: the failed generation keeps its
status, leaves the dead-letter queue and no longer holds its identity. Both run under the
PackInstall row lock, like replay.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Connection, Engine

from nexuscrm_connectors import pruned
from nexuscrm_connectors.context import Context
from nexuscrm_connectors.errors import ConnectorsError, ProtocolMissing, UnknownPack
from nexuscrm_connectors.operating.claim_pauses import check_recorded
from nexuscrm_connectors.queries import claim_pauses as pauses_sql
from nexuscrm_connectors.queries import operator_reads as operator_reads_sql
from nexuscrm_connectors.queries import order_policy as order_policy_sql
from nexuscrm_connectors.queries import packs as packs_sql
from nexuscrm_connectors.queries import work_items as work_items_sql
from nexuscrm_runtime.clock import iso_utc
from nexuscrm_runtime.database import run_transaction
from nexuscrm_schema.tables import WorkItem
from workqueue import WorkStatus
from workqueue.errors import ErrorKind, InvalidArgument
from workqueue.identity import FIELD_MAX_LENGTHS, validate_text


class Policy(enum.StrEnum):
    """What a generation that failed for good means for its identity's successors."""

    BLOCK = order_policy_sql.BLOCK
    CONTINUE = order_policy_sql.CONTINUE


class Source(enum.StrEnum):
    """Where an effective policy comes from."""

    WORK_TYPE = "work_type"
    PACK = "pack"
    DEFAULT = "default"


class UnknownWorkType(ConnectorsError):
    """A policy of a work type of which the pack has no generation."""

    kind = ErrorKind.NOT_FOUND


class HoldInProgress(ConnectorsError):
    """The policy "continue" asked while a replay runs before the generation it holds."""

    kind = ErrorKind.FAILED_PRECONDITION


class SkipRefused(ConnectorsError):
    """A skip of work that is not a dead letter: not failed, replayed, or skipped already."""

    kind = ErrorKind.FAILED_PRECONDITION


@dataclasses.dataclass(frozen=True, kw_only=True)
class OrderPolicy:
    """A pack's or one work type's effective policy; ``set_at`` None: never set, the default applies.

    ``work_type`` empty: the pack's. ``source``: where the policy comes from; a work type
    without a policy of its own has its pack's (who, why and when included).
    """

    pack_install_id: str
    policy: Policy
    set_by: str
    reason: str
    set_at: dt.datetime | None
    work_type: str = ""
    source: Source = Source.DEFAULT


@dataclasses.dataclass(frozen=True, kw_only=True)
class Skip:
    """An operator's skip of a dead letter, as recorded."""

    work_id: str
    pack_install_id: str
    skipped_by: str
    reason: str
    skipped_at: dt.datetime


def _work_type(work_type: str) -> None:
    if work_type:
        validate_text("work_type", work_type, FIELD_MAX_LENGTHS["work_type"])


def require_work_type(connection: Connection, pack_install_id: str, work_type: str) -> None:
    """Refuse (NOT_FOUND) a work type of which the pack has no generation, as a pause of it is refused.

    An order or retry policy (``retry_policy``) of a work type is refused the same way.
    """
    if work_type and not pauses_sql.work_item_exists(connection, pack_install_id, WorkItem.c.WorkType, work_type):
        raise UnknownWorkType(
            f"work type {work_type!r} of pack {pack_install_id}: the pack has no generation of it", field="work_type"
        )


def set_policy(
    context: Context,
    pack_install_id: str,
    policy: Policy | None,
    *,
    set_by: str,
    reason: str,
    work_type: str = "",
) -> OrderPolicy:
    """Set the pack's order policy, or one work type's (``work_type``), which overrides the pack's for it.

    Refuses an unset policy or operator or reason (``InvalidArgument``), an unknown pack
    (``UnknownPack``), a work type the pack has no generation of (``UnknownWorkType``), and
    "continue" where a replay runs before a generation it holds (``HoldInProgress``); nothing
    is written then.
    """
    engine, clock = context.engine, context.clock
    if not pack_install_id:
        raise InvalidArgument("pack_install_id is required", field="pack_install_id")
    if policy is None:
        raise InvalidArgument("policy is required: block or continue", field="policy")
    check_recorded("set_by", set_by, reason)
    _work_type(work_type)

    def run(connection: Connection) -> OrderPolicy:
        pack = packs_sql.pack_lock(connection, pack_install_id, clock)
        row = {"PackInstallId": pack_install_id, "Policy": policy.value, "SetBy": set_by, "Reason": reason}
        if work_type:
            require_work_type(connection, pack_install_id, work_type)
        if policy is Policy.CONTINUE:
            _refuse_releasing_a_replay_run_first(connection, pack_install_id, work_type)
        packs_sql.pack_control_version_bump(connection, pack_install_id)  # on Galera too, one decision at a time
        if work_type:
            found = order_policy_sql.work_type_policy_get(connection, pack_install_id, work_type)
            order_policy_sql.work_type_policy_set(
                connection, {**row, "WorkType": work_type, "SetAt": pack.now}, exists=found is not None
            )
        else:
            found = order_policy_sql.order_policy_get(connection, pack_install_id)
            order_policy_sql.order_policy_set(connection, {**row, "SetAt": pack.now}, exists=found is not None)
        return OrderPolicy(
            pack_install_id=pack_install_id,
            policy=policy,
            set_by=set_by,
            reason=reason,
            set_at=pack.now,
            work_type=work_type,
            source=Source.WORK_TYPE if work_type else Source.PACK,
        )

    return run_transaction(engine, run, name="set order policy")


def _refuse_releasing_a_replay_run_first(connection: Connection, pack_install_id: str, work_type: str) -> None:
    """Refuse "continue" where a replay runs before a held generation: both could run at once.

    A pack-wide "continue" leaves a work type with its own "block" policy held; ``work_type``
    set: only that type's replays count. Raises ``HoldInProgress`` naming the first such replay.
    """
    for replay in order_policy_sql.replays_run_first(connection, pack_install_id):
        if work_type and replay.WorkType != work_type:
            continue
        own = None if work_type else order_policy_sql.work_type_policy_get(connection, pack_install_id, replay.WorkType)
        if own is not None and own.Policy == Policy.BLOCK:
            continue
        raise HoldInProgress(
            f"order policy continue for {f'work type {work_type!r} of ' if work_type else ''}pack {pack_install_id}: "
            f"replay {replay.WorkId} runs before held generation {replay.RunsBeforeWorkId}, which would then run "
            f"beside it; wait until the replay completes, or skip it, then set the policy",
            field="policy",
        )


def get_policy(engine: Engine, pack_install_id: str, work_type: str = "") -> OrderPolicy:
    """The pack's order policy, or ``work_type``'s effective one (its own, else the pack's, else the default).

    Raises ``UnknownPack``, and ``UnknownWorkType`` for a work type the pack has no generation of.
    """
    if not pack_install_id:
        raise InvalidArgument("pack_install_id is required", field="pack_install_id")
    _work_type(work_type)
    with engine.connect() as connection:
        if operator_reads_sql.pack_namespace(connection, pack_install_id) is None:
            raise UnknownPack(f"pack_install_id {pack_install_id!r} is not installed", field="pack_install_id")
        require_work_type(connection, pack_install_id, work_type)
        own = order_policy_sql.work_type_policy_get(connection, pack_install_id, work_type) if work_type else None
        row = own if own is not None else order_policy_sql.order_policy_get(connection, pack_install_id)
    if row is None:
        return OrderPolicy(
            pack_install_id=pack_install_id,
            policy=Policy(order_policy_sql.DEFAULT_POLICY),
            set_by="",
            reason="",
            set_at=None,
            work_type=work_type,
            source=Source.DEFAULT,
        )
    return _from_row(pack_install_id, row, work_type, Source.WORK_TYPE if own is not None else Source.PACK)


def _from_row(pack_install_id: str, row: Any, work_type: str, source: Source) -> OrderPolicy:
    """The policy an OrderPolicy or WorkTypeOrderPolicy row records, as ``work_type``'s from ``source``."""
    return OrderPolicy(
        pack_install_id=pack_install_id,
        policy=Policy(row.Policy),
        set_by=row.SetBy,
        reason=row.Reason,
        set_at=row.SetAt,
        work_type=work_type,
        source=source,
    )


def work_type_policies(engine: Engine, pack_install_id: str) -> list[OrderPolicy]:
    """Every work type of the pack with a policy of its own, by work type (the pack is checked by the caller)."""
    with engine.connect() as connection:
        rows = order_policy_sql.work_type_policies_of_pack(connection, pack_install_id)
    return [_from_row(pack_install_id, row, row.WorkType, Source.WORK_TYPE) for row in rows]


HELD_COUNT_CAP = 10_000  # GetQueueState's held count stops here, as receipts_waiting does


def hold_reason(behind: str, *, dead_letter: bool) -> str:
    """Why a generation the "block" policy holds waits, as an operator reads it.

    ``behind`` is a dead letter (its predecessor, or a replay standing in the predecessor's
    place that failed for good in turn), or a replay of its predecessor that runs first.
    """
    if dead_letter:
        return f"held by order policy block: predecessor {behind} failed for good; replay or skip it"
    return f"held by order policy block: replay {behind} of its failed predecessor runs first"


def holds(engine: Engine, work_ids: Sequence[str]) -> dict[str, tuple[str, str]]:
    """Of ``work_ids``, the generations the "block" policy holds now: each with the WorkId it waits for and why."""
    if not work_ids:
        return {}
    with engine.connect() as connection:
        held = order_policy_sql.work_items_held(connection, work_ids)
        statuses = work_items_sql.work_item_statuses(connection, sorted(set(held.values())))
    return {
        work_id: (behind, hold_reason(behind, dead_letter=statuses.get(behind) == WorkStatus.FAILED))
        for work_id, behind in held.items()
    }


def held_count(engine: Engine, pack_install_id: str) -> int:
    """How many of the pack's pending generations the "block" policy holds, up to ``HELD_COUNT_CAP``."""
    with engine.connect() as connection:
        return order_policy_sql.work_items_held_count(connection, pack_install_id, HELD_COUNT_CAP)


def validate_skip(skipped_by: str, reason: str) -> None:
    """Refuse (``InvalidArgument``) a skip without an operator or a reason, or with one too long."""
    check_recorded("skipped_by", skipped_by, reason)


def skips(engine: Engine, work_ids: Sequence[str]) -> dict[str, Skip]:
    """Of ``work_ids``, the generations an operator skipped, each with its skip (who, when, why)."""
    if not work_ids:
        return {}
    with engine.connect() as connection:
        rows = operator_reads_sql.skipped_work_of(connection, work_ids)
    return {
        row.WorkId: Skip(
            work_id=row.WorkId,
            pack_install_id=row.PackInstallId,
            skipped_by=row.SkippedBy,
            reason=row.Reason,
            skipped_at=row.SkippedAt,
        )
        for row in rows
    }


def skip(context: Context, work_id: str, *, skipped_by: str, reason: str) -> Skip:
    """Skip dead letter ``work_id``: recorded, it leaves the queue and no longer holds its identity.

    Refuses unknown (``WorkNotFound``) or pruned work, old-protocol work (``ProtocolMissing``),
    and work that is not failed, has a replay or was skipped already (``SkipRefused``).
    """
    engine, clock = context.engine, context.clock
    if not work_id:
        raise InvalidArgument("work_id is required", field="work_id")
    validate_skip(skipped_by, reason)

    def run(connection: Connection) -> Skip:
        found = work_items_sql.work_item_get(connection, work_id)
        if found is None:
            pruned.refuse_if_pruned(connection, work_id)
        pack = packs_sql.pack_lock(connection, found.PackInstallId, clock)
        if found.InputStartOrdinal is None:
            raise ProtocolMissing(f"work {work_id} is old-protocol work; only native generations are skipped")
        if found.Status != WorkStatus.FAILED:
            raise SkipRefused(f"work {work_id} is {found.Status}; only work that failed for good can be skipped")
        replayed = order_policy_sql.work_item_replay_any(connection, work_id)
        if replayed is not None:
            raise SkipRefused(f"work {work_id} was replayed as {replayed.WorkId} ({replayed.Status}); nothing to skip")
        skipped = order_policy_sql.skipped_work_get(connection, work_id)
        if skipped is not None:
            raise SkipRefused(f"work {work_id} was skipped at {iso_utc(skipped.SkippedAt)} by {skipped.SkippedBy}")
        packs_sql.pack_control_version_bump(connection, found.PackInstallId)  # a racing skip or replay conflicts
        order_policy_sql.skipped_work_insert(connection, work_id, found.PackInstallId, skipped_by, reason, pack.now)
        return Skip(
            work_id=work_id,
            pack_install_id=found.PackInstallId,
            skipped_by=skipped_by,
            reason=reason,
            skipped_at=pack.now,
        )

    return run_transaction(engine, run, name="skip dead letter")
