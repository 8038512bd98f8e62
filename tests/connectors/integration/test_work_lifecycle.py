"""Lifecycle of generations on every backend: leases, completion races, stale snapshots, replay fences."""

from __future__ import annotations

import datetime as dt
import threading
import uuid

import pytest
import sqlalchemy as sa
from prometheus_client import REGISTRY

from nexuscrm_connectors.errors import LeaseLost, ReplayRefused, WorkNotFound
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.queries import claims as claims_sql
from nexuscrm_connectors.queries import work_items as work_items_sql
from nexuscrm_connectors.queue import claims
from nexuscrm_schema.tables import Event, WorkItem
from tests.support.checksums import database_digest
from tests.support.factories import FakeClock, delivery, install_pack
from tests.support.invariants import assert_invariants
from workqueue import EventStatus, WorkStatus
from workqueue.errors import InvalidArgument
from workqueue.values import Outcome

pytestmark = pytest.mark.database


def test_duplicates_never_change_stored_rows(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery("a"), delivery("b", lane="other")])
    claim = connectors.claim("w", pack_install_ids=[pack])[0]
    with engine.connect() as connection:
        before = database_digest(connection)
    results = connectors.ingest(pack, items=[delivery("a"), delivery("b", lane="other"), delivery("a", payload=b"x")])
    assert [r.outcome for r in results] == [Outcome.DUPLICATE_COVERED, Outcome.DUPLICATE_COVERED, Outcome.REJECTED]
    with engine.connect() as connection:
        assert database_digest(connection) == before
    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    assert_invariants(engine)


def test_expired_lease_transfers_ownership_and_refuses_the_old_holder(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(), delivery()])
    first = connectors.claim("w1", pack_install_ids=[pack], lease=dt.timedelta(seconds=10))[0]
    assert connectors.claim("w2", pack_install_ids=[pack]) == []  # lease still held
    clock.advance(11)
    with pytest.raises(LeaseLost, match="expired"):
        connectors.heartbeat(first.work.work_id, lease_token=first.lease_token)
    second = connectors.claim("w2", pack_install_ids=[pack], lease=dt.timedelta(seconds=10))[0]
    assert second.work.work_id == first.work.work_id
    assert second.work.attempt == 1  # the expired lease counted as a failed attempt
    assert (second.work.input_start_ordinal, second.work.lane_ordinal) == (1, 2)
    for call in (
        lambda: connectors.complete(first.work.work_id, lease_token=first.lease_token),
        lambda: connectors.fail(first.work.work_id, lease_token=first.lease_token, error="late"),
        lambda: list(connectors.load_inputs(first.work.work_id, lease_token=first.lease_token)),
    ):
        with pytest.raises(LeaseLost, match="stale"):
            call()
    done = connectors.complete(second.work.work_id, lease_token=second.lease_token)
    assert done.status is WorkStatus.COMPLETED and done.lease_owner == "w2"
    assert_invariants(engine)


def expired_lease_counts() -> tuple[float, float]:
    """Expired leases counted so far: reclaimed for a new attempt, and failed on the last attempt."""
    return (
        REGISTRY.get_sample_value("nexuscrm_leases_reclaimed_total") or 0.0,
        REGISTRY.get_sample_value("nexuscrm_failures_total", {"reason": "lease_expired"}) or 0.0,
    )


