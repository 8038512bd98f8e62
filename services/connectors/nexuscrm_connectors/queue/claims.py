"""Claims and the end of an attempt: claim, heartbeat, complete and fail a leased generation.

A claim is one transaction of a constant number of statements, a conditional UPDATE instead
of SKIP LOCKED (TiDB takes no lock with it); every instant is the database's (decision 118),
every later call presents the claim's lease token, and a generation that becomes terminal
unblocks its successor in the same transaction (decisions 090, 110, 131 and 149). An attempt
that does not complete its generation is recorded in WorkAttempt by the transaction that ends
it: Fail, or the claim that takes its expired lease over, retires it or finds it damaged
(decision 175).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import logging
import secrets
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from sqlalchemy.engine import Connection, Engine

from nexuscrm_connectors.context import Context
from nexuscrm_connectors.errors import (
    ConnectorsError,
    LeaseLost,
    LimitExceeded,
    MembershipMissing,
    ProtocolMissing,
    UnknownPack,
    WorkNotFound,
)
from nexuscrm_connectors.queries import claims as claims_sql
from nexuscrm_connectors.queries import events as events_sql
from nexuscrm_connectors.queries import work_attempts as work_attempts_sql
from nexuscrm_connectors.queries import work_items as work_items_sql
from nexuscrm_connectors.queries.claims import ClaimCandidate, LeasedWork
from nexuscrm_connectors.queries.work_attempts import EndedAttempt
from nexuscrm_connectors.queries.work_items import HeldWork, Positioned, WorkRow
from nexuscrm_connectors.queue import retries
from nexuscrm_connectors.reservations import Reservations
from nexuscrm_connectors.settings import Settings
from nexuscrm_runtime.clock import DatabaseClock, iso_utc
from nexuscrm_runtime.database import follow_up, is_sqlite, run_transaction
from nexuscrm_schema.member_counts import admitted_count
from workqueue import EventStatus, WorkStatus
from workqueue.errors import InvalidArgument
from workqueue.identity import FIELD_MAX_LENGTHS, validate_text
from workqueue.limits import TRACEBACK_MAX_BYTES
from workqueue.statuses import AttemptOutcome
from workqueue.values import Claim, Completion, CompletionResult, InputPage, WorkItemRow

log = logging.getLogger(__name__)

WORKER_ID_MAX_LENGTH = 128
CLAIM_PASSES = 3  # candidate reads per claim transaction, and transactions per claim attempt
# How far the database clock may have moved backwards (a Galera node or TiDB SQL node with a
# clock behind another's) when a refusal judges a lease token's issue time against the work's
# creation and now (a message only: never a fence).
LEASE_CLOCK_SLACK = dt.timedelta(seconds=60)
MAX_RETRY_AFTER = dt.timedelta(days=1)  # the longest a Flow may ask its generation to wait (RetryLater)
ERROR_MAX_CHARS = 4000  # of a Flow's message kept in LastError and its attempt's history


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
    lost: int = 0  # chosen generations that another claim leased first
    failed_damaged: int = 0  # leased generations found damaged (``_damage``): failed for good
    completed: list[CompletionResult] = dataclasses.field(default_factory=list)  # the request's completions
    leased: list[LeasedWork] = dataclasses.field(default_factory=list)  # the claims' WorkItem rows, oldest first

    def add(self, other: ClaimBatch) -> None:
        """Count ``other`` (a later transaction of the same claim) into this batch."""
        self.claims += other.claims
        self.leased += other.leased
        self.reclaimed += other.reclaimed
        self.expired_failed += other.expired_failed
        self.lost += other.lost
        self.failed_damaged += other.failed_damaged


# Reads the whole membership of the generations a claim leased, by WorkId
# (``payloads.whole_pages``): the claim's inline inputs.
InputReader = Callable[[Connection, Sequence[LeasedWork]], dict[str, InputPage]]
# Completes the generations a claim request finished, in a transaction before the claim's
# (``complete_all``): one result per completion.
Completer = Callable[[Connection], list[CompletionResult]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Request:
    """A validated claim request."""

    worker_id: str
    pack_install_ids: tuple[str, ...]
    work_types: tuple[str, ...]
    flow_versions: tuple[str, ...]
    max_items: int
    lease: dt.timedelta
    read_inputs: InputReader | None
    inputs_in_claim: bool  # read ``read_inputs`` in the claim's transaction, not after it (SQLite)


def claim(
    context: Context,
    *,
    worker_id: str,
    pack_install_ids: Sequence[str] = (),
    work_types: Sequence[str] = (),
    flow_versions: Sequence[str] = (),
    max_items: int = 1,
    lease_seconds: int = 0,
    wait: dt.timedelta = dt.timedelta(0),
    read_inputs: InputReader | None = None,
    complete_first: Completer | None = None,
) -> ClaimBatch:
    """Lease up to ``max_items`` claimable native generations to ``worker_id``.

    Claimable: pending; retry whose time has come; processing whose lease expired (a failed
    attempt: it fails for good when attempts run out). ``flow_versions``: claim those Flow
    versions' generations (a build's yield to live work and to its rate bound); none: the
    generations of the inputs' own keys only. Only packs with a protocol row are
    served; naming a pack without one raises ``ProtocolMissing``. A generation whose selected
    Event is missing, or whose members differ from the count its admission recorded (a
    DATA_LOSS naming the WorkId and both counts), is damaged: it is failed for good with that
    reason (logged, counted), in
    the claim's transaction, and the others are claimed; a damaged generation never blocks
    the pack's newer work.

    When nothing is claimable, the claim waits up to ``wait`` (at most
    ``settings.max_claim_wait_ms``) and returns as soon as it claimed something: woken by
    ``reservations.notify`` for work of this process, else polling every
    ``settings.claim_poll_ms``. It returns at once when ``settings.max_claim_waiters`` other
    claims are waiting already.

    ``read_inputs``: called with the leased generations; the pages it returns go with their
    claims (``Claim.inputs``), in a constant number of statements. On a database server it is
    called once the claim committed, on a connection of its own: the generations' bounds froze
    when they were leased (a claimed generation is never extended: invariant B), so it reads
    what the claim's transaction would have without the leased rows' locks held meanwhile; if
    it fails, the claims go without inputs and the worker streams them with LoadInputs. On
    SQLite it is called in the claim's transaction, which saves that process a transaction
    (decision 142).
    ``complete_first``: run in a transaction of its own once the request is valid, before the
    claim's; its results are ``ClaimBatch.completed`` (decision 131 says why not in the claim's).
    """
    engine, settings, clock, reservations = context.engine, context.settings, context.clock, context.reservations
    validate_text("worker_id", worker_id, WORKER_ID_MAX_LENGTH)
    if not 1 <= max_items <= settings.max_claim_items:
        raise InvalidArgument(
            f"max_items must be between 1 and {settings.max_claim_items}, got {max_items}", field="max_items"
        )
    if not dt.timedelta(0) <= wait <= dt.timedelta(milliseconds=settings.max_claim_wait_ms):
        raise InvalidArgument(
            f"wait_ms must be between 0 and {settings.max_claim_wait_ms}, got {wait // dt.timedelta(milliseconds=1)}",
            field="wait_ms",
        )
    for work_type in work_types:
        validate_text("work_types", work_type, FIELD_MAX_LENGTHS["work_type"])
    for version in flow_versions:
        validate_text("flow_versions", version, FIELD_MAX_LENGTHS["companion_version"])
    request = _Request(
        worker_id=worker_id,
        pack_install_ids=tuple(pack_install_ids),
        work_types=tuple(work_types),
        flow_versions=tuple(flow_versions),
        max_items=max_items,
        lease=dt.timedelta(seconds=check_lease_seconds(settings, lease_seconds)),
        read_inputs=read_inputs,
        inputs_in_claim=is_sqlite(engine),
    )
    deadline = time.monotonic() + wait.total_seconds()
    poll = settings.claim_poll_ms / 1000
    completed = run_transaction(engine, complete_first, name="complete") if complete_first else []
    batch = ClaimBatch(completed=completed)
    if any(result.work for result in batch.completed):
        follow_up("complete", reservations.notify)  # their successors may have become claimable
    while True:
        seen = reservations.version()
        attempt = ClaimBatch()
        for _ in range(CLAIM_PASSES):  # again when others leased all it chose first, or all it leased was damaged
            with reservations.reserving() as take:  # held until the transaction has ended
                transaction = run_transaction(
                    engine,
                    functools.partial(
                        claim_transaction, request=request, clock=clock, reservations=reservations, take=take
                    ),
                    name="claim",
                )
            attempt.add(transaction)
            if transaction.claims or not (transaction.lost or transaction.failed_damaged):
                break
        batch.add(attempt)
        remaining = deadline - time.monotonic()
        if batch.claims or remaining <= 0:
            return _with_inputs(engine, request, batch)
        # Work that other claims took first: look again at once; none at all: wait for some.
        # Damaged work failed: the window moved past it, look again at once too.
        if not (attempt.lost or attempt.failed_damaged) and not reservations.wait(seen, min(poll, remaining)):
            return batch


def claim_transaction(
    connection: Connection,
    *,
    request: _Request,
    clock: DatabaseClock,
    reservations: Reservations,
    take: Callable[[Sequence[str], int], list[str]],
) -> ClaimBatch:
    """Read candidates, retire exhausted ones, lease the oldest that no other claim holds, move their selected Events.

    The constant few statements: the served packs, a window of the oldest candidates, one
    conditional UPDATE leasing the chosen ones (it re-checks claimability per row; the lease
    token marks the rows it won), one recording first claims' member counts, a re-read of the
    leased rows with their selected Events, one moving those Events to processing. The row
    lock freezes a generation's bounds: admission only extends unclaimed attempt-zero rows.
    A leased generation found damaged (``_damage``) is failed for good in this transaction
    (``_fail_damaged``); that path, and recording the attempts of expired leases it took over
    (one statement), are the only ones beyond the constant few.
    """
    batch = ClaimBatch()
    served, operated = _native_packs(connection, request.pack_install_ids, clock)
    window = request.max_items + reservations.held()
    live, now = _live_candidates(connection, request, served, operated, clock, window, batch)
    candidates = {c.WorkId: c for c in live}
    open_ids = list(candidates)
    chosen = [candidates[work_id] for work_id in take(open_ids, request.max_items)]
    if not chosen or now is None:
        batch.lost = len(open_ids)  # claims that started after the read took them: read again
        return batch
    token = new_lease_token(now)  # one fresh token per claim: fencing checks it together with the WorkId
    # ClaimedAt in the lease UPDATE itself: the attempt's start in its history (decision 175).
    grant = {**lease_grant(request.worker_id, token, now + request.lease), "ClaimedAt": now}
    work_ids = [candidate.WorkId for candidate in chosen]
    if claims_sql.work_items_claim(connection, work_ids, now, grant) == 0:
        batch.lost = len(chosen)
        return batch
    claims_sql.work_items_record_member_count(connection, work_ids, token)
    leased = {row.WorkId: row for row in claims_sql.work_items_leased(connection, work_ids, token)}
    batch.lost = len(chosen) - len(leased)
    work_attempts_sql.work_attempts_record(
        connection,
        [_expired(candidates[work_id]) for work_id in leased if candidates[work_id].Status == WorkStatus.PROCESSING],
    )
    missing = {work_id: reason for work_id, row in leased.items() if (reason := _damage(row)) is not None}
    if missing:
        for work_id, reason in missing.items():
            batch.failed_damaged += _fail_damaged(connection, leased.pop(work_id), token, reason, now)
        if not leased:
            return batch
    selected = _selected(leased.values())
    if events_sql.selected_events_set_status(connection, selected, EventStatus.PROCESSING) != len(selected):
        raise MembershipMissing(f"a selected Event of {sorted(leased)} disappeared during the claim")
    batch.leased = [leased[candidate.WorkId] for candidate in chosen if candidate.WorkId in leased]  # oldest first
    inputs = request.read_inputs(connection, batch.leased) if request.read_inputs and request.inputs_in_claim else {}
    for candidate in chosen:
        if candidate.WorkId in leased:
            work = work_items_sql.work_item_value(leased[candidate.WorkId])
            batch.claims.append(Claim(work=work, lease_token=token, inputs=inputs.get(candidate.WorkId)))
            # The UPDATE re-checked claimability: a candidate read as processing had expired.
            batch.reclaimed += candidate.Status == WorkStatus.PROCESSING
    return batch


def _with_inputs(engine: Engine, request: _Request, batch: ClaimBatch) -> ClaimBatch:
    """``batch`` with the inline inputs ``request.read_inputs`` reads after its claims committed (none if it fails)."""
    if request.read_inputs is None or request.inputs_in_claim or not batch.leased:
        return batch
    read_inputs = request.read_inputs
    inputs: dict[str, InputPage] = {}

    def read() -> None:
        with engine.connect() as connection:
            inputs.update(read_inputs(connection, batch.leased))

    follow_up("claim inputs", read)  # the leases are committed: never lose them to a failed read
    batch.claims = [dataclasses.replace(claim, inputs=inputs.get(claim.work.work_id)) for claim in batch.claims]
    return batch


def _damage(row: LeasedWork) -> str | None:
    """Why a generation this claim leased cannot be executed, or None when it can.

    ``ClaimedMemberCount`` is the count the first claim recorded (this claim's statement
    before, for a first claim); it must equal the count admission recorded when that is known
    (decision 149): a member lost before the first claim is damage the claim sees.
    """
    if row.SelectedOrdinal is None:
        return f"its selected Event (ordinal {row.LaneOrdinal}) is missing"
    admitted = admitted_count(row)
    if admitted is not None and row.ClaimedMemberCount != admitted:
        lost = MembershipMissing.admitted_count_differs(
            row.WorkId, row.InputStartOrdinal, row.LaneOrdinal, row.ClaimedMemberCount, admitted
        )
        return f"{lost.kind.value}: {lost}"
    return None


def _live_candidates(
    connection: Connection,
    request: _Request,
    served: Sequence[str],
    operated: Collection[str],
    clock: DatabaseClock,
    window: int,
    batch: ClaimBatch,
) -> tuple[list[ClaimCandidate], dt.datetime | None]:
    """The window's candidates that may be claimed, after failing those whose expired lease was the last attempt.

    Also the database's time the candidates were read at (None when there were none): the
    instant the claim transaction decides and stores with. Failing exhausted work unblocks
    successors that the candidate read could not see: read again then, a bounded number of
    times. Old-protocol work (no InputStartOrdinal) is refused.
    """
    now: dt.datetime | None = None
    for _ in range(CLAIM_PASSES):
        candidates = claims_sql.work_items_claimable(
            connection, served, request.work_types, clock, window, operated, request.flow_versions
        )
        now = candidates[0].Now if candidates else now
        exhausted = {c.WorkId for c in candidates if _last_attempt_expired(c)}
        for candidate in candidates:
            if candidate.WorkId in exhausted:
                batch.expired_failed += _retire(connection, candidate, candidate.Now)
        if not exhausted:
            break
    live = []
    for candidate in candidates:
        if candidate.InputStartOrdinal is None:
            log.error("not claiming %s: it has no InputStartOrdinal: it is not native range work", candidate.WorkId)
        elif candidate.WorkId not in exhausted:
            live.append(candidate)
    return live, now


def _last_attempt_expired(candidate: ClaimCandidate) -> bool:
    return bool(candidate.Status == WorkStatus.PROCESSING and candidate.Attempt + 1 >= candidate.MaxAttempts)


def _retire(connection: Connection, candidate: ClaimCandidate, now: dt.datetime) -> bool:
    """Fail a generation whose expired lease was its last attempt; False if another claim was first."""
    expect = {"Status": candidate.Status, "LeaseToken": candidate.LeaseToken, "ClaimableAt": candidate.ClaimableAt}
    values = {
        "Status": WorkStatus.FAILED,
        "Attempt": candidate.Attempt + 1,
        "ClaimableAt": None,
        "FinishedAt": now,
        "LastError": "lease expired on the last attempt",
    }
    if claims_sql.work_item_update_if(connection, candidate.WorkId, expect, values) != 1:
        return False
    work_attempts_sql.work_attempts_record(connection, [_expired(candidate)])
    finish(connection, [candidate], EventStatus.FAILED, now)
    return True


def _expired(candidate: ClaimCandidate) -> EndedAttempt:
    """The history of an attempt whose lease expired (``candidate`` as the claim read it): it ended at the expiry."""
    expiry = candidate.ClaimableAt  # a lease's expiry is its generation's ClaimableAt (``lease_grant``, heartbeat)
    return EndedAttempt(
        work_id=candidate.WorkId,
        pack_install_id=candidate.PackInstallId,
        worker_id=candidate.LeaseOwner or "",
        started_at=candidate.ClaimedAt,
        finished_at=expiry,
        outcome=AttemptOutcome.EXPIRED,
        error=f"lease expired at {iso_utc(expiry)}: the worker neither completed nor failed the attempt",
    )


def _fail_damaged(connection: Connection, row: LeasedWork, token: str, reason: str, now: dt.datetime) -> bool:
    """Fail a damaged generation this claim leased (``_damage`` says why); unblock its successor.

    Claiming it again can never succeed (its membership cannot be recovered), and leaving it
    claimable would hold the candidate window for ever: failed is terminal, the reason is in
    LastError, the damage stays visible to the invariant checker (decision 110).
    """
    log.error("failing %s: %s", row.WorkId, reason)
    error = f"damaged: {reason}"
    expect = {"Status": WorkStatus.PROCESSING, "LeaseToken": token}
    values = {
        "Status": WorkStatus.FAILED,
        "LeaseToken": None,
        "LeaseExpiresAt": None,
        "ClaimableAt": None,
        "FinishedAt": now,
        "LastError": error,
    }
    if claims_sql.work_item_update_if(connection, row.WorkId, expect, values) != 1:
        return False
    ended = EndedAttempt(
        work_id=row.WorkId,
        pack_install_id=row.PackInstallId,
        worker_id=row.LeaseOwner or "",
        started_at=now,
        finished_at=now,
        outcome=AttemptOutcome.FAILED,
        error=error,
    )
    work_attempts_sql.work_attempts_record(connection, [ended])
    finish(connection, [row], EventStatus.FAILED, now)
    return True


def _native_packs(connection: Connection, requested: Sequence[str], clock: DatabaseClock) -> tuple[list[str], set[str]]:
    """The requested packs (default: all) that have a protocol row, and those an operator's decision may apply to.

    This is claim's protocol check: candidates are read from these packs only, and a
    protocol row is never deleted. Named packs without one are refused.
    """
    rows = claims_sql.packs_with_protocol(connection, requested, clock)
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
    native = [row for row in rows if row.Native is not None]
    return sorted(row.PackInstallId for row in native), {row.PackInstallId for row in native if row.Operated}


def new_lease_token(now: dt.datetime) -> str:
    """A fresh lease token: a UUIDv7 (RFC 9562) whose first 48 bits are ``now`` (naive UTC) in ms.

    Only equality fences a lease; the issue time lets a refusal say whether a token that is not
    the current one can have been an earlier lease of the work (``current_lease``).
    """
    millis = int(now.replace(tzinfo=dt.UTC).timestamp() * 1000) & ((1 << 48) - 1)
    random = int.from_bytes(secrets.token_bytes(10))
    value = (millis << 80) | (0x7 << 76) | ((random >> 62) & 0xFFF) << 64 | (0b10 << 62) | (random & ((1 << 62) - 1))
    return str(uuid.UUID(int=value))


def lease_token_issued_at(token: str) -> dt.datetime | None:
    """When this service issued ``token`` (naive UTC), or None if it is no token this service issues."""
    try:
        parsed = uuid.UUID(token)
    except ValueError:
        return None
    if parsed.version != 7 or str(parsed) != token:
        return None
    return dt.datetime.fromtimestamp((parsed.int >> 80) / 1000, dt.UTC).replace(tzinfo=None)


def _not_current(row: WorkRow, work_id: str, lease_token: str, now: dt.datetime) -> LeaseLost:
    """Why ``lease_token`` is not the lease of processing ``row``: never issued for it, or superseded."""
    issued = lease_token_issued_at(lease_token)
    if row.Attempt == 0 or (
        issued is not None and not row.CreatedAt - LEASE_CLOCK_SLACK <= issued <= now + LEASE_CLOCK_SLACK
    ):
        # Attempt 0: the current lease is the only one the work has had.
        return LeaseLost(f"lease token {lease_token!r} was not issued for work {work_id}", field="lease_token")
    if issued is None:  # not a token of ours, or one issued before tokens carried their time
        return LeaseLost(
            f"lease token {lease_token!r} is stale or was not issued for work {work_id}: "
            f"the work was claimed again (attempt {row.Attempt + 1})",
            field="lease_token",
        )
    return LeaseLost(
        f"lease token is stale: work {work_id} was claimed again by another worker (attempt {row.Attempt + 1}) "
        f"after this token was issued at {iso_utc(issued)}",
        field="lease_token",
    )


def lease_grant(worker_id: str, token: str, expires: dt.datetime) -> dict[str, Any]:
    """The WorkItem values that lease a generation to ``worker_id`` with ``token`` until ``expires``."""
    return {
        "Status": WorkStatus.PROCESSING,
        "LeaseOwner": worker_id,
        "LeaseToken": token,
        "LeaseExpiresAt": expires,
        "ClaimableAt": expires,  # a lease that is not renewed makes the work claimable again
    }


def lease_values(worker_id: str, attempt: int, now: dt.datetime, lease: dt.timedelta) -> tuple[str, dict[str, Any]]:
    """A fresh lease token and the WorkItem values that grant it to ``worker_id`` until ``now + lease``."""
    token = new_lease_token(now)
    return token, {"Attempt": attempt, **lease_grant(worker_id, token, now + lease)}


def finish(connection: Connection, rows: Sequence[Positioned], event_status: EventStatus, now: dt.datetime) -> None:
    """After generations became terminal: settle their selected Events, unblock their successors; set-wise.

    At most three statements whatever ``len(rows)``. The successor is the one linked on the row
    (``SuccessorWorkId``, written by the admission or replay that created it blocked: decision
    106), else found by its ordinals, all such rows in one statement (rows linked by no
    admission: those of schema v2, and generations with no successor yet; decision 131 says
    why those still look). A replay run first (decision 174) has no successor: the generation
    above it waits for the one it holds, which the claim releases once the replay is finished.
    """
    if not rows:
        return
    events_sql.selected_events_set_status(connection, _selected(rows), event_status)
    successors = [row.SuccessorWorkId for row in rows if row.SuccessorWorkId is not None]
    successors += work_items_sql.work_items_successors(
        connection, [row for row in rows if row.SuccessorWorkId is None and row.RunsBeforeWorkId is None]
    ).values()
    work_items_sql.work_items_unblock(connection, successors, now)


def _selected(rows: Iterable[Positioned]) -> list[tuple[str, int, str]]:
    """The selected Events whose status the runs of ``rows`` move: a build's run moves none (decision 185)."""
    return [(row.PackInstallId, row.LaneOrdinal, row.member_key) for row in rows if not row.BuildRun]


