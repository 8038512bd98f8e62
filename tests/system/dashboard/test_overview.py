"""The dashboard's reads, the per-pack gauges and the Connectors counters, on every backend.

A scripted history through the Connectors facade (two batches, so one generation is
extended; a claim that retries, one that completes, a duplicate, a fenced delivery) must
come out of ``packs_overview``, ``pack_timeline``, ``search`` and ``QueueCollector`` exactly
as the database holds it. ``search`` and ``receipts`` ask a real ConnectorsService over gRPC
(``conftest``); with Connectors unreachable they answer 503 and the rest of the page 200.
The operating panels (``operations``: claim pauses and order policy, dead letters, coverage)
show a paused pack, a dead letter and an identity that is not tiled, as Connectors answers.
"""

from __future__ import annotations

import datetime as dt
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from prometheus_client import REGISTRY

from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.operating.claim_pauses import PauseScope, scope_of
from nexuscrm_connectors.operating.order_policy import Policy
from nexuscrm_controlplane import fences
from nexuscrm_controlplane.dashboard import operations, overview
from nexuscrm_controlplane.dashboard.app import create_app
from nexuscrm_controlplane.dashboard.collector import QueueCollector
from nexuscrm_controlplane.dashboard.connectors import ConnectorsReads
from nexuscrm_controlplane.dashboard.server import DashboardServer
from nexuscrm_controlplane.dashboard.workers import integration_hosts
from nexuscrm_schema.tables import Event, WorkItem
from tests.support.factories import FakeClock, delivery, install_pack, route
from tests.support.invariants import assert_invariants
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


def stored_times(engine: sa.Engine, pack: str, work_id: str) -> tuple[dt.datetime, dt.datetime]:
    """The ClaimableAt of ``work_id`` and the CreatedAt of the pack's first input."""
    with engine.connect() as connection:
        claimable = connection.execute(sa.select(WorkItem.c.ClaimableAt).where(WorkItem.c.WorkId == work_id))
        created = connection.execute(
            sa.select(Event.c.CreatedAt).where(Event.c.PackInstallId == pack, Event.c.EnqueueOrdinal == 1)
        )
        return claimable.scalar_one(), created.scalar_one()