def test_lease_expiry_on_the_last_attempt_fails_the_generation(engine: sa.Engine, clock: FakeClock) -> None:
    connectors = Connectors(engine, clock=clock)
    pack = install_pack(engine)
    reclaimed, expired_failed = expired_lease_counts()
    connectors.ingest(pack, items=[delivery()])
    successor_input = None
    for attempt in range(connectors.settings.max_attempts):
        claim = connectors.claim("w", pack_install_ids=[pack], lease=dt.timedelta(seconds=5))
        assert len(claim) == 1 and claim[0].work.attempt == attempt
        if successor_input is None:
            successor_input = connectors.ingest(pack, items=[delivery()])[0]
        clock.advance(6)
    assert (
        connectors.claim("w", pack_install_ids=[pack], lease=dt.timedelta(seconds=5))[0].work.work_id
        == successor_input.work_id
    )
    failed = connectors.get_work(claim[0].work.work_id).work
    assert failed.status is WorkStatus.FAILED and "lease expired" in (failed.last_error or "")
    # Every claim after the first took over an expired lease; the last expiry failed the generation.
    max_attempts = connectors.settings.max_attempts
    assert expired_lease_counts() == (reclaimed + max_attempts - 1, expired_failed + 1)
    assert_invariants(engine)


def test_concurrent_completion_exactly_one_wins(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery()])
    claim = connectors.claim("w", pack_install_ids=[pack])[0]
    outcomes: list[str] = []
    barrier = threading.Barrier(4)

    def finish(n: int) -> None:
        barrier.wait()
        try:
            if n % 2:
                connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
                outcomes.append("completed")
            else:
                connectors.fail(claim.work.work_id, lease_token=claim.lease_token, error="boom", retryable=False)
                outcomes.append("failed")
        except LeaseLost as error:
            assert "no longer held" in str(error) or "changed concurrently" in str(error)
            outcomes.append("refused")

    threads = [threading.Thread(target=finish, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes).count("refused") == 3
    winner = next(o for o in outcomes if o != "refused")
    assert connectors.get_work(claim.work.work_id).work.status == {"completed": "completed", "failed": "failed"}[winner]
    assert_invariants(engine)


def test_stale_snapshot_is_refused_by_the_conditional_update(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery()])
    with engine.connect() as connection:
        snapshot = work_items_sql.work_item_get(connection, connectors.ingest(pack, items=[delivery()])[0].work_id)
    assert snapshot is not None and snapshot.Status == WorkStatus.PENDING
    claim = connectors.claim("w", pack_install_ids=[pack])[0]  # the row moves on
    with engine.begin() as connection:
        # A caller acting on its outdated read: claim as if still pending, extend as if unclaimed.
        assert (
            claims_sql.work_item_update_if(
                connection, snapshot.WorkId, {"Status": snapshot.Status, "LeaseToken": None}, {"LeaseOwner": "intruder"}
            )
            == 0
        )
        assert (
            work_items_sql.work_items_extend(
                connection,
                pack,
                {snapshot.WorkId: (snapshot.LaneOrdinal + 5, 5)},
                snapshot.LaneOrdinal + 1,
                snapshot.LaneOrdinal + 5,
            )
            == 0
        )
    row = connectors.get_work(snapshot.WorkId).work
    assert (row.lease_owner, row.lane_ordinal, row.status) == ("w", 2, WorkStatus.PROCESSING)
    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    assert_invariants(engine)


def test_replay_conflict_fences(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery()])
    claim = connectors.claim("w", pack_install_ids=[pack])[0]
    with pytest.raises(ReplayRefused, match="only terminal work"):
        connectors.replay(claim.work.work_id)
    with pytest.raises(WorkNotFound):
        connectors.replay("no-such-work")
    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    connectors.replay(claim.work.work_id)
    with pytest.raises(ReplayRefused, match="already has a live replay"):
        connectors.replay(claim.work.work_id)
    assert_invariants(engine)