def current_lease(connection: Connection, work_id: str, lease_token: str, clock: DatabaseClock) -> HeldWork:
    """The WorkItem if ``lease_token`` is its current lease, unexpired on the database clock; else why not.

    The row carries the database's time it was read at (``Now``): the caller's instant.
    """
    require_lease_fields(work_id, lease_token)
    return check_lease(work_items_sql.work_item_held(connection, work_id, clock), work_id, lease_token)


def require_lease_fields(work_id: str, lease_token: str) -> None:
    """Refuse (INVALID_ARGUMENT) a call on a held generation that omits its WorkId or lease token."""
    if not work_id:
        raise InvalidArgument("work_id is required", field="work_id")
    if not lease_token:
        raise InvalidArgument("lease_token is required", field="lease_token")


def check_lease(row: HeldWork | None, work_id: str, lease_token: str) -> HeldWork:
    """``row`` (read with the database's ``Now``) if it is processing under ``lease_token``, unexpired; else refuse.

    ``WorkNotFound`` for no row; else ``LeaseLost`` saying why: never claimed, no longer
    processing (a completed generation answers so), another lease, or expired.
    """
    if row is None:
        raise WorkNotFound(f"work {work_id} does not exist", field="work_id")
    if row.Status == WorkStatus.PENDING and row.Attempt == 0:
        raise LeaseLost(
            f"lease token {lease_token!r} was not issued for work {work_id}: the work has never been claimed",
            field="lease_token",
        )
    if row.Status != WorkStatus.PROCESSING:
        raise LeaseLost(f"lease of work {work_id} is no longer held: the work is {row.Status}", field="lease_token")
    if row.LeaseToken != lease_token:
        raise _not_current(row, work_id, lease_token, row.Now)
    expires = row.LeaseExpiresAt
    if expires is None:  # a claim sets it with the status: never reached
        raise RuntimeError(f"work {work_id} is processing without a lease expiry")
    if expires <= row.Now:
        raise LeaseLost(f"lease of work {work_id} expired at {iso_utc(expires)}", field="lease_token")
    return row


