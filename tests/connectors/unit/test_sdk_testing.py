"""The SDK's testing module: a fake clock and an in-memory WorkSource that a Worker runs against."""

from __future__ import annotations

import datetime as dt

import pytest

from nexuscrm_sdk.flows import Generation
from nexuscrm_sdk.testing import EPOCH, FakeClock, InMemoryWorkSource, LeaseNotHeld
from nexuscrm_sdk.worker import FLOW_MESSAGE_LOG_CHARS, Worker
from workqueue import ProjectionIdentity, WorkStatus
from workqueue.values import IngestItem, Outcome, Route

PACK = "pk-test"


def identity(lane: str = "lane-1", *, pack: str = PACK) -> ProjectionIdentity:
    return ProjectionIdentity(
        pack_install_id=pack,
        event_kind="contact.upsert",
        route_version="1",
        companion_version="crm-1.0",
        work_type="project",
        source_lane=lane,
    )


def run_all(worker: Worker) -> None:
    """Run the worker until nothing is claimable (bounded, so a broken source cannot hang the test)."""
    for _ in range(100):
        if not worker.run_once():
            return
    raise AssertionError("the source never ran dry")


def test_fake_clock_is_aware_and_only_moves_forward() -> None:
    clock = FakeClock()
    assert clock() == EPOCH and clock().tzinfo is dt.UTC
    assert clock.advance(dt.timedelta(seconds=5)) == EPOCH + dt.timedelta(seconds=5) == clock()
    with pytest.raises(ValueError):
        clock.advance(dt.timedelta(seconds=-1))
    with pytest.raises(ValueError):
        FakeClock(dt.datetime(2026, 1, 1))  # naive


def test_consecutive_inputs_join_one_generation_until_it_is_claimed() -> None:
    source = InMemoryWorkSource()
    first = source.add_inputs(identity(), payloads=[b"a", b"b"])
    again = source.add_inputs(identity(), payloads=[b"c"])
    other = source.add_inputs(identity("lane-2"), payloads=[b"x"])
    assert [r.enqueue_ordinal for r in [*first, *again, *other]] == [1, 2, 3, 4]
    assert {r.work_id for r in [*first, *again]} == {first[0].work_id}  # unclaimed attempt zero absorbs
    assert [r.starts_generation for r in [*first, *again]] == [True, False, False]
    assert other[0].work_id != first[0].work_id

    (claim,) = source.claim("w", work_types=["project"])
    assert claim.work.work_id == first[0].work_id and claim.work.status is WorkStatus.PROCESSING
    later = source.add_inputs(identity(), payloads=[b"d"])[0]
    assert later.work_id != claim.work.work_id and later.starts_generation
    assert source.get_work(later.work_id).work.status is WorkStatus.BLOCKED  # behind the running one
    pages = list(source.load_inputs(claim.work.work_id, lease_token=claim.lease_token, page_size=2))
    assert [[i.payload for i in p.inputs] for p in pages] == [[b"a", b"b"], [b"c"]]
    assert [p.last for p in pages] == [False, True] and pages[0].member_count == 3
    source.complete(claim.work.work_id, lease_token=claim.lease_token)
    assert source.get_work(later.work_id).work.status is WorkStatus.PENDING  # unblocked
    assert source.get_work(later.work_id).member_count == 1


def test_a_worker_runs_a_flow_over_complete_ordered_sets_and_the_outcomes_are_recorded() -> None:
    source = InMemoryWorkSource()
    source.add_inputs(identity(), payloads=[b"a", b"b", b"c"])
    source.add_inputs(identity("lane-2"), payloads=[b"x"])
    seen: dict[str, list[bytes]] = {}

    def flow(generation: Generation) -> None:
        assert generation.work.created_at.tzinfo is dt.UTC
        assert generation.identity.key == generation.work.projection_key  # decoded for the Flow
        assert generation.route == Route.of(generation.identity)
        seen[generation.route.source_lane] = [row.payload for row in generation.inputs]

    run_all(Worker(source, flow, worker_id="w", batch_size=2))
    assert seen == {"lane-1": [b"a", b"b", b"c"], "lane-2": [b"x"]}
    assert [(a.ordinals, a.attempt, a.outcome) for a in source.attempts] == [
        ((1, 2, 3), 0, WorkStatus.COMPLETED),
        ((4,), 0, WorkStatus.COMPLETED),
    ]
    assert all(w.status is WorkStatus.COMPLETED for w in source.generations())


def test_a_failing_flow_is_retried_until_its_attempts_run_out_then_its_successor_runs() -> None:
    source = InMemoryWorkSource(max_attempts=3)
    source.add_inputs(identity(), payloads=[b"poison"])
    source.claim("someone", max_items=1)  # hold it so the next input forms a successor
    held = source.generations()[0]
    source.fail(held.work_id, lease_token=held.lease_token or "", error="first try")
    source.add_inputs(identity(), payloads=[b"fine"])

    def flow(generation: Generation) -> None:
        for row in generation.inputs:
            if row.payload == b"poison":
                raise ValueError("cannot project poison")

    run_all(Worker(source, flow, worker_id="w"))
    assert [(a.ordinals, a.attempt, a.outcome) for a in source.attempts] == [
        ((1,), 0, WorkStatus.RETRY),
        ((1,), 1, WorkStatus.RETRY),
        ((1,), 2, WorkStatus.FAILED),
        ((2,), 0, WorkStatus.COMPLETED),
    ]
    assert source.attempts[1].error == "ValueError: cannot project poison"
    failed = source.generations()[0]
    assert failed.status is WorkStatus.FAILED and failed.attempt == 3 and failed.finished_at is not None


