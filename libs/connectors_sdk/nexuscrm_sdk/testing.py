"""Test doubles for Flow authors: a fake clock and an in-memory ``WorkSource``.

``InMemoryWorkSource`` takes inputs the way Connectors does (``ingest``, or ``add_inputs``
for one projection identity) and forms generations as the protocol does, at a simple level:
ordinals are allocated per pack in arrival order; the inputs of one identity join its newest
generation while that one is unclaimed at attempt zero, else they start a successor (blocked
until its predecessor is terminal); a generation's members are exactly the Events of its
identity between its two bounds, loaded in ordinal order. A ``Worker`` claims, loads,
heartbeats, completes and fails generations as it would against Connectors, and every
finished attempt is recorded (``attempts``), retries included::

    source = InMemoryWorkSource()
    source.add_inputs(identity, payloads=[b"a", b"b"])
    worker = Worker(source, my_flow, worker_id="test")
    while worker.run_once():
        pass
    assert [a.outcome for a in source.attempts] == [WorkStatus.COMPLETED]

``replay`` replays a terminal generation as Connectors does: a replay Event at a new ordinal
and a generation that starts with it, whose worker is handed the replayed generation's inputs
again (``load_replayed_inputs``) before its own; a failed generation is replayed at most once.

``build_version`` builds a Flow version of a work type from history as Connectors does, at a
simple level: one generation per identity over every input it has so far, in the version's
track (``WorkItemRow.flow_version``), run in a build (``build_run``); a worker claims them only
when it names the version (``flow_versions``). Later inputs go to the inputs' own version only.

It does not model: admission fences and pack installs (any pack id is accepted); duplicate
deliveries (a receipt key seen before raises ``ValueError``); leases across processes (a
lease never expires, so nothing is reclaimed; heartbeats only move the recorded expiry);
claim waits (``wait`` is ignored: a claim answers at once); order policies, skips and
old-protocol work; the service's limits (batch, page and lease bounds). Its datetimes are timezone-aware UTC,
from its clock.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence

from nexuscrm_wire.timestamps import aware_utc
from workqueue import TERMINAL_WORK_STATUSES, ProjectionIdentity, WorkStatus, decode_projection_key
from workqueue.errors import DomainError, ErrorKind, InvalidArgument
from workqueue.values import (
    Claim,
    ClaimAnswer,
    Completion,
    CompletionResult,
    IngestItem,
    IngestResult,
    InputPage,
    InputRow,
    Outcome,
    ReplayResult,
    Route,
    WorkDescription,
    WorkItemRow,
    lease_seconds,
    replay_event_payload,
)

__all__ = ["AttemptRecord", "FakeClock", "InMemoryWorkSource", "LeaseNotHeld"]

EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)  # where a FakeClock starts unless told otherwise
DEFAULT_LEASE = dt.timedelta(seconds=30)  # a claim's lease when none is asked for
DEFAULT_PAGE_SIZE = 500  # members per LoadInputs page when none is asked for


class FakeClock:
    """A clock that moves only when told to; calling it returns the current timezone-aware UTC time."""

    def __init__(self, start: dt.datetime = EPOCH) -> None:
        if start.tzinfo is None:
            raise ValueError("FakeClock needs a timezone-aware start")
        self._now = start.astimezone(dt.UTC)
        self._lock = threading.Lock()

    def __call__(self) -> dt.datetime:
        with self._lock:
            return self._now

    def advance(self, by: dt.timedelta) -> dt.datetime:
        """Move the clock forward by ``by`` (not backwards); return the new time."""
        if by < dt.timedelta(0):
            raise ValueError(f"a clock does not go back; got {by}")
        with self._lock:
            self._now += by
            return self._now


class LeaseNotHeld(DomainError):
    """The lease token is not the current lease of a processing generation (Connectors' ``LeaseLost``)."""

    kind = ErrorKind.FAILED_PRECONDITION


@dataclasses.dataclass(frozen=True, kw_only=True)
class AttemptRecord:
    """One finished attempt of a generation, as its worker reported it.

    ``attempt`` counts from 0 (the first attempt); ``outcome`` is the generation's status
    afterwards: completed, retry (failed, another attempt follows) or failed (for good).
    ``traceback``: the one the worker sent with a failure (as Connectors stores it).
    """

    work_id: str
    projection_key: str
    attempt: int
    ordinals: tuple[int, ...]
    outcome: WorkStatus
    error: str | None
    traceback: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Event:
    ordinal: int
    projection_key: str
    receipt_key: str | None
    payload: bytes
    source_time: dt.datetime | None
    is_replay: bool = False


class InMemoryWorkSource:
    """A ``WorkSource`` in memory, for a Flow's own tests (see the module docstring for its scope).

    ``clock``: the time of every datetime it records (a ``FakeClock`` by default).
    ``max_attempts``: attempts per generation before a retryable failure fails it for good.
    ``backoff``: how long a failed attempt waits before its retry is claimable.
    Thread-safe: a ``Worker`` heartbeats from its own thread.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], dt.datetime] | None = None,
        max_attempts: int = 3,
        backoff: dt.timedelta = dt.timedelta(0),
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.clock = clock or FakeClock()
        self._max_attempts = max_attempts
        self._backoff = backoff
        self._lock = threading.RLock()
        self._ordinals: dict[str, itertools.count[int]] = {}
        self._receipts: set[tuple[str, str]] = set()
        self._events: dict[str, list[_Event]] = {}  # pack -> Events in ordinal order
        self._work: dict[str, WorkItemRow] = {}  # WorkId -> generation, in creation order
        self._input_keys: dict[str, str] = {}  # WorkId of a version track's generation -> its inputs' key
        self._attempts: list[AttemptRecord] = []
        self._receipt_numbers = itertools.count(1)

    # Inputs ---------------------------------------------------------------------------------

    def ingest(self, pack_install_id: str, *, items: Sequence[IngestItem]) -> list[IngestResult]:
        """Admit a batch as Connectors does: one result per item, invalid routes rejected.

        Raises ``ValueError`` for a receipt key this source has seen before (duplicates are
        not modelled).
        """
        with self._lock:
            now = self._now()
            results: dict[int, IngestResult] = {}
            fresh: list[tuple[int, IngestItem, str]] = []  # (position, item, projection key)
            key: str
            for position, item in enumerate(items):
                if (pack_install_id, item.receipt_key) in self._receipts:
                    raise ValueError(f"receipt {item.receipt_key!r} was ingested before: duplicates are not modelled")
                try:
                    key = item.route.identity(pack_install_id).key
                except (DomainError, ValueError) as error:
                    results[position] = IngestResult(
                        receipt_key=item.receipt_key, outcome=Outcome.REJECTED, message=str(error)
                    )
                    continue
                self._receipts.add((pack_install_id, item.receipt_key))
                fresh.append((position, item, key))
            counter = self._ordinals.setdefault(pack_install_id, itertools.count(1))
            by_identity: dict[str, list[tuple[int, int, IngestItem]]] = {}
            for position, item, key in fresh:
                ordinal = next(counter)
                self._events.setdefault(pack_install_id, []).append(
                    _Event(
                        ordinal=ordinal,
                        projection_key=key,
                        receipt_key=item.receipt_key,
                        payload=item.payload,
                        source_time=aware_utc(item.source_time) if item.source_time is not None else None,
                    )
                )
                by_identity.setdefault(key, []).append((position, ordinal, item))
            for key, members in by_identity.items():
                work_id, starts = self._cover(pack_install_id, key, members[0][1], members[-1][1], now)
                for position, ordinal, item in members:
                    results[position] = IngestResult(
                        receipt_key=item.receipt_key,
                        outcome=Outcome.ADMITTED,
                        enqueue_ordinal=ordinal,
                        work_id=work_id,
                        starts_generation=ordinal == starts,
                    )
            return [results[position] for position in range(len(items))]

    def add_inputs(self, identity: ProjectionIdentity, *, payloads: Sequence[bytes]) -> list[IngestResult]:
        """Ingest ``payloads`` as inputs of ``identity``, in order, with receipt keys made up here."""
        items = [
            IngestItem(receipt_key=f"receipt-{next(self._receipt_numbers)}", route=Route.of(identity), payload=p)
            for p in payloads
        ]
        return self.ingest(identity.pack_install_id, items=items)

    def _cover(self, pack: str, key: str, low: int, high: int, now: dt.datetime) -> tuple[str, int | None]:
        """Extend the identity's newest generation or start a successor; return its WorkId and new start."""
        same = [w for w in self._work.values() if (w.pack_install_id, w.projection_key) == (pack, key)]
        newest = same[-1] if same else None
        if newest is not None and newest.status in (WorkStatus.PENDING, WorkStatus.BLOCKED) and newest.attempt == 0:
            self._work[newest.work_id] = dataclasses.replace(newest, lane_ordinal=high)
            return newest.work_id, None
        return self._successor(pack, key, low, high, now, replay_of_work_id=None), low

    def _successor(
        self, pack: str, key: str, low: int, high: int, now: dt.datetime, *, replay_of_work_id: str | None
    ) -> str:
        """A new generation [``low``, ``high``] of the identity, blocked while its newest one is not terminal."""
        same = [w for w in self._work.values() if (w.pack_install_id, w.projection_key) == (pack, key)]
        blocked = bool(same) and same[-1].status not in TERMINAL_WORK_STATUSES
        work_id = str(uuid.uuid4())
        self._work[work_id] = WorkItemRow(
            work_id=work_id,
            pack_install_id=pack,
            projection_key=key,
            work_type=decode_projection_key(key).work_type,
            input_start_ordinal=low,
            lane_ordinal=high,
            replay_of_work_id=replay_of_work_id,
            status=WorkStatus.BLOCKED if blocked else WorkStatus.PENDING,
            attempt=0,
            max_attempts=self._max_attempts,
            claimable_at=None if blocked else now,
            lease_owner=None,
            lease_token=None,
            lease_expires_at=None,
            last_error=None,
            created_at=now,
            finished_at=None,
        )
        return work_id

    def build_version(self, pack_install_id: str, *, work_type: str, version: str) -> list[WorkItemRow]:
        """Build Flow version ``version`` of ``work_type``: one build generation per identity over its inputs so far.

        Its projection key is the identity's with companion version ``version``; its members
        are the inputs of the identity they were delivered to. Returns the generations made.
        """
        with self._lock:
            now = self._now()
            built = []
            keys = dict.fromkeys(e.projection_key for e in self._events.get(pack_install_id, []) if not e.is_replay)
            for key in keys:
                identity = decode_projection_key(key)
                if identity.work_type != work_type:
                    continue
                ordinals = [e.ordinal for e in self._events[pack_install_id] if e.projection_key == key]
                own_key = dataclasses.replace(identity, companion_version=version).key
                work_id = self._successor(
                    pack_install_id, own_key, ordinals[0], ordinals[-1], now, replay_of_work_id=None
                )
                self._work[work_id] = dataclasses.replace(self._work[work_id], flow_version=version, build_run=True)
                self._input_keys[work_id] = key
                built.append(self._work[work_id])
            return built

    def replay(self, work_id: str) -> ReplayResult:
        """Replay terminal ``work_id``: a replay Event at the next ordinal o and a generation [o, o] from it.

        Refused (``FAILED_PRECONDITION``) while ``work_id`` is not terminal or has a replay that
        is not, and for a failed generation replayed before (it is no longer a dead letter).
        """
        with self._lock:
            target = self._work.get(work_id)
            if target is None:
                raise DomainError(f"work {work_id} does not exist", kind=ErrorKind.NOT_FOUND, field="work_id")
            replays = [w for w in self._work.values() if w.replay_of_work_id == work_id]
            refusal = None
            if target.status not in TERMINAL_WORK_STATUSES:
                refusal = f"work {work_id} is {target.status}; only terminal work can be replayed"
            elif any(w.status not in TERMINAL_WORK_STATUSES for w in replays):
                refusal = f"work {work_id} already has a live replay"
            elif target.status is WorkStatus.FAILED and replays:
                refusal = f"work {work_id} was replayed already by {replays[-1].work_id}"
            if refusal is not None:
                raise DomainError(refusal, kind=ErrorKind.FAILED_PRECONDITION, field="work_id")
            pack, key = target.pack_install_id, target.projection_key
            ordinal = next(self._ordinals.setdefault(pack, itertools.count(1)))
            payload = replay_event_payload(target)
            self._events.setdefault(pack, []).append(
                _Event(
                    ordinal=ordinal,
                    projection_key=key,
                    receipt_key=None,
                    payload=payload,
                    source_time=None,
                    is_replay=True,
                )
            )
            new_id = self._successor(pack, key, ordinal, ordinal, self._now(), replay_of_work_id=work_id)
            return ReplayResult(work=self._work[new_id], replay_event_ordinal=ordinal)

    # WorkSource -----------------------------------------------------------------------------

    def claim(
        self,
        worker_id: str,
        *,
        pack_install_ids: Sequence[str] = (),
        work_types: Sequence[str] = (),
        max_items: int = 1,
        lease: dt.timedelta | None = None,
        wait: dt.timedelta = dt.timedelta(0),
        inline_inputs: bool = False,
        flow_versions: Sequence[str] = (),
    ) -> list[Claim]:
        """Lease up to ``max_items`` claimable generations (pending, or retry whose time has come), oldest first.

        ``wait`` is ignored: the answer comes at once. ``inline_inputs`` is ignored too: the
        claims carry no inputs (as from a server that predates them); ``load_inputs`` reads them.
        ``flow_versions``: claim those versions' generations (``build_version``); empty: the
        inputs' own version's.
        """
        versions: set[str | None] = set(flow_versions) or {None}  # None: the inputs' own version
        if max_items < 1:
            raise InvalidArgument(f"max_items must be at least 1, got {max_items}", field="max_items")
        length = dt.timedelta(seconds=lease_seconds(lease)) if lease is not None else DEFAULT_LEASE
        if length <= dt.timedelta(0):
            raise InvalidArgument(f"lease must be positive, got {length}", field="lease")
        with self._lock:
            now = self._now()
            candidates = sorted(
                (
                    w
                    for w in self._work.values()
                    if _claimable(w, now)
                    and (not pack_install_ids or w.pack_install_id in pack_install_ids)
                    and (not work_types or w.work_type in work_types)
                    and w.flow_version in versions
                ),
                key=lambda w: w.claimable_at or now,  # stable: ties in creation order
            )
            claims = []
            for work in candidates[:max_items]:
                token = str(uuid.uuid4())
                held = dataclasses.replace(
                    work,
                    status=WorkStatus.PROCESSING,
                    claimable_at=None,
                    lease_owner=worker_id,
                    lease_token=token,
                    lease_expires_at=now + length,
                )
                self._work[work.work_id] = held
                claims.append(Claim(work=held, lease_token=token))
            return claims

    def complete_and_claim(
        self,
        worker_id: str,
        *,
        completions: Sequence[Completion],
        pack_install_ids: Sequence[str] = (),
        work_types: Sequence[str] = (),
        max_items: int = 1,
        lease: dt.timedelta | None = None,
        wait: dt.timedelta = dt.timedelta(0),
        inline_inputs: bool = False,
        flow_versions: Sequence[str] = (),
    ) -> ClaimAnswer:
        """``complete`` each of ``completions`` (a refusal is its result's ``error``), then ``claim``."""
        if len({c.work_id for c in completions}) != len(completions):
            raise InvalidArgument("completions names a work twice", field="completions.work_id")
        completed = []
        for completion in completions:
            try:
                work = self.complete(completion.work_id, lease_token=completion.lease_token)
            except DomainError as error:
                completed.append(CompletionResult(work_id=completion.work_id, error=error))
            else:
                completed.append(CompletionResult(work_id=completion.work_id, work=work))
        claims = self.claim(
            worker_id,
            pack_install_ids=pack_install_ids,
            work_types=work_types,
            max_items=max_items,
            lease=lease,
            wait=wait,
            inline_inputs=inline_inputs,
            flow_versions=flow_versions,
        )
        return ClaimAnswer(claims=claims, completed=completed)

    def load_inputs(self, work_id: str, *, lease_token: str, page_size: int = 0) -> Iterator[InputPage]:
        """Every member of a held generation, in ordinal order, ``page_size`` per page (0: the default)."""
        if page_size < 0:
            raise InvalidArgument(f"page_size must not be negative, got {page_size}", field="page_size")
        with self._lock:
            work = self._held(work_id, lease_token)
            members = self._members(work)
        size = page_size or DEFAULT_PAGE_SIZE
        chunks = [members[i : i + size] for i in range(0, len(members), size)] or [[]]
        return iter(
            [
                InputPage(inputs=tuple(chunk), last=n == len(chunks) - 1, member_count=len(members))
                for n, chunk in enumerate(chunks)
            ]
        )

    def load_replayed_inputs(self, work_id: str, *, lease_token: str, page_size: int = 0) -> Iterator[InputPage]:
        """For a held replay generation, the members of the generations it replays (oldest first), in one page."""
        with self._lock:
            work = self._held(work_id, lease_token)
            if work.replay_of_work_id is None:
                raise DomainError(f"work {work_id} is not a replay", kind=ErrorKind.FAILED_PRECONDITION)
            chain = []
            link: str | None = work.replay_of_work_id
            while link is not None:
                chain.append(self._work[link])
                link = self._work[link].replay_of_work_id
            inputs = [
                dataclasses.replace(row, replayed_work_id=replayed.work_id)
                for replayed in reversed(chain)
                for row in self._members(replayed)
            ]
        return iter([InputPage(inputs=tuple(inputs), last=True, member_count=len(inputs))])

    def heartbeat(self, work_id: str, *, lease_token: str, lease: dt.timedelta | None = None) -> dt.datetime:
        """Move a held lease's expiry to ``lease`` from now (leases never expire here); return it."""
        length = dt.timedelta(seconds=lease_seconds(lease)) if lease is not None else DEFAULT_LEASE
        with self._lock:
            work = self._held(work_id, lease_token)
            expires = self._now() + length
            self._work[work_id] = dataclasses.replace(work, lease_expires_at=expires)
            return expires

    def complete(self, work_id: str, *, lease_token: str) -> WorkItemRow:
        """Finish a held generation; its blocked successor becomes pending."""
        with self._lock:
            work = self._held(work_id, lease_token)
            done = self._finish(work, status=WorkStatus.COMPLETED, attempt=work.attempt, error=None)
            self._record(work, done.status, None)
            return done

    def fail(
        self,
        work_id: str,
        *,
        lease_token: str,
        error: str,
        retryable: bool = True,
        retry_after: dt.timedelta | None = None,
        traceback: str | None = None,
    ) -> WorkItemRow:
        """Record a failed attempt: retry after ``backoff`` while attempts remain and ``retryable``, else failed.

        ``retry_after``: retry after that delay instead, the attempt not counted (as Connectors does).
        ``traceback``: kept with the attempt (``AttemptRecord.traceback``).
        """
        with self._lock:
            work = self._held(work_id, lease_token)
            attempt = work.attempt + (retry_after is None)
            if retry_after is not None or (retryable and attempt < work.max_attempts):
                after = dataclasses.replace(
                    work,
                    status=WorkStatus.RETRY,
                    attempt=attempt,
                    claimable_at=self._now() + (retry_after if retry_after is not None else self._backoff),
                    lease_token=None,
                    lease_expires_at=None,
                    last_error=error,
                )
                self._work[work_id] = after
            else:
                after = self._finish(work, status=WorkStatus.FAILED, attempt=attempt, error=error)
            self._record(work, after.status, error, traceback)
            return after

    # What a test asserts on ------------------------------------------------------------------

    @property
    def attempts(self) -> list[AttemptRecord]:
        """Every finished attempt, in the order they finished."""
        with self._lock:
            return list(self._attempts)

    def generations(self) -> list[WorkItemRow]:
        """Every generation, in the order they were created."""
        with self._lock:
            return list(self._work.values())

    def get_work(self, work_id: str) -> WorkDescription:
        """A generation and its member count, as Connectors' ``get_work`` answers."""
        with self._lock:
            work = self._work.get(work_id)
            if work is None:
                raise DomainError(f"work {work_id} does not exist", kind=ErrorKind.NOT_FOUND, field="work_id")
            return WorkDescription(work=work, member_count=len(self._members(work)))

    # Internals ------------------------------------------------------------------------------

    def _now(self) -> dt.datetime:
        return aware_utc(self.clock())

    def _held(self, work_id: str, lease_token: str) -> WorkItemRow:
        work = self._work.get(work_id)
        if work is None:
            raise DomainError(f"work {work_id} does not exist", kind=ErrorKind.NOT_FOUND, field="work_id")
        if work.status is not WorkStatus.PROCESSING or work.lease_token != lease_token:
            raise LeaseNotHeld(f"lease of work {work_id} is not held with this token ({work.status})")
        return work

    def _members(self, work: WorkItemRow) -> list[InputRow]:
        start = work.input_start_ordinal or work.lane_ordinal
        key = self._input_keys.get(work.work_id, work.projection_key)
        return [
            InputRow(
                enqueue_ordinal=e.ordinal,
                receipt_key=e.receipt_key,
                payload=e.payload,
                source_time=e.source_time,
                is_replay=e.is_replay,
            )
            for e in self._events.get(work.pack_install_id, [])
            if e.projection_key == key and start <= e.ordinal <= work.lane_ordinal
        ]

    def _finish(self, work: WorkItemRow, *, status: WorkStatus, attempt: int, error: str | None) -> WorkItemRow:
        now = self._now()
        done = dataclasses.replace(
            work,
            status=status,
            attempt=attempt,
            claimable_at=None,
            lease_token=None,
            lease_expires_at=None,
            last_error=error if error is not None else work.last_error,
            finished_at=now,
        )
        self._work[work.work_id] = done
        successor = next(
            (
                w
                for w in self._work.values()
                if w.status is WorkStatus.BLOCKED
                and (w.pack_install_id, w.projection_key) == (work.pack_install_id, work.projection_key)
            ),
            None,
        )
        if successor is not None:
            self._work[successor.work_id] = dataclasses.replace(successor, status=WorkStatus.PENDING, claimable_at=now)
        return done

    def _record(self, work: WorkItemRow, outcome: WorkStatus, error: str | None, traceback: str | None = None) -> None:
        self._attempts.append(
            AttemptRecord(
                work_id=work.work_id,
                projection_key=work.projection_key,
                attempt=work.attempt,
                ordinals=tuple(row.enqueue_ordinal for row in self._members(work)),
                outcome=outcome,
                error=error,
                traceback=traceback,
            )
        )


def _claimable(work: WorkItemRow, now: dt.datetime) -> bool:
    if work.status is WorkStatus.PENDING:
        return True
    return work.status is WorkStatus.RETRY and work.claimable_at is not None and work.claimable_at <= now