def _held(
    connection: Connection, work_id: str, lease_token: str, clock: DatabaseClock
) -> tuple[HeldWork, dict[str, Any]]:
    row = current_lease(connection, work_id, lease_token, clock)
    return row, {"Status": WorkStatus.PROCESSING, "LeaseToken": lease_token, "LeaseExpiresAt": row.LeaseExpiresAt}


def lost(work_id: str) -> LeaseLost:
    """The refusal of a compare-and-set that found a lease changed since it was read (the transaction rolls back)."""
    return LeaseLost(f"lease of work {work_id} changed concurrently; nothing was changed", field="lease_token")


def heartbeat(context: Context, work_id: str, lease_token: str, lease_seconds: int = 0) -> dt.datetime:
    """Extend a held lease to the database's now plus the lease; return its new expiry."""
    engine, settings, clock = context.engine, context.settings, context.clock
    lease = dt.timedelta(seconds=check_lease_seconds(settings, lease_seconds))

    def extend(connection: Connection) -> dt.datetime:
        row, expect = _held(connection, work_id, lease_token, clock)
        expires: dt.datetime = row.Now + lease
        if (
            claims_sql.work_item_update_if(
                connection, work_id, expect, {"LeaseExpiresAt": expires, "ClaimableAt": expires}
            )
            != 1
        ):
            raise lost(work_id)
        return expires

    return run_transaction(engine, extend, name="heartbeat")