def test_a_flow_that_stops_reading_early_fails_its_attempt() -> None:
    source = InMemoryWorkSource(max_attempts=1)
    source.add_inputs(identity(), payloads=[b"a", b"b"])

    def first_only(generation: Generation) -> None:
        next(generation.inputs)

    run_all(Worker(source, first_only, worker_id="w"))
    (attempt,) = source.attempts
    assert attempt.outcome is WorkStatus.FAILED and "IncompleteConsumption" in (attempt.error or "")


def test_retries_wait_for_their_backoff_on_the_fake_clock() -> None:
    clock = FakeClock()
    source = InMemoryWorkSource(clock=clock, backoff=dt.timedelta(seconds=10))
    source.add_inputs(identity(), payloads=[b"a"])
    (claim,) = source.claim("w")
    retry = source.fail(claim.work.work_id, lease_token=claim.lease_token, error="boom")
    assert retry.status is WorkStatus.RETRY and retry.claimable_at == EPOCH + dt.timedelta(seconds=10)
    assert source.claim("w") == []
    clock.advance(dt.timedelta(seconds=10))
    (again,) = source.claim("w")
    assert again.work.attempt == 1


def test_leases_need_the_current_token_and_heartbeats_move_the_expiry() -> None:
    clock = FakeClock()
    source = InMemoryWorkSource(clock=clock)
    source.add_inputs(identity(), payloads=[b"a"])
    (claim,) = source.claim("w", lease=dt.timedelta(seconds=20))
    assert claim.work.lease_expires_at == EPOCH + dt.timedelta(seconds=20)
    clock.advance(dt.timedelta(seconds=15))
    expires = source.heartbeat(claim.work.work_id, lease_token=claim.lease_token, lease=dt.timedelta(seconds=20))
    assert expires == EPOCH + dt.timedelta(seconds=35) and expires.tzinfo is dt.UTC
    for call in (
        lambda: source.complete(claim.work.work_id, lease_token="stale"),
        lambda: source.heartbeat(claim.work.work_id, lease_token="stale"),
        lambda: source.load_inputs(claim.work.work_id, lease_token="stale"),
    ):
        with pytest.raises(LeaseNotHeld):
            call()
    source.complete(claim.work.work_id, lease_token=claim.lease_token)
    with pytest.raises(LeaseNotHeld):  # finished: the token is spent
        source.fail(claim.work.work_id, lease_token=claim.lease_token, error="late")


def test_claims_filter_by_pack_and_work_type_and_respect_max_items() -> None:
    source = InMemoryWorkSource()
    for lane in ("a", "b", "c"):
        source.add_inputs(identity(lane), payloads=[b"1"])
    source.add_inputs(identity(pack="pk-other"), payloads=[b"1"])
    assert source.claim("w", work_types=["other-type"]) == []
    assert len(source.claim("w", pack_install_ids=[PACK], max_items=2)) == 2
    assert [c.work.pack_install_id for c in source.claim("w", max_items=5)] == [PACK, "pk-other"]


def test_what_it_does_not_model_is_refused_loudly() -> None:
    source = InMemoryWorkSource()
    item = IngestItem(receipt_key="k", route=Route.of(identity()), payload=b"a")
    assert source.ingest(PACK, items=[item])[0].outcome is Outcome.ADMITTED
    with pytest.raises(ValueError, match="duplicates are not modelled"):
        source.ingest(PACK, items=[item])
    route = Route.of(identity())
    bad = IngestItem(receipt_key="bad", route=Route(**{**route.__dict__, "source_lane": " lane"}), payload=b"a")
    assert source.ingest(PACK, items=[bad])[0].outcome is Outcome.REJECTED


def test_a_failed_attempt_logs_the_start_of_the_flows_message_on_one_line(caplog: pytest.LogCaptureFixture) -> None:
    source = InMemoryWorkSource(max_attempts=1)
    source.add_inputs(identity(), payloads=[b"x"])
    message = "first line\nsecond \x1b[31m" + "y" * 500

    def flow(generation: Generation) -> None:
        list(generation.inputs)
        raise ValueError(message)

    with caplog.at_level("WARNING", logger="nexuscrm_sdk.worker"):
        run_all(Worker(source, flow, worker_id="w"))
    [line] = [r.getMessage() for r in caplog.records if "failed with" in r.getMessage()]
    logged = line.split("failed with ", 1)[1].removesuffix(" (the whole message: GetWork)")
    assert logged.startswith("ValueError: first line second \\x1b[31myyy") and logged.endswith("y…")
    assert len(logged) == FLOW_MESSAGE_LOG_CHARS and "\n" not in line
    assert source.attempts[0].error == f"ValueError: {message}"  # LastError keeps the whole message
