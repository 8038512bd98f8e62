"""The dashboard's reads, the per-pack gauges and the Connectors counters, on every backend.

A scripted history through the Connectors facade (two batches, so one generation is
extended; a claim that retries, one that completes, a duplicate, a fenced delivery) must
come out of ``packs_overview``, ``pack_timeline``, ``search`` and ``QueueCollector`` exactly
as the database holds it.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from prometheus_client import REGISTRY

from nexuscrm_connectors.service import Connectors
from nexuscrm_controlplane import fences
from nexuscrm_controlplane.dashboard import overview
from nexuscrm_controlplane.dashboard.collector import QueueCollector
from nexuscrm_schema.tables import WorkItem
from tests.support.factories import FakeClock, delivery, install_pack
from workqueue import decode_projection_key
from workqueue.errors import InvalidArgument
from workqueue.values import Outcome

pytestmark = pytest.mark.database

COUNTERS: tuple[tuple[str, dict[str, str]], ...] = (
    ("nexuscrm_inputs_admitted_total", {}),
    ("nexuscrm_generations_created_total", {"origin": "admission"}),
    ("nexuscrm_generations_extended_total", {}),
    ("nexuscrm_duplicates_total", {"kind": "covered"}),
    ("nexuscrm_receipts_fenced_total", {}),
    ("nexuscrm_claims_total", {}),
    ("nexuscrm_retries_total", {"attempt": "1"}),
    ("nexuscrm_completions_total", {}),
    ("nexuscrm_generation_inputs_count", {}),
)


def lane_of(projection_key: str) -> str:
    return decode_projection_key(projection_key).source_lane


def counters() -> dict[str, float]:
    return {name: REGISTRY.get_sample_value(name, labels) or 0.0 for name, labels in COUNTERS}


def test_overview_timeline_search_and_gauges_show_the_database(engine: sa.Engine) -> None:
    clock = FakeClock()
    pack = install_pack(engine)
    connectors = Connectors(engine, clock=clock)
    before = counters()

    first = connectors.ingest(
        pack, items=[delivery(lane="a"), delivery(lane="a"), delivery(lane="b"), delivery(lane="c")]
    )
    clock.advance(5)
    second = connectors.ingest(pack, items=[delivery(lane="a"), delivery(lane="b")])
    assert {r.outcome for r in first + second} == {Outcome.ADMITTED}
    claims = {lane_of(c.work.projection_key): c for c in connectors.claim("w", pack_install_ids=[pack], max_items=3)}
    assert sorted(claims) == ["a", "b", "c"]
    list(connectors.load_inputs(claims["a"].work.work_id, lease_token=claims["a"].lease_token))
    connectors.fail(claims["a"].work.work_id, lease_token=claims["a"].lease_token, error="boom")
    connectors.complete(
        claims["c"].work.work_id, lease_token=claims["c"].lease_token
    )  # b keeps its lease, which expires
    assert (
        connectors.ingest(pack, items=[delivery(first[3].receipt_key, lane="c")])[0].outcome
        is Outcome.DUPLICATE_COVERED
    )
    waiting = connectors.ingest(pack, items=[delivery(lane="d")])[0]
    fence = fences.arm_fence(engine, "acme", pack, reason="maintenance", clock=clock)
    assert connectors.ingest(pack, items=[delivery(lane="e")])[0].outcome is Outcome.FENCED
    clock.advance(60)

    after = counters()
    delta = {name: after[name] - before[name] for name in after}
    assert delta == {
        "nexuscrm_inputs_admitted_total": 7,
        "nexuscrm_generations_created_total": 4,  # a, b, c, d
        "nexuscrm_generations_extended_total": 2,  # a and b by the second batch
        "nexuscrm_duplicates_total": 1,
        "nexuscrm_receipts_fenced_total": 1,
        "nexuscrm_claims_total": 3,
        "nexuscrm_retries_total": 1,
        "nexuscrm_completions_total": 1,
        "nexuscrm_generation_inputs_count": 1,
    }

    with engine.connect() as connection:
        statuses: dict[str, int] = dict(
            connection.execute(
                sa.select(WorkItem.c.Status, sa.func.count())
                .where(WorkItem.c.PackInstallId == pack)
                .group_by(WorkItem.c.Status)
            ).all()
        )
    old_protocol = install_pack(engine, legacy_max_ordinal=None)
    cards = {c["pack_install_id"]: c for c in overview.packs_overview(engine, clock)["packs"]}
    assert cards[old_protocol]["protocol"]["state"] == "none" and cards[old_protocol]["drain"]["drained"]
    card = cards[pack]
    queue = card["queue"]
    assert queue["depth"] == {s: statuses.get(s, 0) for s in overview.QUEUE_STATES}
    assert queue["depth"] == {"pending": 1, "blocked": 0, "processing": 1, "retry": 1}
    assert queue["receipts_waiting"] == 1 and queue["receipts_coverage_missing"] == 0 and queue["failed"] == 0
    assert queue["oldest_unclaimed_work_id"] == waiting.work_id and queue["oldest_unclaimed_age_seconds"] == 60
    assert queue["end_to_end_lag_seconds"] == 65 and queue["oldest_open_ordinal"] == 1  # lane a's first input
    assert queue["leases_expired"] == 1  # lane b's
    assert card["protocol"]["state"] == "greenfield" and card["drain"] is None  # only before the protocol row
    assert [(f["fence_id"], f["holds_pack"], f["reason"]) for f in card["fences"]] == [
        (fence.fence_id, True, "maintenance")
    ]

    timeline = overview.pack_timeline(engine, pack)
    ranges = {
        i["label"].split(" · ")[0]: [(g["start"], g["end"], g["status"]) for g in i["generations"]]
        for i in timeline["identities"]
    }
    assert ranges == {
        "a": [(1, 5, "retry")],
        "b": [(3, 6, "processing")],
        "c": [(4, 4, "completed")],
        "d": [(7, 7, "pending")],
    }
    assert timeline["next"] == ""

    [work] = overview.search(engine, claims["a"].work.work_id)
    assert work["kind"] == "work" and work["range"] == [1, 5] and work["members"] == 3 and work["status"] == "retry"
    [receipt] = overview.search(engine, first[1].receipt_key)
    assert receipt["kind"] == "receipt" and receipt["covered_by"]["work_id"] == claims["a"].work.work_id
    assert "input 2 is a member of" in receipt["explanation"]
    assert overview.search(engine, "nothing-like-this") == []
    with pytest.raises(InvalidArgument):
        overview.search(engine, " ")
    assert [r["receipt_key"] for r in overview.receipts(engine, "stored", pack)] == [
        r.receipt_key for r in connectors.list_receipts("stored", pack)[0]
    ]

    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in QueueCollector(engine, clock).collect()
        for s in family.samples
        if s.labels.get("pack") == pack
    }
    for state in overview.QUEUE_STATES:
        assert samples[("nexuscrm_queue_depth", (("pack", pack), ("state", state)))] == statuses.get(state, 0)
    assert samples[("nexuscrm_oldest_unclaimed_generation_age_seconds", (("pack", pack),))] == 60
    assert samples[("nexuscrm_leases_expired", (("pack", pack),))] == 1
    assert samples[("nexuscrm_receipts", (("pack", pack), ("state", "stored")))] == 1
