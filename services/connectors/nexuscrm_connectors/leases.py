"""Claims, leases and the end of an attempt: claim, heartbeat, complete, fail.

A claim is a candidate read followed by a compare-and-set UPDATE per candidate that checks
its row count (never SKIP LOCKED: TiDB silently takes no lock with it). The claim's row lock
is what freezes a generation's bounds against a concurrent admission, which only extends
unclaimed attempt-zero rows. Every later call presents the lease token of the claim: a
stale token changes nothing. A generation that becomes terminal unblocks its successor in
the same transaction, so per identity at most one generation runs, in LaneOrdinal order.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import logging
import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from nexuscrm_connectors import packs, queries
from nexuscrm_connectors.errors import LeaseLost, MembershipMissing, ProtocolMissing, UnknownPack, WorkNotFound
from nexuscrm_connectors.models import Claim, WorkItemRow
from nexuscrm_connectors.queries import DbRow
from nexuscrm_connectors.settings import Settings
from nexuscrm_runtime.clock import Clock
from nexuscrm_runtime.database import run_transaction
from nexuscrm_schema_catalog.tables import ConnectorProjectionProtocol, PackInstall
from workqueue import EventStatus, WorkStatus
from workqueue.errors import InvalidArgument
from workqueue.identity import FIELD_MAX_LENGTHS, validate_text

log = logging.getLogger(__name__)

WORKER_ID_MAX_LENGTH = 128
CLAIM_PASSES = 3
RETIRED = "retired"  # _claim_one's answer when the candidate failed for good instead


def check_lease_seconds(settings: Settings, lease_seconds: int) -> int:
    """The lease duration to use: the default for 0, else within [1, max_lease_seconds]."""
    if lease_seconds == 0:
        return settings.default_lease_seconds
    if not 1 <= lease_seconds <= settings.max_lease_seconds:
        raise InvalidArgument(
            f"lease_seconds must be between 1 and {settings.max_lease_seconds}, got {lease_seconds}",
            field="lease_seconds",
        )
    return lease_seconds


@dataclasses.dataclass(kw_only=True)
class ClaimBatch:
    """What one claim did: the leases it granted, and the expired leases it took over."""

    claims: list[Claim] = dataclasses.field(default_factory=list)
    reclaimed: int = 0  # claims of generations whose lease had expired (a new attempt)
    expired_failed: int = 0  # generations whose expired lease was the last attempt: failed for good


def claim(
    engine: Engine,
    settings: Settings,
    clock: Clock,
    *,
    worker_id: str,
    pack_install_ids: Sequence[str] = (),
    work_types: Sequence[str] = (),
    max_items: int = 1,
    lease_seconds: int = 0,
) -> ClaimBatch:
    """Lease up to ``max_items`` claimable native generations to ``worker_id``.

    Claimable: pending; retry whose time has come; processing whose lease expired (a failed
    attempt: it fails for good when attempts run out). Only packs with a protocol row are
    served; naming a pack without one raises ``ProtocolMissing``.
    """
    validate_text("worker_id", worker_id, WORKER_ID_MAX_LENGTH)
    if not 1 <= max_items <= settings.max_claim_items:
        raise InvalidArgument(
            f"max_items must be between 1 and {settings.max_claim_items}, got {max_items}", field="max_items"
        )
    for work_type in work_types:
        validate_text("work_types", work_type, FIELD_MAX_LENGTHS["work_type"])
    lease = dt.timedelta(seconds=check_lease_seconds(settings, lease_seconds))
    now = clock()
    with engine.connect() as connection:
        served = _native_packs(connection, pack_install_ids)
    batch = ClaimBatch()
    # A pass that fails exhausted work unblocks successors that the candidate read could not
    # see; read again then, a bounded number of times.
    for _ in range(CLAIM_PASSES):
        with engine.connect() as connection:
            candidates = queries.work_items_claimable(connection, served, work_types, now, max_items)
        retired = False
        for candidate in candidates:
            if len(batch.claims) == max_items:
                return batch
            try:
                claimed = run_transaction(
                    engine,
                    functools.partial(_claim_one, candidate=candidate, worker_id=worker_id, now=now, lease=lease),
                    name="claim",
                )
            except MembershipMissing as error:
                log.error("not claiming %s: %s", candidate.WorkId, error)
                continue
            if isinstance(claimed, Claim):
                batch.claims.append(claimed)
                # The compare-and-set expected the candidate's status: a processing one had expired.
                batch.reclaimed += candidate.Status == WorkStatus.PROCESSING
            elif claimed is RETIRED:
                batch.expired_failed += 1
                retired = True
        if not retired:
            break
    return batch


def _native_packs(connection: Connection, requested: Sequence[str]) -> list[str]:
    """The requested packs (default: all) that have a protocol row; refuse named ones without."""
    statement = sa.select(PackInstall.c.PackInstallId, ConnectorProjectionProtocol.c.PackInstallId.label("Native"))
    statement = statement.outerjoin(
        ConnectorProjectionProtocol, ConnectorProjectionProtocol.c.PackInstallId == PackInstall.c.PackInstallId
    )
    if requested:
        statement = statement.where(PackInstall.c.PackInstallId.in_(list(requested)))
    rows = connection.execute(statement).all()
    if requested:
        known = {row.PackInstallId for row in rows}
        for pack_install_id in requested:
            if pack_install_id not in known:
                raise UnknownPack(f"pack_install_id {pack_install_id!r} is not installed", field="pack_install_ids")
        for row in rows:
            if row.Native is None:
                raise ProtocolMissing(
                    f"pack {row.PackInstallId} has no projection protocol row; native workers cannot claim its work",
                    field="pack_install_ids",
                )
    return sorted(row.PackInstallId for row in rows if row.Native is not None)


def _claim_one(
    connection: Connection,
    *,
    candidate: DbRow,
    worker_id: str,
    now: dt.datetime,
    lease: dt.timedelta,
) -> Claim | str | None:
    """Compare-and-set one candidate.

    Returns the claim, ``RETIRED`` when the candidate's expired lease was its last attempt
    (it is now failed and its successor unblocked), or None when another worker was first.
    """
    if candidate.InputStartOrdinal is None:
        raise MembershipMissing(f"work {candidate.WorkId} has no InputStartOrdinal: it is not native range work")
    expect = {"Status": candidate.Status, "LeaseToken": candidate.LeaseToken, "ClaimableAt": candidate.ClaimableAt}
    row = queries.work_item_get(connection, candidate.WorkId)
    if row is None:
        return None
    attempt = row.Attempt
    if candidate.Status == WorkStatus.PROCESSING:
        attempt += 1  # the expired lease counts as a failed attempt
        if attempt >= row.MaxAttempts:
            changed = queries.work_item_update_if(
                connection,
                row.WorkId,
                expect,
                {
                    "Status": WorkStatus.FAILED,
                    "Attempt": attempt,
                    "ClaimableAt": None,
                    "FinishedAt": now,
                    "LastError": "lease expired on the last attempt",
                },
            )
            if changed != 1:
                return None
            _finish(connection, row, EventStatus.FAILED, now)
            return RETIRED
    token, values = lease_values(worker_id, attempt, now, lease)
    if queries.work_item_update_if(connection, row.WorkId, expect, values) != 1:
        return None
    if packs.protocol_get(connection, row.PackInstallId) is None:
        raise MembershipMissing(f"pack {row.PackInstallId} of work {row.WorkId} has no protocol row")
    claimed = queries.work_item_get(connection, row.WorkId)
    assert claimed is not None
    if (
        queries.event_set_status(
            connection, row.PackInstallId, claimed.LaneOrdinal, EventStatus.PROCESSING, row.ProjectionKey
        )
        != 1
    ):
        raise MembershipMissing(f"work {row.WorkId}: its selected Event (ordinal {claimed.LaneOrdinal}) is missing")
    return Claim(work=WorkItemRow.from_row(claimed), lease_token=token)


def lease_values(worker_id: str, attempt: int, now: dt.datetime, lease: dt.timedelta) -> tuple[str, dict[str, Any]]:
    """A fresh lease token and the WorkItem values that grant it to ``worker_id`` until ``now + lease``."""
    token = str(uuid.uuid4())
    expires = now + lease
    values = {
        "Status": WorkStatus.PROCESSING,
        "Attempt": attempt,
        "LeaseOwner": worker_id,
        "LeaseToken": token,
        "LeaseExpiresAt": expires,
        "ClaimableAt": expires,  # a lease that is not renewed makes the work claimable again
    }
    return token, values


def _finish(connection: Connection, row: DbRow, event_status: EventStatus, now: dt.datetime) -> None:
    """After a generation became terminal: settle its selected Event, unblock its successor."""
    queries.event_set_status(connection, row.PackInstallId, row.LaneOrdinal, event_status, row.ProjectionKey)
    successor = queries.work_item_successor(connection, row.PackInstallId, row.ProjectionKey, row.LaneOrdinal)
    if successor is not None:
        queries.work_item_unblock(connection, successor.WorkId, now)


def current_lease(connection: Connection, work_id: str, lease_token: str, now: dt.datetime) -> DbRow:
    """The WorkItem if ``lease_token`` is its current, unexpired lease; else why not."""
    if not work_id:
        raise InvalidArgument("work_id is required", field="work_id")
    if not lease_token:
        raise InvalidArgument("lease_token is required", field="lease_token")
    row = queries.work_item_get(connection, work_id)
    if row is None:
        raise WorkNotFound(f"work {work_id} does not exist", field="work_id")
    if row.Status != WorkStatus.PROCESSING:
        raise LeaseLost(f"lease of work {work_id} is no longer held: the work is {row.Status}", field="lease_token")
    if row.LeaseToken != lease_token:
        raise LeaseLost(
            f"lease token is stale: work {work_id} was claimed again (attempt {row.Attempt + 1})", field="lease_token"
        )
    if row.LeaseExpiresAt <= now:
        raise LeaseLost(f"lease of work {work_id} expired at {row.LeaseExpiresAt.isoformat()}Z", field="lease_token")
    return row


def _held(connection: Connection, work_id: str, lease_token: str, now: dt.datetime) -> tuple[DbRow, dict[str, Any]]:
    row = current_lease(connection, work_id, lease_token, now)
    return row, {"Status": WorkStatus.PROCESSING, "LeaseToken": lease_token, "LeaseExpiresAt": row.LeaseExpiresAt}


def _lost(work_id: str) -> LeaseLost:
    return LeaseLost(f"lease of work {work_id} changed concurrently; nothing was changed", field="lease_token")


def heartbeat(
    engine: Engine, settings: Settings, clock: Clock, work_id: str, lease_token: str, lease_seconds: int = 0
) -> dt.datetime:
    """Extend a held lease; return its new expiry."""
    lease = dt.timedelta(seconds=check_lease_seconds(settings, lease_seconds))

    def extend(connection: Connection) -> dt.datetime:
        now = clock()
        _, expect = _held(connection, work_id, lease_token, now)
        expires = now + lease
        if (
            queries.work_item_update_if(
                connection, work_id, expect, {"LeaseExpiresAt": expires, "ClaimableAt": expires}
            )
            != 1
        ):
            raise _lost(work_id)
        return expires

    return run_transaction(engine, extend, name="heartbeat")


def complete(engine: Engine, clock: Clock, work_id: str, lease_token: str) -> WorkItemRow:
    """Finish a held generation; its successor becomes claimable in the same transaction."""

    def finish(connection: Connection) -> WorkItemRow:
        now = clock()
        row, expect = _held(connection, work_id, lease_token, now)
        values = {"Status": WorkStatus.COMPLETED, "ClaimableAt": None, "FinishedAt": now}
        if queries.work_item_update_if(connection, work_id, expect, values) != 1:
            raise _lost(work_id)
        _finish(connection, row, EventStatus.PROCESSED, now)
        return _reread(connection, work_id)

    return run_transaction(engine, finish, name="complete")


def fail(
    engine: Engine,
    settings: Settings,
    clock: Clock,
    work_id: str,
    lease_token: str,
    error: str,
    *,
    retryable: bool = True,
) -> WorkItemRow:
    """Record a failed attempt: retry after backoff (both bounds kept), or failed for good."""

    def record(connection: Connection) -> WorkItemRow:
        now = clock()
        row, expect = _held(connection, work_id, lease_token, now)
        attempt = row.Attempt + 1
        common = {"Attempt": attempt, "LastError": error[:4000], "LeaseToken": None, "LeaseExpiresAt": None}
        if retryable and attempt < row.MaxAttempts:
            values = {
                **common,
                "Status": WorkStatus.RETRY,
                "ClaimableAt": now + dt.timedelta(seconds=settings.backoff_seconds(attempt)),
            }
        else:
            values = {**common, "Status": WorkStatus.FAILED, "ClaimableAt": None, "FinishedAt": now}
        if queries.work_item_update_if(connection, work_id, expect, values) != 1:
            raise _lost(work_id)
        if values["Status"] == WorkStatus.FAILED:
            _finish(connection, row, EventStatus.FAILED, now)
        return _reread(connection, work_id)

    return run_transaction(engine, record, name="fail")


def _reread(connection: Connection, work_id: str) -> WorkItemRow:
    row = queries.work_item_get(connection, work_id)
    assert row is not None  # updated in this transaction
    return WorkItemRow.from_row(row)
