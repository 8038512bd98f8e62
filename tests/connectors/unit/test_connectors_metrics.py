"""Connectors' Ingest counters: every outcome of a batch counted under its own series."""

from __future__ import annotations

from prometheus_client import REGISTRY

from nexuscrm_connectors.metrics import record_ingest
from workqueue.values import IngestResult, Outcome

SERIES: dict[str, tuple[str, dict[str, str]]] = {
    "admitted": ("nexuscrm_inputs_admitted_total", {}),
    "created": ("nexuscrm_generations_created_total", {"origin": "admission"}),
    "extended": ("nexuscrm_generations_extended_total", {}),
    "legacy": ("nexuscrm_duplicates_total", {"kind": "legacy"}),
    "covered": ("nexuscrm_duplicates_total", {"kind": "covered"}),
    "pruned": ("nexuscrm_duplicates_total", {"kind": "pruned"}),
    "expired": ("nexuscrm_duplicates_total", {"kind": "expired"}),
    "missing": ("nexuscrm_coverage_missing_total", {}),
    "fenced": ("nexuscrm_receipts_fenced_total", {}),
    "rejected": ("nexuscrm_deliveries_rejected_total", {}),
}


def _counts() -> dict[str, float]:
    return {name: REGISTRY.get_sample_value(metric, labels) or 0.0 for name, (metric, labels) in SERIES.items()}


def _result(n: int, outcome: Outcome, work_id: str | None = None, *, starts: bool = False) -> IngestResult:
    return IngestResult(receipt_key=f"r-{n}", outcome=outcome, work_id=work_id, starts_generation=starts)


def test_a_batch_counts_each_outcome_and_each_generation_once() -> None:
    batch = [
        _result(1, Outcome.ADMITTED, "new", starts=True),
        _result(2, Outcome.ADMITTED, "new"),  # the same new generation: created once
        _result(3, Outcome.ADMITTED, "older"),
        _result(4, Outcome.ADMITTED, "older"),  # the same extended generation: extended once
        _result(5, Outcome.DUPLICATE_LEGACY),
        _result(6, Outcome.DUPLICATE_COVERED, "older"),
        _result(7, Outcome.DUPLICATE_COVERED, "new"),
        _result(8, Outcome.DUPLICATE_PRUNED, "gone"),
        _result(9, Outcome.EXPIRED),
        _result(10, Outcome.COVERAGE_MISSING),
        _result(11, Outcome.FENCED),
        _result(12, Outcome.REJECTED),
        _result(13, Outcome.REJECTED),
    ]
    before = _counts()
    record_ingest(batch)
    after = _counts()
    assert {name: after[name] - before[name] for name in SERIES} == {
        "admitted": 4,
        "created": 1,
        "extended": 1,
        "legacy": 1,
        "covered": 2,
        "pruned": 1,
        "expired": 1,
        "missing": 1,
        "fenced": 1,
        "rejected": 2,
    }
