"""Histories of concurrent Connectors clients and a Jepsen-style checker over them.

Every client call is recorded as one ``Op``: who (``process``), what (``f`` and ``value``),
when it was invoked and when it returned (wall clock, naive UTC: the services' clock on this
machine), and how it ended: ``ok``, ``fail`` (the service refused: nothing was done) or
``unknown`` (the connection, the deadline or an injected fault cut the answer off: it may or
may not have been done; Jepsen's ``info``). After the faults heal and the queue drains,
``check_history`` compares the history with the final database, in the spirit of Jepsen's
total-queue checker (nothing acknowledged is lost, nothing unexpected appears) and its lease
checks (no completion from an expired or superseded lease, leases never overlap).

Operations and their values/results:

- ``ingest``: value ``((receipt_key, payload), ...)``; result ``list[IngestResult]``.
- ``claim``: value the worker id; result ``list[Claim]``.
- ``load``: value ``(work_id, lease_token)``; result the loaded ordinals, in order.
- ``complete`` / ``fail``: value ``(work_id, lease_token)``; result ``WorkItemRow``.
- ``cutover``: value the pack; result the Controlplane ``CutoverResult``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import hashlib
import itertools
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import grpc
import sqlalchemy as sa

from nexuscrm_runtime.clock import utcnow
from nexuscrm_runtime.database import DatabaseUnavailable, TransactionConflict
from nexuscrm_schema.relations import EVENT_PAYLOAD, EVENT_WITH_PAYLOAD
from nexuscrm_schema.tables import ConnectorProjectionProtocol, Event, PrunedReceipt, PrunedWork, WorkItem
from nexuscrm_wire.timestamps import naive_utc
from workqueue import WorkStatus
from workqueue.errors import DomainError
from workqueue.values import ACKNOWLEDGED_OUTCOMES, Claim

T = TypeVar("T")

# Refusals that promise nothing was changed. Everything else that is not a reply (UNAVAILABLE,
# DEADLINE_EXCEEDED, CANCELLED, including UNAVAILABLE from an injected ``raise`` fault) may
# have applied.
DEFINITE_FAILURES = frozenset(
    {
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.DATA_LOSS,
    }
)
# What a caller may see when the database fails under it: retryable, never a false success.
RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED})


class OpOutcome(enum.StrEnum):
    """How a recorded call ended."""

    OK = "ok"
    FAIL = "fail"
    UNKNOWN = "unknown"


@dataclasses.dataclass(kw_only=True)
class Op:
    """One call: its invocation and, once returned, its outcome."""

    index: int
    process: str
    f: str
    value: Any
    invoked_at: dt.datetime
    returned_at: dt.datetime | None = None
    outcome: OpOutcome | None = None
    result: Any = None
    status: str = ""  # the status code name of a refusal or cut-off call; "OK" otherwise

    @property
    def ok(self) -> bool:
        """True when the call returned normally."""
        return self.outcome is OpOutcome.OK


def classify_error(error: BaseException) -> tuple[OpOutcome, str]:
    """The outcome and status name of a failed call (gRPC or in-process domain error)."""
    if isinstance(error, grpc.RpcError):
        code = error.code()
        return (OpOutcome.FAIL if code in DEFINITE_FAILURES else OpOutcome.UNKNOWN), code.name
    if isinstance(error, DatabaseUnavailable):
        return OpOutcome.UNKNOWN, "UNAVAILABLE"
    if isinstance(error, TransactionConflict):
        return OpOutcome.FAIL, "ABORTED"
    if isinstance(error, DomainError):
        return OpOutcome.FAIL, error.kind.value
    raise error


class History:
    """A thread-safe, append-only record of every client call."""

    def __init__(self) -> None:
        self._ops: list[Op] = []
        self._lock = threading.Lock()
        self._indexes = itertools.count()

    def call(self, process: str, f: str, value: Any, call: Callable[[], T]) -> Op:
        """Invoke ``call`` and record it; gRPC and domain errors become fail/unknown outcomes."""
        op = Op(index=next(self._indexes), process=process, f=f, value=value, invoked_at=utcnow())
        with self._lock:
            self._ops.append(op)
        try:
            op.result = call()
        except (grpc.RpcError, DomainError) as error:
            op.outcome, op.status = classify_error(error)
        else:
            op.outcome, op.status = OpOutcome.OK, "OK"
        op.returned_at = utcnow()
        return op

    def ops(self, f: str | None = None) -> list[Op]:
        """Every recorded op (of function ``f``), in invocation order."""
        with self._lock:
            return [op for op in self._ops if f is None or op.f == f]

    def figures(self) -> dict[str, Counter[str]]:
        """Per function, how many calls ended with each outcome and status."""
        figures: dict[str, Counter[str]] = defaultdict(Counter)
        for op in self.ops():
            figures[op.f][f"{op.outcome}:{op.status}"] += 1
        return dict(figures)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Lease:
    work_id: str
    token: str
    granted_at: dt.datetime  # the server's claim time: expiry minus the lease duration
    expires_at: dt.datetime
    released_at: dt.datetime | None  # invocation of the first complete/fail with this token


def acknowledged_receipts(history: History) -> set[str]:
    """Receipt keys some ``ok`` ingest acknowledged."""
    return {
        result.receipt_key
        for op in history.ops("ingest")
        if op.ok
        for result in op.result
        if result.outcome in ACKNOWLEDGED_OUTCOMES
    }


def check_history(history: History, engine: sa.Engine, *, lease_seconds: int) -> list[str]:
    """Every violation of the history against the drained database, each named by its check.

    ``lease_seconds`` is the duration every recorded claim asked for.
    """
    with engine.connect() as connection:
        events = connection.execute(
            sa.select(
                Event.c.PackInstallId,
                Event.c.EnqueueOrdinal,
                Event.c.ProjectionKey,
                Event.c.ReceiptKey,
                EVENT_PAYLOAD,
                Event.c.IsReplay,
            ).select_from(EVENT_WITH_PAYLOAD)
        ).all()
        work = connection.execute(sa.select(WorkItem)).all()
        events, work = _with_pruned(connection, events, work)
    problems = _queue_checks(history, events)
    problems += _execution_checks(history, events, work)
    problems += _lease_checks(history, work, dt.timedelta(seconds=lease_seconds))
    problems += _cutover_checks(history, engine)
    return problems


@dataclasses.dataclass(frozen=True)
class _PrunedInput:
    """An input retention pruned, rebuilt from its receipt's tombstone: its payload is known by hash only."""

    PackInstallId: str
    EnqueueOrdinal: int
    ProjectionKey: str
    ReceiptKey: str
    PayloadHash: str
    Payload: None = None
    IsReplay: bool = False