COMPLETIONS_FIELD = "completions"


def validate_completions(completions: Sequence[Completion], limit: int) -> None:
    """Refuse a request's completions before anything runs: too many, a field missing, a WorkId named twice."""
    if len(completions) > limit:
        raise LimitExceeded(
            f"completions has {len(completions)} generations; the limit is {limit}", field=COMPLETIONS_FIELD
        )
    seen: set[str] = set()
    for n, completion in enumerate(completions):
        if not completion.work_id:
            raise InvalidArgument(f"completions[{n}].work_id is required", field=f"{COMPLETIONS_FIELD}.work_id")
        if not completion.lease_token:
            raise InvalidArgument(f"completions[{n}].lease_token is required", field=f"{COMPLETIONS_FIELD}.lease_token")
        if completion.work_id in seen:
            raise InvalidArgument(
                f"completions names work {completion.work_id} twice (completions[{n}])",
                field=f"{COMPLETIONS_FIELD}.work_id",
            )
        seen.add(completion.work_id)


def complete_all(
    connection: Connection, clock: DatabaseClock, completions: Sequence[Completion]
) -> list[CompletionResult]:
    """Complete every held generation of ``completions`` (validated) in the caller's transaction; one result each.

    The results are in the order of ``completions``.

    A refused completion (unknown WorkId, lease lost or expired, already completed) changes
    nothing and does not stop the others. Raises ``LeaseLost`` for them all (the transaction
    then changes nothing) only if a lease changed between the locked read and the UPDATE,
    which the lock rules out on one server.
    """
    if not completions:
        return []
    rows = claims_sql.work_items_lock(connection, [c.work_id for c in completions], clock)
    held, refused = [], {}
    for completion in completions:
        try:
            held.append(check_lease(rows.get(completion.work_id), completion.work_id, completion.lease_token))
        except ConnectorsError as error:
            refused[completion.work_id] = error
    done: dict[str, WorkItemRow] = {}
    if held:
        now = held[0].Now
        if claims_sql.work_items_complete(connection, held, now) != len(held):
            raise lost(", ".join(row.WorkId for row in held))
        finish(connection, held, EventStatus.PROCESSED, now)
        values = {"Status": WorkStatus.COMPLETED, "ClaimableAt": None, "FinishedAt": now}
        done = {row.WorkId: written(row, values) for row in held}
    return [
        CompletionResult(work_id=c.work_id, work=done.get(c.work_id), error=refused.get(c.work_id)) for c in completions
    ]