def test_overview_timeline_search_and_gauges_show_the_database(engine: sa.Engine, connectors: ConnectorsReads) -> None:
    clock = FakeClock()
    pack = install_pack(engine)
    facade = Connectors(engine, clock=clock)
    before = counters()

    first = facade.ingest(pack, items=[delivery(lane="a"), delivery(lane="a"), delivery(lane="b"), delivery(lane="c")])
    clock.advance(5)
    second = facade.ingest(pack, items=[delivery(lane="a"), delivery(lane="b")])
    assert {r.outcome for r in first + second} == {Outcome.ADMITTED}
    claims = {lane_of(c.work.projection_key): c for c in facade.claim("w", pack_install_ids=[pack], max_items=3)}
    assert sorted(claims) == ["a", "b", "c"]
    list(facade.load_inputs(claims["a"].work.work_id, lease_token=claims["a"].lease_token))
    facade.fail(claims["a"].work.work_id, lease_token=claims["a"].lease_token, error="boom")
    facade.complete(claims["c"].work.work_id, lease_token=claims["c"].lease_token)  # b keeps its lease, which expires
    assert facade.ingest(pack, items=[delivery(first[3].receipt_key, lane="c")])[0].outcome is Outcome.DUPLICATE_COVERED
    waiting = facade.ingest(pack, items=[delivery(lane="d")])[0]
    fence = fences.arm_fence(engine, "acme", pack, reason="maintenance", clock=clock)
    assert facade.ingest(pack, items=[delivery(lane="e")])[0].outcome is Outcome.FENCED
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
    view = overview.packs_overview(engine, clock)
    cards = {c["pack_install_id"]: c for c in view["packs"]}
    assert cards[old_protocol]["protocol"]["state"] == "none" and cards[old_protocol]["drain"]["drained"]
    card = cards[pack]
    queue = card["queue"]
    assert queue["depth"] == {s: statuses.get(s, 0) for s in overview.QUEUE_STATES}
    assert queue["depth"] == {"pending": 1, "blocked": 0, "processing": 1, "retry": 1}
    assert queue["receipts_waiting"] == 1 and queue["receipts_coverage_missing"] == 0 and queue["failed"] == 0
    # Ages on the database's clock, which the test moved 60 s (and 5 s before that) past the rows' times;
    # the page prints that clock's now cut to the millisecond (decision 179).
    now = dt.datetime.fromisoformat(view["now"].removesuffix("Z"))
    waiting_since, first_input = stored_times(engine, pack, str(waiting.work_id))
    assert queue["oldest_unclaimed_work_id"] == waiting.work_id
    age, lag = queue["oldest_unclaimed_age_seconds"], queue["end_to_end_lag_seconds"]
    assert 0 <= age - (now - waiting_since).total_seconds() < 0.001 and age >= 60
    assert 0 <= lag - (now - first_input).total_seconds() < 0.001 and lag >= 65
    assert queue["oldest_open_ordinal"] == 1  # lane a's first input
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

    [work] = overview.search(engine, connectors, claims["a"].work.work_id)
    assert work["kind"] == "work" and work["range"] == [1, 5] and work["members"] == 3 and work["status"] == "retry"
    assert [(a["attempt"], a["outcome"], a["worker_id"], a["error"]) for a in work["attempts"]] == [
        (1, "retry", "w", "boom")
    ]  # its attempt history, shown to operators as LastError is (decision 175)
    [receipt] = overview.search(engine, connectors, first[1].receipt_key)
    assert receipt["kind"] == "receipt" and receipt["covered_by"]["work_id"] == claims["a"].work.work_id
    assert "input 2 is a member of" in receipt["explanation"]
    nothing = {"kind": "none", "explanation": "no WorkId or receipt key 'nothing-like-this' in the listed packs"}
    assert overview.search(engine, connectors, "nothing-like-this") == [nothing]
    with pytest.raises(InvalidArgument):
        overview.search(engine, connectors, " ")
    assert [r["receipt_key"] for r in overview.receipts(connectors, "stored", pack)] == [
        r.receipt_key for r in facade.list_receipts("stored", pack_install_id=pack)[0]
    ]
    assert [r["kind"] for r in overview.search(engine, connectors, "k" * overview.SEARCH_MAX_LENGTH)] == ["none"]
    with pytest.raises(InvalidArgument, match="state must be one of"):
        overview.receipts(connectors, "nonsense")

    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in QueueCollector(engine, clock).collect()
        for s in family.samples
        if s.labels.get("pack") == pack
    }
    for state in overview.QUEUE_STATES:
        assert samples[("nexuscrm_queue_depth", (("pack", pack), ("state", state)))] == statuses.get(state, 0)
    # Read later on the same database clock: at least the age the page showed.
    assert (
        samples[("nexuscrm_oldest_unclaimed_generation_age_seconds", (("pack", pack),))]
        >= (queue["oldest_unclaimed_age_seconds"])
    )
    assert samples[("nexuscrm_leases_expired", (("pack", pack),))] == 1
    assert samples[("nexuscrm_receipts", (("pack", pack), ("state", "stored")))] == 1
    assert_invariants(engine)


def stranded_shown(engine: sa.Engine, pack: str) -> tuple[int, float | None]:
    """The pack card's "stranded now" and the collector's gauge for the pack."""
    [card] = [c for c in overview.packs_overview(engine, FakeClock())["packs"] if c["pack_install_id"] == pack]
    gauge = [
        s.value
        for family in QueueCollector(engine).collect()
        for s in family.samples
        if s.name == "nexuscrm_generations_stranded" and s.labels == {"pack": pack}
    ]
    return card["queue"]["stranded"], gauge[0] if gauge else None


