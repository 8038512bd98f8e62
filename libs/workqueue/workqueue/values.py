"""The value types every owner shares: deliveries, their outcomes, generations, claims, receipts and inputs.

Frozen and keyword-only; Connectors builds them, the SDK carries them over gRPC, the host and
the tools read them. Their datetimes are UTC: naive inside the services (what the database
stores), timezone-aware when they come from the SDK's client (docs/decisions/104-connectors-sdk.md).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json

from workqueue import ProjectionIdentity, WorkStatus
from workqueue.errors import DomainError, InvalidArgument
from workqueue.statuses import AttemptOutcome


@dataclasses.dataclass(frozen=True, kw_only=True)
class Route:
    """The projection identity of an input without its pack incarnation."""

    event_kind: str
    route_version: str
    companion_version: str
    work_type: str
    source_lane: str

    def identity(self, pack_install_id: str) -> ProjectionIdentity:
        """The full identity in ``pack_install_id``; validates every field."""
        return ProjectionIdentity(pack_install_id=pack_install_id, **dataclasses.asdict(self))

    @classmethod
    def of(cls, identity: ProjectionIdentity) -> Route:
        """The route part of ``identity``."""
        return cls(
            event_kind=identity.event_kind,
            route_version=identity.route_version,
            companion_version=identity.companion_version,
            work_type=identity.work_type,
            source_lane=identity.source_lane,
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class IngestItem:
    """One delivery from a source system."""

    receipt_key: str
    route: Route
    payload: bytes
    source_time: dt.datetime | None = None  # the source's clock: recorded, never trusted


class Outcome(enum.StrEnum):
    """What happened to one delivery of an Ingest batch."""

    ADMITTED = "admitted"
    DUPLICATE_LEGACY = "duplicate_legacy"  # at or below LegacyMaxOrdinal: acknowledged
    DUPLICATE_COVERED = "duplicate_covered"  # a generation covers it: acknowledged
    DUPLICATE_PRUNED = "duplicate_pruned"  # its generation was pruned by retention: acknowledged as expired
    FENCED = "fenced"  # stored durably; admitted once the fence is lifted
    COVERAGE_MISSING = "coverage_missing"  # an explicit error: never acknowledged
    REJECTED = "rejected"  # nothing written for this item
    # An unknown key whose SourceTime is at or below the pack's duplicate-window horizon: it may be
    # a duplicate whose tombstone expired, so it is acknowledged and never admitted.
    EXPIRED = "expired"


ACKNOWLEDGED_OUTCOMES = frozenset(
    {Outcome.ADMITTED, Outcome.DUPLICATE_LEGACY, Outcome.DUPLICATE_COVERED, Outcome.DUPLICATE_PRUNED, Outcome.EXPIRED}
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class IngestResult:
    """The outcome of one delivery; ``work_id`` names the covering generation, if any.

    ``starts_generation`` is True for an admitted input that opened a new generation (its
    InputStartOrdinal); other admitted inputs joined or extended an existing one.
    """

    receipt_key: str
    outcome: Outcome
    enqueue_ordinal: int | None = None
    work_id: str | None = None
    message: str = ""
    starts_generation: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkItemRow:
    """One WorkItem (a generation, or old-protocol work when ``input_start_ordinal`` is None)."""

    work_id: str
    pack_install_id: str
    projection_key: str
    work_type: str
    input_start_ordinal: int | None
    lane_ordinal: int
    replay_of_work_id: str | None
    status: WorkStatus
    attempt: int
    max_attempts: int
    claimable_at: dt.datetime | None
    lease_owner: str | None
    lease_token: str | None
    lease_expires_at: dt.datetime | None
    last_error: str | None
    created_at: dt.datetime
    finished_at: dt.datetime | None
    # A Flow version's generation (decision 185): its version, and whether it runs in a build
    # (its inputs ran live in another version: the Flow writes its read model only).
    flow_version: str | None = None
    build_run: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class Claim:
    """A claimed generation and the fencing token every later call must present.

    ``inputs``: the generation's whole membership when the claim asked for it inline and it
    fitted; None: read it with LoadInputs.
    """

    work: WorkItemRow
    lease_token: str
    inputs: InputPage | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Completion:
    """A generation a worker finished, to complete in its next claim: what Complete takes."""

    work_id: str
    lease_token: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class CompletionResult:
    """The answer to one ``Completion``: the completed generation, or the refusal Complete would have raised."""

    work_id: str
    work: WorkItemRow | None = None
    error: DomainError | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClaimAnswer:
    """What a claim that completed generations first returns: its claims, and one result per completion in order."""

    claims: list[Claim]
    completed: list[CompletionResult]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReceiptExplanation:
    """Where a receipt stands, which generation covers its input, and why (ExplainReceipt).

    ``receipt_state`` is a ``ReceiptState`` value; ``enqueue_ordinal`` is None until the
    receipt is admitted; ``covered_by`` carries no lease token.
    """

    receipt_state: str
    enqueue_ordinal: int | None
    covered_by: WorkItemRow | None
    explanation: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReceiptSummary:
    """One receipt in a listing (ListReceipts); ``received_at`` is UTC (timezone-aware from the SDK)."""

    pack_install_id: str
    receipt_key: str
    state: str
    route: Route
    received_at: dt.datetime


@dataclasses.dataclass(frozen=True, kw_only=True)
class InputRow:
    """One member of a generation, as a Flow reads it from ``Generation.inputs`` (in ordinal order).

    ``enqueue_ordinal``: the input's ordinal in its pack incarnation: positive, unique, never
    reused, rising in admission order; a generation's members come in this order, and the
    pair (pack, ordinal) identifies the input (the key of the SDK's applied ledger).
    ``receipt_key``: the key the source delivered it under (its idempotency key); None for a
    replay Event.
    ``payload``: the bytes delivered, unchanged; for a replay Event, JSON naming the replayed
    generation (``replay_of_work_id``, ``input_start_ordinal``, ``lane_ordinal``), whose inputs
    are not members of the replay generation.
    ``source_time``: the time the source gave the delivery, if any: recorded, never used to
    order or select inputs; timezone-aware UTC in a Flow.
    ``is_replay``: True only for the Event an explicit replay created (docs/design.md, "Replay").
    ``replayed_work_id``: set only for an input a replay generation runs again: the WorkId of
    the replayed generation it is a member of (it comes before the replay's own members).
    """

    enqueue_ordinal: int
    receipt_key: str | None
    payload: bytes
    source_time: dt.datetime | None
    is_replay: bool
    replayed_work_id: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class InputPage:
    """A page of a generation's members, in ordinal order."""

    inputs: tuple[InputRow, ...]
    last: bool
    member_count: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkAttemptRow:
    """One attempt of a generation that did not complete it.

    ``attempt`` counts from 1 and counts every attempt (a RetryLater one too); ``started_at``
    is None for a lease taken by a release before it was recorded; ``finished_at`` is Fail's
    instant, or an expired lease's expiry. ``error`` and ``traceback`` are the Flow's, shown to
    operators only (never logged).
    """

    attempt: int
    worker_id: str
    started_at: dt.datetime | None
    finished_at: dt.datetime
    outcome: AttemptOutcome
    error: str
    traceback: str | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkDescription:
    """A generation and how many Events are its members (0 for old-protocol work): GetWork's answer.

    ``work.max_attempts`` is the effective one (its work type's retry policy, else what admission
    recorded). ``attempts``: the newest attempts that did not complete it, oldest first;
    ``attempt_count``: how many there are in all.
    """

    work: WorkItemRow
    member_count: int
    attempts: tuple[WorkAttemptRow, ...] = ()
    attempt_count: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class QueueState:
    """The native queue of one pack (GetQueueState, WaitQueueDrained).

    Counts of generations with a recorded range that are not terminal, receipts stored but not
    admitted yet (counted up to 10 000), and the waiting generation that holds the pack's
    oldest waiting input (None when nothing waits) with how long it has waited at ``read_at``.
    Drained: nothing queued, running or waiting for admission.
    """

    pack_install_id: str
    pending: int
    blocked: int
    retry: int
    processing: int
    receipts_waiting: int
    oldest_waiting_work_id: str | None
    oldest_waiting_since: dt.datetime | None
    oldest_waiting_age: dt.timedelta | None
    read_at: dt.datetime
    # Pending generations the "block" order policy holds behind a dead letter (counted in
    # pending too), up to 10 000; GetQueueState only.
    held: int = 0
    # Generations that failed for good, among the 100 000 oldest failures, and the dead letters
    # among them (neither replayed nor skipped); GetQueueState only.
    failed: int = 0
    dead_letters: int = 0

    @property
    def depth(self) -> int:
        """Generations not terminal yet."""
        return self.pending + self.blocked + self.retry + self.processing

    @property
    def drained(self) -> bool:
        """True when no generation is queued or running and no receipt waits for admission."""
        return self.depth == 0 and self.receipts_waiting == 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class GenerationPage:
    """One page of an identity's generations, newest first (ListGenerations), and the next page's token.

    ``next_page_token`` is "" on the last page.
    """

    generations: tuple[WorkItemRow, ...]
    next_page_token: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemberPage:
    """One page of a generation's members in ordinal order (ListMembers), and the next page's token ("" at the end).

    ``member_count`` counts the members when the page was read: an unclaimed generation may
    still be extended by admission.
    """

    inputs: tuple[InputRow, ...]
    next_page_token: str
    member_count: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReplayResult:
    """The generation a replay queued and the ordinal of the replay Event that starts it: Replay's answer."""

    work: WorkItemRow
    replay_event_ordinal: int


def replay_event_payload(work: WorkItemRow) -> bytes:
    """The payload of the Event a replay of ``work`` inserts: JSON naming the replayed WorkId and range."""
    return json.dumps(
        {
            "replay_of_work_id": work.work_id,
            "input_start_ordinal": work.input_start_ordinal,
            "lane_ordinal": work.lane_ordinal,
        },
        sort_keys=True,
    ).encode()


def lease_seconds(lease: dt.timedelta | None) -> int:
    """The whole seconds of a requested lease, as the protocol carries them; 0 (the server's default) for None.

    Raises ``InvalidArgument`` for a zero lease or one with a fraction of a second; the server
    checks the range (a negative lease is refused there, with the bounds in the message).
    """
    if lease is None:
        return 0
    seconds, rest = divmod(lease, dt.timedelta(seconds=1))
    if rest or not seconds:
        raise InvalidArgument(
            f"lease must be a whole number of seconds other than 0, got {lease.total_seconds():g} s", field="lease"
        )
    return int(seconds)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RetentionPolicy:
    """A pack's retention policy and horizons (decisions 123, 127); both limits None means pruning is off."""

    pack_install_id: str
    keep_generations: int | None = None
    keep_seconds: int | None = None
    duplicate_window_seconds: int | None = None
    horizon_ordinal: int = 0
    horizon_source_time: dt.datetime | None = None
    expired_receipts: int = 0
    pruned_generations: int = 0
    last_pruned_at: dt.datetime | None = None
    # The pruner's backlog when read by GetRetentionPolicy (decision 181): generations the
    # policy lets go that are still retained, and when the oldest of them finished.
    backlog_generations: int = 0
    backlog_oldest_finished_at: dt.datetime | None = None

    @property
    def active(self) -> bool:
        """Whether the policy lets anything go."""
        return self.keep_generations is not None or self.keep_seconds is not None

    def finished_before(self, now: dt.datetime) -> dt.datetime:
        """Generations finished after this instant are kept by age."""
        return now - dt.timedelta(seconds=self.keep_seconds or 0)

    def expire_before(self, now: dt.datetime) -> dt.datetime | None:
        """Tombstones whose SourceTime is before this instant expire; None without a duplicate window."""
        if self.duplicate_window_seconds is None:
            return None
        return now - dt.timedelta(seconds=self.duplicate_window_seconds)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PruneReport:
    """What one pass over a pack pruned (or, dry, would prune), and the candidates it kept."""

    pack_install_id: str
    dry_run: bool
    generations: int = 0
    events: int = 0
    receipts: int = 0
    kept: int = 0
    horizon_ordinal: int = 0
    expired_receipts: int = 0
    expired_generations: int = 0
    horizon_source_time: dt.datetime | None = None
