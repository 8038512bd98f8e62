"""Connectors' Prometheus counters, counted by the facade (``service.Connectors``) from results.

Group admission (``admission.Admission``) counts its transactions and their calls after each one commits.

Nothing here runs inside the admission transaction: every count comes from what an
operation returned. Labels are bounded (outcome kinds, attempt numbers up to
``Settings.max_attempts`` or a work type's retry policy, ``retry_policy.MAX_ATTEMPTS_LIMIT``);
WorkIds and receipt keys never become labels. The per-pack gauges (queue depth, oldest
unclaimed generation, lag) are read from the database at scrape time by Controlplane
(``nexuscrm_controlplane.dashboard.collector``).
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge, Histogram

from workqueue import WorkStatus
from workqueue.values import IngestResult, InputPage, Outcome, PruneReport, WorkItemRow

if TYPE_CHECKING:  # metrics count what the wings return; only their types are named here
    from nexuscrm_connectors.operating.dead_letters import BulkCall
    from nexuscrm_connectors.operating.retention import Backlog
    from nexuscrm_connectors.queue.claims import ClaimBatch

INPUTS_ADMITTED = Counter("nexuscrm_inputs_admitted_total", "Inputs admitted: an Event in a generation.")
GENERATIONS_CREATED = Counter(
    "nexuscrm_generations_created_total", "Generations created, by origin (admission or replay).", ["origin"]
)
GENERATIONS_EXTENDED = Counter(
    "nexuscrm_generations_extended_total", "Unclaimed generations whose upper bound an Ingest batch raised."
)
GENERATION_INPUTS = Histogram(
    "nexuscrm_generation_inputs",
    "Inputs (members) of a generation when a worker loads it.",
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000),
)
DUPLICATES = Counter(
    "nexuscrm_duplicates_total",
    "Receipt duplicates acknowledged, by kind (legacy, covered, pruned, expired).",
    ["kind"],
)
COVERAGE_MISSING = Counter(
    "nexuscrm_coverage_missing_total", "Duplicates whose input no generation covers (an explicit error)."
)
RECEIPTS_FENCED = Counter("nexuscrm_receipts_fenced_total", "Deliveries stored durably behind an admission fence.")
DELIVERIES_REJECTED = Counter("nexuscrm_deliveries_rejected_total", "Deliveries rejected with nothing written.")
MATERIALIZER_FAILURES = Counter(
    "nexuscrm_materializer_failures_total",
    "Background passes that raised, by step (materializer, stranded-generation, retention); each is retried after "
    "a back-off.",
    ["step"],
)
MATERIALIZER_HEALTHY = Gauge(
    "nexuscrm_materializer_healthy", "1 when the background materializer's last pass succeeded, else 0."
)
PRUNED = Counter(
    "nexuscrm_retention_pruned_total",
    "Rows the retention pruner deleted, by kind (generations, events, receipts; expired_receipts and "
    "expired_generations: tombstones and generation records the duplicate window expired); dry runs are not counted.",
    ["kind"],
)
PRUNE_KEPT = Counter(
    "nexuscrm_retention_kept_total",
    "Old terminal generations a retention pass kept: among the newest of their identity, or a blocked successor.",
)
RETENTION_BACKLOG = Gauge(
    "nexuscrm_retention_backlog_generations",
    "Generations the retention policies let go (by their age and count limits) that are still retained, summed "
    "over packs (each counted up to 10 000), as the last background pass left them: near zero while the pruner "
    "keeps up (decision 181).",
)
RETENTION_BACKLOG_AGE = Gauge(
    "nexuscrm_retention_backlog_age_seconds",
    "Seconds since the oldest generation of nexuscrm_retention_backlog_generations finished (0 without one).",
)
PRUNE_PASS_SECONDS = Histogram(
    "nexuscrm_retention_pass_seconds",
    "Duration of one background retention pass over every pack with a policy.",
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60),
)
ADMISSION_TRANSACTIONS = Histogram(
    "nexuscrm_admission_transaction_deliveries",
    "Deliveries per committed admission transaction (concurrent Ingest calls of a pack share one).",
    buckets=(1, 10, 50, 100, 200, 500, 1000, 2000),
)
ADMISSION_CALLS = Counter(
    "nexuscrm_admission_calls_total", "Ingest calls whose deliveries a committed admission transaction admitted."
)
CLAIMS = Counter("nexuscrm_claims_total", "Generations leased to a worker.")
LEASES_RECLAIMED = Counter(
    "nexuscrm_leases_reclaimed_total", "Expired leases a claim took over for a new attempt of their generation."
)
RETRIES = Counter(
    "nexuscrm_retries_total", "Failed attempts scheduled for a retry, by the attempt that failed.", ["attempt"]
)
FAILURES = Counter(
    "nexuscrm_failures_total",
    "Generations that failed for good, by reason (attempts_exhausted, not_retryable, lease_expired).",
    ["reason"],
)
GENERATIONS_FAILED_DAMAGED = Counter(
    "nexuscrm_generations_failed_damaged_total",
    "Generations a claim failed for good because their selected Event is missing (damaged data).",
)
COMPLETIONS = Counter("nexuscrm_completions_total", "Generations completed.")
STRANDED_HEALED = Counter(
    "nexuscrm_stranded_generations_healed_total",
    "Blocked generations whose predecessor was already terminal (or missing), made claimable by the liveness sweep.",
)
# Operating projections (issue 37).
CLAIM_PAUSES = Counter(
    "nexuscrm_claim_pauses_total", "Claim pauses and resumes, by action (pause, resume) and scope.", ["action", "scope"]
)
DEAD_LETTERS_REPLAYED = Counter(
    "nexuscrm_dead_letters_replayed_total",
    "Dead letters a bulk replay handled, by verdict (replayed, refused); dry runs are not counted.",
    ["verdict"],
)
DEAD_LETTERS_SKIPPED = Counter(
    "nexuscrm_dead_letters_skipped_total",
    "Dead letters a bulk skip handled, by verdict (skipped, refused); dry runs are not counted.",
    ["verdict"],
)
COVERAGE_EXCEPTIONS = Counter(
    "nexuscrm_coverage_identities_with_exceptions_total",
    "Identities a coverage proof found not tiled, by exception kind (gap, overlap): one per identity and kind.",
    ["kind"],
)

_DUPLICATE_KINDS = {
    Outcome.DUPLICATE_LEGACY: "legacy",
    Outcome.DUPLICATE_COVERED: "covered",
    Outcome.DUPLICATE_PRUNED: "pruned",
    Outcome.EXPIRED: "expired",
}


def record_ingest(results: Sequence[IngestResult]) -> None:
    """Count a batch's outcomes, and the generations it created or extended (one increment per counter)."""
    outcomes = collections.Counter(result.outcome for result in results)
    admitted = [r for r in results if r.outcome is Outcome.ADMITTED and r.work_id is not None]
    admitted_into = {result.work_id for result in admitted}
    started = {result.work_id for result in admitted if result.starts_generation}
    INPUTS_ADMITTED.inc(outcomes[Outcome.ADMITTED])
    COVERAGE_MISSING.inc(outcomes[Outcome.COVERAGE_MISSING])
    RECEIPTS_FENCED.inc(outcomes[Outcome.FENCED])
    DELIVERIES_REJECTED.inc(outcomes[Outcome.REJECTED])
    for outcome, kind in _DUPLICATE_KINDS.items():
        DUPLICATES.labels(kind).inc(outcomes[outcome])
    GENERATIONS_CREATED.labels("admission").inc(len(started))
    GENERATIONS_EXTENDED.inc(len(admitted_into - started))