def test_stranded_generations_show_on_the_card_and_gauge_until_the_sweep_heals_them(engine: sa.Engine) -> None:
    """Issue 14 item 3: a successor blocked behind a terminal predecessor is "stranded now" until healed.

    The write skew of a multi-primary engine (decision 106) is played by hand: the predecessor
    is made terminal by a statement that does not unblock its successor.
    """
    pack = install_pack(engine)
    facade = Connectors(engine)
    facade.ingest(pack, items=[delivery(lane="a"), delivery(lane="b")])
    claims = {lane_of(c.work.projection_key): c for c in facade.claim("w", pack_install_ids=[pack], max_items=2)}
    facade.ingest(pack, items=[delivery(lane="a"), delivery(lane="b")])  # two successors, blocked
    assert stranded_shown(engine, pack) == (0, 0)  # blocked behind running work is not stranded
    with engine.begin() as connection:
        connection.execute(
            sa.update(WorkItem)
            .where(WorkItem.c.WorkId == claims["a"].work.work_id)
            .values(Status="completed", FinishedAt=WorkItem.c.LeaseExpiresAt)
        )
    assert stranded_shown(engine, pack) == (1, 1)
    facade.complete(claims["b"].work.work_id, lease_token=claims["b"].lease_token)  # unblocks its successor itself
    assert stranded_shown(engine, pack) == (1, 1)
    assert facade.heal_stranded() == 1
    assert stranded_shown(engine, pack) == (0, 0)
    assert_invariants(engine)