def test_two_concurrent_replays_exactly_one_succeeds(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery()])
    claim = connectors.claim("w", pack_install_ids=[pack])[0]
    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    results: list[object] = []
    barrier = threading.Barrier(2)

    def replay() -> None:
        barrier.wait()
        try:
            results.append(connectors.replay(claim.work.work_id))
        except ReplayRefused as error:
            results.append(error)

    threads = [threading.Thread(target=replay) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(isinstance(r, ReplayRefused) for r in results) == 1
    with engine.connect() as connection:
        replays = connection.execute(
            sa.select(sa.func.count()).select_from(WorkItem).where(WorkItem.c.ReplayOfWorkId == claim.work.work_id)
        ).scalar_one()
    assert replays == 1
    assert_invariants(engine)


def test_claim_moves_only_the_selected_event_and_completion_settles_it(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(), delivery(), delivery()])
    claim = connectors.claim("w", pack_install_ids=[pack])[0]

    def statuses() -> list[str]:
        with engine.connect() as connection:
            return list(connection.execute(sa.select(Event.c.Status).order_by(Event.c.EnqueueOrdinal)).scalars())

    assert statuses() == [EventStatus.PENDING, EventStatus.PENDING, EventStatus.PROCESSING]
    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    assert statuses() == [EventStatus.PENDING, EventStatus.PENDING, EventStatus.PROCESSED]
    assert_invariants(engine)


def test_list_receipts_pages_through_one_state(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    other = install_pack(engine)
    first = connectors.ingest(pack, items=[delivery(f"k{i}") for i in range(5)])
    connectors.ingest(other, items=[delivery("elsewhere")])
    with engine.begin() as connection:  # two generations go missing
        connection.execute(sa.delete(WorkItem).where(WorkItem.c.WorkId == first[0].work_id))
    redelivered = connectors.ingest(
        pack, items=[delivery("k1", payload=b"payload of k1"), delivery("k3", payload=b"payload of k3")]
    )
    assert {r.outcome for r in redelivered} == {Outcome.COVERAGE_MISSING}
    page, token = connectors.list_receipts("coverage_missing", pack_install_id=pack, page_size=1)
    assert [r.receipt_key for r in page] == ["k1"] and token
    page, token = connectors.list_receipts("coverage_missing", pack_install_id=pack, page_size=1, page_token=token)
    assert [r.receipt_key for r in page] == ["k3"]
    assert connectors.list_receipts("coverage_missing", pack_install_id=pack, page_size=1, page_token=token) == ([], "")
    everywhere, _ = connectors.list_receipts("confirmed")
    assert {(r.pack_install_id, r.receipt_key) for r in everywhere} == {
        (pack, "k0"),
        (pack, "k2"),
        (pack, "k4"),
        (other, "elsewhere"),
    }
    with pytest.raises(InvalidArgument, match="state must be one of"):
        connectors.list_receipts("nonsense")
    with pytest.raises(InvalidArgument, match="page_token"):
        connectors.list_receipts("stored", page_token="garbage!")
    assert_invariants(engine, damaged=[(pack, o) for o in range(1, 6)])


def test_a_refused_lease_token_says_whether_it_was_ever_issued_for_the_work(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery("r-1")])
    first = connectors.claim("w1", pack_install_ids=[pack], lease=dt.timedelta(seconds=10))[0]
    forged = "0" * 8 + "-0000-4000-8000-" + "0" * 12
    for token in ("not-a-token", forged, str(uuid.uuid4())):  # attempt 0: only the current lease exists
        with pytest.raises(LeaseLost, match="was not issued for work") as refused:
            connectors.heartbeat(first.work.work_id, lease_token=token)
        assert "claimed again" not in str(refused.value)
    clock.advance(11)
    taken = connectors.claim("w2", pack_install_ids=[pack], lease=dt.timedelta(seconds=10))[0]
    assert taken.work.work_id == first.work.work_id
    with pytest.raises(LeaseLost, match=r"stale: work .* was claimed again by another worker"):
        connectors.complete(first.work.work_id, lease_token=first.lease_token)
    future = claims.new_lease_token(taken.work.lease_expires_at + dt.timedelta(days=1))
    with pytest.raises(LeaseLost, match="was not issued for work"):
        connectors.complete(taken.work.work_id, lease_token=future)
    pending = connectors.ingest(pack, items=[delivery("r-3", lane="c")])[0].work_id
    with pytest.raises(LeaseLost, match="has never been claimed"):
        connectors.heartbeat(str(pending), lease_token=first.lease_token)