def record_claim(batch: ClaimBatch) -> None:
    """Count the leases a claim granted, the expired ones among them, and the generations it failed (expiry, damage)."""
    CLAIMS.inc(len(batch.claims))
    for claim in batch.claims:
        if claim.inputs is not None:  # read inline: the worker sends no LoadInputs for it
            GENERATION_INPUTS.observe(claim.inputs.member_count)
    LEASES_RECLAIMED.inc(batch.reclaimed)
    FAILURES.labels("lease_expired").inc(batch.expired_failed)
    GENERATIONS_FAILED_DAMAGED.inc(batch.failed_damaged)


def record_finish(work: WorkItemRow, *, retryable: bool = True) -> None:
    """Count the state a Complete or Fail (``retryable`` as the worker asked) left a generation in."""
    if work.status is WorkStatus.COMPLETED:
        COMPLETIONS.inc()
    elif work.status is WorkStatus.RETRY:
        RETRIES.labels(str(work.attempt)).inc()
    elif work.status is WorkStatus.FAILED:
        FAILURES.labels("attempts_exhausted" if retryable else "not_retryable").inc()


def observed_pages(pages: Iterator[InputPage]) -> Iterator[InputPage]:
    """Pass ``pages`` through, observing the generation's member count once, with its first page."""
    first = True
    for page in pages:
        if first:
            GENERATION_INPUTS.observe(page.member_count)
            first = False
        yield page


def record_prune(reports: Sequence[PruneReport], backlog: Backlog | None = None) -> None:
    """Count what pruning passes deleted and kept (dry runs change nothing and count nothing); set the backlog."""
    if backlog is not None:
        RETENTION_BACKLOG.set(backlog.generations)
        RETENTION_BACKLOG_AGE.set(backlog.oldest_seconds)
    for report in reports:
        if report.dry_run:
            continue
        PRUNED.labels("generations").inc(report.generations)
        PRUNED.labels("events").inc(report.events)
        PRUNED.labels("receipts").inc(report.receipts)
        PRUNED.labels("expired_receipts").inc(report.expired_receipts)
        PRUNED.labels("expired_generations").inc(report.expired_generations)
        PRUNE_KEPT.inc(report.kept)


def record_bulk(counter: Counter, handled: BulkCall) -> None:
    """Count a bulk replay's or skip's answers by verdict in ``counter``; a dry run changes and counts nothing."""
    if handled.dry_run:
        return
    for answer in handled.answers:
        counter.labels(answer.verdict.value).inc()