def _with_pruned(connection: sa.Connection, events: Sequence[Any], work: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """Retained Events and WorkItems, plus what retention pruned (decision 125).

    Tombstones stand for the inputs of their pruned generation, PrunedWork records for the
    terminal generations they were (with the lease that finished them).
    """
    pruned_work = connection.execute(sa.select(PrunedWork)).all()
    identity = {w.WorkId: w.ProjectionKey for w in pruned_work}
    tombstones = connection.execute(sa.select(PrunedReceipt)).all()
    inputs = [
        _PrunedInput(t.PackInstallId, t.EnqueueOrdinal, identity[t.WorkId], t.ReceiptKey, t.PayloadHash)
        for t in tombstones
    ]
    return [*events, *inputs], [*work, *pruned_work]


def _queue_checks(history: History, events: Sequence[Any]) -> list[str]:
    """Total-queue: nothing acknowledged lost, nothing unexpected, nothing admitted twice."""
    sent: dict[str, bytes] = {key: payload for op in history.ops("ingest") for key, payload in op.value}
    admitted = Counter(e.ReceiptKey for e in events if not e.IsReplay)
    problems = [
        f"lost: receipt {key} was acknowledged but has no Event"
        for key in acknowledged_receipts(history) - set(admitted)
    ]
    problems += [f"duplicated: receipt {key} has {n} Events" for key, n in admitted.items() if n > 1]
    for e in events:
        if e.IsReplay:
            continue
        if e.ReceiptKey not in sent:
            problems.append(f"unexpected: Event {e.EnqueueOrdinal} has receipt {e.ReceiptKey} that no client sent")
        elif (
            hashlib.sha256(sent[e.ReceiptKey]).hexdigest() != e.PayloadHash
            if e.Payload is None
            else bytes(e.Payload) != sent[e.ReceiptKey]
        ):
            problems.append(f"unexpected: Event {e.EnqueueOrdinal} differs from the payload sent as {e.ReceiptKey}")
    return problems


def _completions(history: History, work: Sequence[Any]) -> dict[tuple[str, str], Op]:
    """Completions the service accepted: ``ok`` ones, and ``unknown`` ones the database confirms."""
    completed_tokens = {(w.WorkId, w.LeaseToken) for w in work if w.Status == WorkStatus.COMPLETED}
    accepted: dict[tuple[str, str], Op] = {}
    for op in history.ops("complete"):
        if op.ok or (op.outcome is OpOutcome.UNKNOWN and tuple(op.value) in completed_tokens):
            accepted.setdefault(tuple(op.value), op)
    return accepted


def _execution_checks(history: History, events: Sequence[Any], work: Sequence[Any]) -> list[str]:
    """Every input executed by exactly one accepted completion, which loaded exactly its members."""
    problems = []
    loads: dict[tuple[str, str], list[int]] = {}
    for op in history.ops("load"):
        if op.ok:
            loads.setdefault(tuple(op.value), op.result)
    ok_completes = Counter(op.value[0] for op in history.ops("complete") if op.ok)
    problems += [f"completed twice: work {w} got {n} accepted completions" for w, n in ok_completes.items() if n > 1]
    executed: dict[tuple[str, int], list[str]] = defaultdict(list)
    rows = {w.WorkId: w for w in work}
    completions = _completions(history, work)
    for (work_id, token), op in completions.items():
        row = rows.get(work_id)  # None: the database lost the WorkItem (say, a server crash)
        if row is None or row.Status != WorkStatus.COMPLETED or row.LeaseToken != token:
            problems.append(f"false success: completion of {work_id} (op {op.index}) was acknowledged but not kept")
            continue
        loaded = loads.get((work_id, token))
        if loaded is None:
            problems.append(f"unexpected: {work_id} was completed by a lease that never loaded its inputs")
            continue
        members = [
            e.EnqueueOrdinal
            for e in events
            if (e.PackInstallId, e.ProjectionKey) == (row.PackInstallId, row.ProjectionKey)
            and row.InputStartOrdinal <= e.EnqueueOrdinal <= row.LaneOrdinal
        ]
        if loaded != sorted(members):
            problems.append(f"payload: {work_id} loaded {loaded}, its members are {sorted(members)}")
        for ordinal in loaded:
            executed[(row.PackInstallId, ordinal)].append(work_id)
    for (pack, ordinal), owners in executed.items():
        if len(owners) > 1:
            problems.append(f"executed twice: input {pack}/{ordinal} by completed generations {owners}")
    for w in work:
        if w.Status == WorkStatus.COMPLETED and (w.WorkId, w.LeaseToken) not in completions:
            problems.append(f"unexpected: {w.WorkId} is completed by token {w.LeaseToken} that no client completed")
    problems += [
        f"not executed: input {e.PackInstallId}/{e.EnqueueOrdinal} ({e.ReceiptKey}) has no completed generation"
        for e in events
        if (e.PackInstallId, e.EnqueueOrdinal) not in executed
    ]
    return problems


def _leases(history: History, duration: dt.timedelta) -> dict[str, list[_Lease]]:
    releases: dict[tuple[str, str], dt.datetime] = {}
    for op in [*history.ops("complete"), *history.ops("fail")]:
        if op.outcome is not OpOutcome.FAIL:
            key = tuple(op.value)
            releases[key] = min(releases.get(key, op.invoked_at), op.invoked_at)
    leases: dict[str, list[_Lease]] = defaultdict(list)
    for op in history.ops("claim"):
        if not op.ok:
            continue
        claim: Claim
        for claim in op.result:
            assert claim.work.lease_expires_at is not None  # a claim always has a lease
            expires = naive_utc(claim.work.lease_expires_at)  # aware from the client, naive from the facade
            leases[claim.work.work_id].append(
                _Lease(
                    work_id=claim.work.work_id,
                    token=claim.lease_token,
                    granted_at=expires - duration,
                    expires_at=expires,
                    released_at=releases.get((claim.work.work_id, claim.lease_token)),
                )
            )
    for granted in leases.values():
        granted.sort(key=lambda lease: lease.granted_at)
    return leases


def _lease_checks(history: History, work: Sequence[Any], duration: dt.timedelta) -> list[str]:
    """No completion from an expired or superseded lease; successive leases never overlap."""
    problems = []
    leases = _leases(history, duration)
    by_token = {(lease.work_id, lease.token): lease for granted in leases.values() for lease in granted}
    for (work_id, token), op in _completions(history, work).items():
        lease = by_token.get((work_id, token))
        if lease is None:
            problems.append(f"unexpected: completion of {work_id} with a token no recorded claim granted")
        elif op.invoked_at > lease.expires_at:
            problems.append(
                f"expired lease: completion of {work_id} invoked at {op.invoked_at} was accepted; "
                f"its lease expired at {lease.expires_at}"
            )
        for later in leases.get(work_id, []):
            if lease is not None and lease.granted_at < later.granted_at < op.invoked_at:
                problems.append(f"superseded lease: {work_id} was claimed again before completion op {op.index}")
    for granted in leases.values():
        for held, nxt in itertools.pairwise(granted):
            surely_held_until = min(held.expires_at, held.released_at or held.expires_at)
            if nxt.granted_at < surely_held_until:
                problems.append(
                    f"overlap: {held.work_id} leased to {nxt.token} at {nxt.granted_at} "
                    f"while {held.token} held it until {surely_held_until}"
                )
    for w in work:
        if w.Status == WorkStatus.COMPLETED and w.FinishedAt > w.LeaseExpiresAt:
            problems.append(f"expired lease: {w.WorkId} finished at {w.FinishedAt} after its lease {w.LeaseExpiresAt}")
    return problems


def _cutover_checks(history: History, engine: sa.Engine) -> list[str]:
    """Every answered cutover call names the same checkpoint, written exactly once."""
    calls = history.ops("cutover")
    problems = []
    for pack in {op.value for op in calls}:
        with engine.connect() as connection:
            rows = connection.execute(
                sa.select(ConnectorProjectionProtocol).where(ConnectorProjectionProtocol.c.PackInstallId == pack)
            ).all()
        answered = [op.result for op in calls if op.value == pack and op.ok]
        written = [r for r in answered if r.outcome.value == "written"]
        if len(rows) != 1:
            problems.append(f"cutover: pack {pack} has {len(rows)} protocol rows")
        if len(written) > 1:
            problems.append(f"cutover: {len(written)} calls for pack {pack} each wrote the checkpoint")
        cutoffs = {r.protocol.legacy_max_ordinal for r in answered if r.protocol is not None}
        cutoffs |= {row.LegacyMaxOrdinal for row in rows}
        if len(cutoffs) > 1:
            problems.append(f"cutover: pack {pack} was told different checkpoints {sorted(cutoffs)}")
    return problems


def unexpected_statuses(history: History, allowed: Mapping[str, Iterable[str]], default: Iterable[str]) -> Counter[str]:
    """``f:status`` of cut-off or refused calls outside ``allowed[f]`` (else ``default``), with their counts."""
    return Counter(
        f"{op.f}:{op.status}" for op in history.ops() if not op.ok and op.status not in set(allowed.get(op.f, default))
    )


def resolved_unknowns(history: History) -> Counter[str]:
    """How the retries resolved receipts an ingest left unknown: the outcome of their acknowledgement.

    ``admitted``: the cut-off call had not committed; ``duplicate_covered``: it had.
    """
    unknown = {key for op in history.ops("ingest") if op.outcome is OpOutcome.UNKNOWN for key, _ in op.value}
    first: dict[str, str] = {}
    for op in history.ops("ingest"):
        for result in op.result if op.ok else ():
            if result.receipt_key in unknown and result.outcome in ACKNOWLEDGED_OUTCOMES:
                first.setdefault(result.receipt_key, result.outcome.value)
    return Counter(first.values())