def _get(port: int, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.fixture
def dashboard_without_connectors(
    engine: sa.Engine, unreachable_connectors: ConnectorsReads, unreachable_target: str
) -> Iterator[int]:
    """The dashboard app served on a free port, its Connectors and Integration targets unreachable; yields the port."""
    with integration_hosts([unreachable_target], None) as workers:
        server = DashboardServer(create_app(engine, connectors=unreachable_connectors, workers=workers), "127.0.0.1:0")
        server.start()
        yield server.port
        server.stop()


def test_without_connectors_or_integration_search_and_receipts_answer_503_and_the_rest_200(
    engine: sa.Engine, dashboard_without_connectors: int
) -> None:
    pack = install_pack(engine)
    facade = Connectors(engine)
    admitted, _ = facade.ingest(pack, items=[delivery(lane="a"), delivery(lane="b")])
    [claim] = facade.claim("w", pack_install_ids=[pack])
    facade.fail(claim.work.work_id, lease_token=claim.lease_token, error="boom", retryable=False)  # a dead letter
    port = dashboard_without_connectors

    status, body = _get(port, "/api/overview")
    assert status == 200
    [card] = [c for c in body["packs"] if c["pack_install_id"] == pack]
    assert card["queue"]["depth"]["pending"] == 1
    assert _get(port, f"/api/packs/{pack}/timeline")[0] == 200
    for path in (
        f"/api/search?q={admitted.work_id}",
        "/api/receipts?state=stored",
        f"/api/receipts?state=stored&pack={pack}",
        "/api/claim-pauses",
        "/api/dead-letters",
        f"/api/dead-letters?pack={pack}",
        f"/api/packs/{pack}/coverage",
        "/api/flow-versions",
    ):
        status, body = _get(port, path)
        assert status == 503, (path, body)
        assert str(body["error"]).startswith("Connectors unavailable"), (path, body)
    assert _get(port, "/api/search?q=%20")[0] == 400  # checked before asking Connectors
    status, body = _get(port, "/api/workers")  # a host that does not answer is marked, the page answers
    assert status == 200 and [h["state"] for h in body["hosts"]] == ["unreachable"], body
    assert_invariants(engine)


def test_search_explains_a_pruned_generation_and_a_pruned_receipt(
    engine: sa.Engine, connectors: ConnectorsReads
) -> None:
    facade = Connectors(engine, clock=FakeClock())
    pack = install_pack(engine)
    pruned_work, pruned_key = "", ""
    for _ in range(2):
        [result] = facade.ingest(pack, items=[delivery(lane="a")])
        [claim] = facade.claim("w", pack_install_ids=[pack])
        facade.complete(claim.work.work_id, lease_token=claim.lease_token)
        pruned_work, pruned_key = pruned_work or claim.work.work_id, pruned_key or result.receipt_key
    facade.set_retention_policy(pack, keep_generations=1, keep_seconds=None)
    assert facade.prune(pack).generations == 1

    [work] = overview.search(engine, connectors, pruned_work)
    assert work == {"kind": "pruned", "work_id": pruned_work, "explanation": work["explanation"]}
    assert work["explanation"].startswith(f"work {pruned_work} was pruned at ")
    [receipt] = overview.search(engine, connectors, pruned_key)
    assert receipt["receipt_state"] == "pruned" and receipt["enqueue_ordinal"] == 1
    assert receipt["explanation"].startswith("pruned at ") and receipt["covered_by"] is None
    assert_invariants(engine)


def _pack_entry(answer: dict[str, Any], pack: str) -> dict[str, Any]:
    entries: list[dict[str, Any]] = [p for p in answer["packs"] if p["pack_install_id"] == pack]
    [entry] = entries
    return entry


def test_operating_panels_show_pauses_dead_letters_and_coverage(
    engine: sa.Engine, connectors: ConnectorsReads, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37's dashboard part: a paused pack and identity, a dead letter, an identity with a gap."""
    facade = Connectors(engine)
    pack, quiet, old_protocol = (
        install_pack(engine),
        install_pack(engine),
        install_pack(engine, legacy_max_ordinal=None),
    )
    facade.ingest(pack, items=[delivery(lane=lane) for lane in "abcd"])
    claims = {lane_of(c.work.projection_key): c for c in facade.claim("w", pack_install_ids=[pack], max_items=4)}
    for lane, claim in claims.items():
        if lane == "a":
            facade.fail(
                claim.work.work_id, lease_token=claim.lease_token, error="contact <b>rejected</b>", retryable=False
            )
        else:
            facade.complete(claim.work.work_id, lease_token=claim.lease_token)
    dead, lost = claims["a"].work, claims["b"].work
    facade.ingest(pack, items=[delivery(lane="c")])  # queued behind nothing
    with engine.begin() as connection:  # b's generation is lost: its input is in no range
        connection.execute(sa.delete(WorkItem).where(WorkItem.c.WorkId == lost.work_id))
    expires = dt.datetime.now(dt.UTC).replace(tzinfo=None) + dt.timedelta(hours=1)
    facade.pause_claims(scope_of(pack, PauseScope.PACK, None, ""), paused_by="ops", reason="CRM maintenance")
    facade.pause_claims(
        scope_of(pack, PauseScope.IDENTITY, route("c"), ""), paused_by="ana", reason="bad data", expires_at=expires
    )
    facade.set_order_policy(pack, Policy.BLOCK, set_by="ops", reason="keep per-contact order")
    facade.set_order_policy(pack, Policy.CONTINUE, set_by="ana", reason="projects may run on", work_type="project")
    facade.set_retention_policy(pack, keep_generations=1, keep_seconds=None)  # lane c's completed one may go

    pauses = operations.claim_pauses(engine, connectors)
    paused = _pack_entry(pauses, pack)
    by_scope = {p["scope"]: p for p in paused["pauses"]}
    assert sorted(by_scope) == ["identity", "pack"]
    assert [(p["paused_by"], p["reason"]) for p in (by_scope["pack"], by_scope["identity"])] == [
        ("ops", "CRM maintenance"),
        ("ana", "bad data"),
    ]
    assert by_scope["identity"]["identity"]["label"] == "c · project · contact.upsert"
    assert by_scope["identity"]["expires_at"] is not None and by_scope["pack"]["expires_at"] is None
    assert by_scope["pack"]["paused_at"].endswith("Z") and by_scope["pack"]["identity"] is None
    policy = paused["order_policy"]
    assert (policy["policy"], policy["default"], policy["set_by"], policy["reason"]) == (
        "block",
        False,
        "ops",
        "keep per-contact order",
    )
    (own,) = policy["work_types"].items()  # the work type's own policy overrides the pack's (decision 165)
    assert (own[0], own[1]["policy"], own[1]["set_by"], own[1]["default"]) == ("project", "continue", "ana", False)
    retention = paused["retention"]  # the pruner has not run: its backlog (decision 181)
    assert (retention["keep_generations"], retention["backlog_generations"]) == (1, 1)
    assert retention["backlog_oldest_finished_at"].endswith("Z")
    unpaused = _pack_entry(pauses, quiet)
    assert unpaused["retention"] is None  # no policy
    assert unpaused["order_policy"]["work_types"] == {}
    assert unpaused["pauses"] == [] and unpaused["order_policy"]["policy"] == "continue"
    assert unpaused["order_policy"]["default"] and unpaused["order_policy"]["set_at"] is None

    letters = operations.dead_letters(engine, connectors)
    assert [p["pack_install_id"] for p in letters["packs"]] == [pack]  # the others have no failed work
    assert letters["replay_command"].startswith("nexuscrm dead-letters replay")
    [entry] = letters["packs"]
    assert (entry["total"], entry["complete"], entry["more"]) == (1, True, False)
    assert [(i["identity"]["label"], i["dead_letters"]) for i in entry["identities"]] == [
        ("a · project · contact.upsert", 1)
    ]
    [letter] = entry["dead_letters"]
    assert letter["work_id"] == dead.work_id and letter["range"] == [dead.input_start_ordinal, dead.lane_ordinal]
    assert letter["last_error"] == "contact <b>rejected</b>" and letter["finished_at"].endswith("Z")
    assert letter["identity"]["projection_key"] == dead.projection_key
    assert operations.dead_letters(engine, connectors, pack) == letters
    assert operations.dead_letters(engine, connectors, quiet)["packs"] == []
    with pytest.raises(InvalidArgument, match="not one of the listed packs"):
        operations.dead_letters(engine, connectors, "pk-000000000000")

    proof = operations.coverage(connectors, pack)
    assert proof["provable"] and proof["next"] == "" and proof["not_tiled"] == 1
    labels = [i["identity"]["label"].split(" · ")[0] for i in proof["identities"]]
    assert labels == ["b", "a", "c", "d"]  # not tiled first, then by projection key
    b, a, c, d = proof["identities"]
    assert not b["tiled"] and b["exception_count"] == 1
    assert b["exceptions"] == [{"kind": "gap", "start": lost.lane_ordinal, "end": lost.lane_ordinal, "work_ids": []}]
    assert a["tiled"] and a["ranges"]["failed"] == 1 and a["high_water_ordinal"] == dead.lane_ordinal
    assert c["ranges"] == {**dict.fromkeys(operations.RANGE_STATES, 0), "completed": 1, "queued": 1}
    assert d["tiled"] and d["ranges"]["completed"] == 1 and d["exceptions"] == []

    monkeypatch.setattr(operations, "COVERAGE_PAGE", 3)
    first = operations.coverage(connectors, pack)
    assert len(first["identities"]) == 3 and first["next"]
    second = operations.coverage(connectors, pack, first["next"])
    assert [i["identity"]["label"][0] for i in second["identities"]] == ["d"] and second["next"] == ""
    with pytest.raises(InvalidArgument, match="page_token"):
        operations.coverage(connectors, pack, "not-a-token")
    with pytest.raises(InvalidArgument, match="not installed"):
        operations.coverage(connectors, "pk-000000000000")
    unprovable = operations.coverage(connectors, old_protocol)
    assert not unprovable["provable"] and "protocol" in unprovable["explanation"]
    assert_invariants(engine, damaged=[(pack, lost.lane_ordinal)])