def complete(context: Context, work_id: str, lease_token: str) -> WorkItemRow:
    """Finish one held generation (the Complete RPC); its successor becomes claimable in the same transaction."""
    engine, clock = context.engine, context.clock
    require_lease_fields(work_id, lease_token)
    completion = Completion(work_id=work_id, lease_token=lease_token)
    (result,) = run_transaction(engine, lambda c: complete_all(c, clock, [completion]), name="complete")
    if result.work is None:
        raise result.error or lost(work_id)  # a result has its work or its error
    return result.work


def fail(
    context: Context,
    work_id: str,
    lease_token: str,
    error: str,
    *,
    retryable: bool = True,
    retry_after: dt.timedelta | None = None,
    traceback: str | None = None,
) -> WorkItemRow:
    """Record a failed attempt: retry after backoff (both bounds kept), or failed for good; and its history.

    Attempts and backoff are the work type's retry policy, else Connectors' settings
    (``retries.effective``, decision 175). ``retry_after``: the Flow asked to run later
    (decision 173): retry after that delay, the attempt not counted. ``InvalidArgument`` unless
    it is positive, at most ``MAX_RETRY_AFTER``, and ``retryable``; and for a ``traceback`` over
    ``TRACEBACK_MAX_BYTES``. The attempt (worker, start, end, outcome, message, traceback) is
    recorded in WorkAttempt in the same transaction; neither message nor traceback is logged.
    """
    engine, settings, clock = context.engine, context.settings, context.clock
    if retry_after is not None and not (dt.timedelta(0) < retry_after <= MAX_RETRY_AFTER and retryable):
        raise InvalidArgument(
            f"retry_after must be more than 0 and at most {MAX_RETRY_AFTER} with retryable true, got {retry_after}"
            f" (retryable {retryable})",
            field="retry_after",
        )
    if traceback is not None and (size := len(traceback.encode())) > TRACEBACK_MAX_BYTES:
        raise InvalidArgument(
            f"traceback must be at most {TRACEBACK_MAX_BYTES} bytes of UTF-8, got {size}", field="traceback"
        )
    message = error[:ERROR_MAX_CHARS]

    def record(connection: Connection) -> WorkItemRow:
        row, expect = _held(connection, work_id, lease_token, clock)
        now = row.Now
        policy = retries.effective(connection, settings, row)
        attempt = row.Attempt + (retry_after is None)
        common = {"Attempt": attempt, "LastError": message, "LeaseToken": None, "LeaseExpiresAt": None}
        if retry_after is not None:
            outcome = AttemptOutcome.RETRY_LATER
            values = {**common, "Status": WorkStatus.RETRY, "ClaimableAt": now + retry_after}
        elif retryable and attempt < policy.max_attempts:
            outcome = AttemptOutcome.RETRY
            values = {
                **common,
                "Status": WorkStatus.RETRY,
                "ClaimableAt": now + dt.timedelta(seconds=policy.backoff_seconds(attempt)),
            }
        else:
            outcome = AttemptOutcome.FAILED
            values = {**common, "Status": WorkStatus.FAILED, "ClaimableAt": None, "FinishedAt": now}
        if claims_sql.work_item_update_if(connection, work_id, expect, values) != 1:
            raise lost(work_id)
        ended = EndedAttempt(
            work_id=work_id,
            pack_install_id=row.PackInstallId,
            worker_id=row.LeaseOwner or "",
            started_at=row.ClaimedAt,
            finished_at=now,
            outcome=outcome,
            error=message,
            traceback=traceback or None,
        )
        work_attempts_sql.work_attempts_record(connection, [ended])
        if values["Status"] == WorkStatus.FAILED:
            finish(connection, [row], EventStatus.FAILED, now)
        return dataclasses.replace(written(row, values), max_attempts=policy.max_attempts)  # as GetWork says it

    return run_transaction(engine, record, name="fail")


def written(row: HeldWork, values: dict[str, Any]) -> WorkItemRow:
    """The WorkItem as a compare-and-set left it: the row it read, with the values it wrote (no re-read)."""
    return work_items_sql.work_item_value(dataclasses.replace(row, **values))
