"""Connectors' Prometheus counters, counted by the facade (``service.Connectors``) from results.

Nothing here runs inside the admission transaction: every count comes from what an
operation returned. Labels are bounded (outcome kinds, attempt numbers up to
``Settings.max_attempts``); WorkIds and receipt keys never become labels. The per-pack gauges
(queue depth, oldest unclaimed generation, lag) are read from the database at scrape time by
Controlplane (``nexuscrm_controlplane.dashboard.collector``).

Whether an admitted generation was created or extended by a batch is not in ``IngestResult``
yet; until admission reports it, ``generation_starts`` reads the immutable InputStartOrdinal
of the batch's generations once per batch (primary-key reads, after the commit), and only
while a metrics endpoint is serving (``counting_generations``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import sqlalchemy as sa
from prometheus_client import Counter, Histogram
from sqlalchemy.engine import Connection

from nexuscrm_connectors.models import IngestResult, InputPage, Outcome, WorkItemRow
from nexuscrm_schema_catalog.tables import WorkItem
from workqueue import WorkStatus

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
    "nexuscrm_duplicates_total", "Receipt duplicates acknowledged, by kind (legacy, covered).", ["kind"]
)
COVERAGE_MISSING = Counter(
    "nexuscrm_coverage_missing_total", "Duplicates whose input no generation covers (an explicit error)."
)
RECEIPTS_FENCED = Counter("nexuscrm_receipts_fenced_total", "Deliveries stored durably behind an admission fence.")
DELIVERIES_REJECTED = Counter("nexuscrm_deliveries_rejected_total", "Deliveries rejected with nothing written.")
CLAIMS = Counter("nexuscrm_claims_total", "Generations leased to a worker.")
RETRIES = Counter(
    "nexuscrm_retries_total", "Failed attempts scheduled for a retry, by the attempt that failed.", ["attempt"]
)
FAILURES = Counter("nexuscrm_failures_total", "Generations that failed for good, by reason.", ["reason"])
COMPLETIONS = Counter("nexuscrm_completions_total", "Generations completed.")

_DUPLICATE_KINDS = {Outcome.DUPLICATE_LEGACY: "legacy", Outcome.DUPLICATE_COVERED: "covered"}
_counting_generations = False


def count_generations(enabled: bool) -> None:
    """Turn the per-batch generation read on (a metrics endpoint serves) or off."""
    global _counting_generations  # one switch per process, set at start
    _counting_generations = enabled


def counting_generations() -> bool:
    """True while created/extended generations are counted."""
    return _counting_generations


def record_ingest(results: Sequence[IngestResult]) -> dict[str, int]:
    """Count a batch's outcomes; return the lowest admitted ordinal of each generation it admitted into."""
    lowest: dict[str, int] = {}
    for result in results:
        if result.outcome is Outcome.ADMITTED:
            INPUTS_ADMITTED.inc()
            if result.work_id is not None and result.enqueue_ordinal is not None:
                lowest[result.work_id] = min(lowest.get(result.work_id, result.enqueue_ordinal), result.enqueue_ordinal)
        elif result.outcome in _DUPLICATE_KINDS:
            DUPLICATES.labels(_DUPLICATE_KINDS[result.outcome]).inc()
        elif result.outcome is Outcome.COVERAGE_MISSING:
            COVERAGE_MISSING.inc()
        elif result.outcome is Outcome.FENCED:
            RECEIPTS_FENCED.inc()
        else:
            DELIVERIES_REJECTED.inc()
    return lowest


def record_generations(lowest: dict[str, int], starts: dict[str, int]) -> None:
    """Count each generation as created (its start is the batch's lowest ordinal in it) or extended."""
    for work_id, ordinal in lowest.items():
        if starts.get(work_id) == ordinal:
            GENERATIONS_CREATED.labels("admission").inc()
        else:
            GENERATIONS_EXTENDED.inc()


def generation_starts(connection: Connection, work_ids: Sequence[str]) -> dict[str, int]:
    """InputStartOrdinal by WorkId (primary key; immutable, so a read after the commit is exact)."""
    if not work_ids:
        return {}
    rows = connection.execute(
        sa.select(WorkItem.c.WorkId, WorkItem.c.InputStartOrdinal).where(WorkItem.c.WorkId.in_(list(work_ids)))
    )
    return {row.WorkId: int(row.InputStartOrdinal) for row in rows if row.InputStartOrdinal is not None}


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
