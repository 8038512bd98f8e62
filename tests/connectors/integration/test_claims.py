"""Claims on every backend: a constant statement count, reserved rows, refusals, waiting for work, batches."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
import sqlalchemy as sa
from prometheus_client import REGISTRY

from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.queries.retention import events_delete
from nexuscrm_connectors.queue.claims import CLAIM_PASSES
from nexuscrm_connectors.settings import Settings
from nexuscrm_schema.tables import Event, WorkItem
from nexuscrm_sdk.flows import Generation
from nexuscrm_sdk.worker import Worker
from tests.support.factories import FakeClock, delivery, install_pack
from tests.support.invariants import assert_invariants, check_invariants
from tests.support.statements import capture
from tests.support.waiting import wait_until
from workqueue import EventStatus, WorkStatus
from workqueue.errors import InvalidArgument
from workqueue.values import Claim

pytestmark = pytest.mark.database

# What one Claim runs, whatever max_items: served packs, candidates, the lease UPDATE, the
# first claims' member counts, the re-read of the leased rows with their selected Events, the
# selected Events' UPDATE.
CLAIM_STATEMENTS = ["SELECT", "SELECT", "UPDATE", "UPDATE", "SELECT", "UPDATE"]
LANES = 40


def _finish(connectors: Connectors, claims: list[Claim]) -> None:
    for claim in claims:
        list(connectors.load_inputs(claim.work.work_id, lease_token=claim.lease_token))
        connectors.complete(claim.work.work_id, lease_token=claim.lease_token)


def _oldest_first(engine: sa.Engine, pack: str) -> list[str]:
    """Pending WorkIds in the order claims read them (ClaimableAt, then index order)."""
    with engine.connect() as connection:
        return list(
            connection.execute(
                sa.select(WorkItem.c.WorkId)
                .where(WorkItem.c.PackInstallId == pack, WorkItem.c.Status == WorkStatus.PENDING)
                .order_by(WorkItem.c.ClaimableAt)
            ).scalars()
        )


@pytest.mark.parametrize("max_items", [1, 8])
def test_a_claim_runs_the_same_few_statements_whatever_max_items(
    engine: sa.Engine, connectors: Connectors, max_items: int
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane=f"lane-{n}") for n in range(LANES)])
    with capture(engine) as captured:
        claims = connectors.claim("w", pack_install_ids=[pack], max_items=max_items)
    statements = captured.round_trips()
    assert len(claims) == max_items
    assert statements == CLAIM_STATEMENTS
    _finish(connectors, claims)
    assert_invariants(engine)


def test_claims_of_one_process_never_choose_rows_another_has_reserved(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane=f"lane-{n}") for n in range(6)])
    oldest = _oldest_first(engine, pack)
    with connectors.reservations.reserving() as take:  # another claim of this process is leasing the two oldest
        assert take(oldest, 2) == oldest[:2]
        concurrent = connectors.claim("w2", pack_install_ids=[pack], max_items=2)
        with connectors.reservations.reserving() as late:  # began after that claim ended: it would read them leased
            assert late(oldest, 6) == oldest[2:]
    alone = connectors.claim("w1", pack_install_ids=[pack], max_items=2)
    assert [c.work.work_id for c in concurrent] == oldest[2:4]
    assert [c.work.work_id for c in alone] == oldest[0:2]  # the reservation ended unused: a lone claim takes the oldest
    _finish(connectors, concurrent + alone)
    assert_invariants(engine)


def test_a_missing_selected_event_fails_only_its_generation(
    engine: sa.Engine, connectors: Connectors, caplog: pytest.LogCaptureFixture
) -> None:
    pack = install_pack(engine)
    results = connectors.ingest(
        pack, items=[delivery(lane="a"), delivery(lane="b"), delivery(lane="b"), delivery(lane="c")]
    )
    damaged = results[1].work_id
    selected = results[2].enqueue_ordinal
    with engine.begin() as connection:
        events_delete(connection, pack, [selected])
    before = _failed_damaged()
    claims = connectors.claim("w", pack_install_ids=[pack], max_items=3)
    assert sorted(c.work.work_id for c in claims) == sorted([results[0].work_id, results[3].work_id])
    reason = f"its selected Event (ordinal {selected}) is missing"
    assert f"failing {damaged}: {reason}" in caplog.text
    work = connectors.get_work(str(damaged)).work
    assert (work.status, work.lease_token, work.last_error) == (WorkStatus.FAILED, None, f"damaged: {reason}")
    assert _failed_damaged() == before + 1
    _finish(connectors, claims)
    lost = (pack, results[2].receipt_key)
    assert sorted(check_invariants(engine)) == [  # the damage, and nothing else
        f"D: receipt {lost} is confirmed but has no Event (an acknowledged input was lost)",
        f"P: {damaged} has no selected Event at its LaneOrdinal {selected}",
    ]


@pytest.mark.parametrize("max_items", [1, 2])
def test_damaged_oldest_generations_never_block_newer_work_of_the_pack(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock, max_items: int
) -> None:
    """More damaged generations than the candidate window (2 x max_items): claims still reach the healthy one.

    Each claim fails up to CLAIM_PASSES x max_items damaged generations for good, so a worker
    that keeps claiming reaches newer work after a bounded number of claims (one here for 2).
    """
    pack = install_pack(engine)
    damaged_count = 2 * max_items + 1
    results = connectors.ingest(pack, items=[delivery(lane=f"damaged-{n}") for n in range(damaged_count)])
    clock.advance(1)  # strictly older than the healthy one
    healthy = connectors.ingest(pack, items=[delivery(lane="healthy")])[0]
    with engine.begin() as connection:
        events_delete(connection, pack, [int(r.enqueue_ordinal) for r in results])
    before = _failed_damaged()
    answers = [connectors.claim("w", pack_install_ids=[pack], max_items=max_items)]
    while not answers[-1] and len(answers) < damaged_count:  # on main: empty for ever
        answers.append(connectors.claim("w", pack_install_ids=[pack], max_items=max_items))
    claims = answers[-1]
    assert [c.work.work_id for c in claims] == [healthy.work_id]
    assert len(answers) == (2 if damaged_count % (CLAIM_PASSES * max_items) == 0 else 1)  # 3 x 1, or 5 < 3 x 2
    for result in results:
        work = connectors.get_work(str(result.work_id)).work
        assert (work.status, work.last_error) == (
            WorkStatus.FAILED,
            f"damaged: its selected Event (ordinal {result.enqueue_ordinal}) is missing",
        )
    assert _failed_damaged() == before + damaged_count
    _finish(connectors, claims)
    assert connectors.claim("w", pack_install_ids=[pack], max_items=max_items) == []
    assert sorted(check_invariants(engine)) == sorted(  # the damage, and nothing else
        [
            f"D: receipt {(pack, r.receipt_key)} is confirmed but has no Event (an acknowledged input was lost)"
            for r in results
        ]
        + [f"P: {r.work_id} has no selected Event at its LaneOrdinal {r.enqueue_ordinal}" for r in results]
        + [f"P: {r.work_id} has no member at its InputStartOrdinal {r.enqueue_ordinal}" for r in results]
    )


def _failed_damaged() -> float:
    return REGISTRY.get_sample_value("nexuscrm_generations_failed_damaged_total") or 0.0


def test_an_expired_lease_is_reclaimed_in_the_same_statement_as_pending_work(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock
) -> None:
    pack = install_pack(engine)
    first = connectors.ingest(pack, items=[delivery(lane="a")])[0]
    expired = connectors.claim("w1", pack_install_ids=[pack], lease=dt.timedelta(seconds=5))[0]
    clock.advance(6)
    second = connectors.ingest(pack, items=[delivery(lane="b")])[0]
    claims = connectors.claim("w2", pack_install_ids=[pack], max_items=2)
    assert {(c.work.work_id, c.work.attempt) for c in claims} == {(first.work_id, 1), (second.work_id, 0)}
    assert len({c.lease_token for c in claims} | {expired.lease_token}) == 2  # one fresh token for the claim
    with engine.connect() as connection:
        statuses = dict(connection.execute(sa.select(Event.c.EnqueueOrdinal, Event.c.Status)).all())
    assert statuses == {first.enqueue_ordinal: EventStatus.PROCESSING, second.enqueue_ordinal: EventStatus.PROCESSING}
    _finish(connectors, claims)
    assert_invariants(engine)


def test_wait_is_bounded_by_the_setting(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    limit = dt.timedelta(milliseconds=connectors.settings.max_claim_wait_ms)
    for wait in (dt.timedelta(milliseconds=-1), limit + dt.timedelta(milliseconds=1)):
        with pytest.raises(InvalidArgument, match="wait_ms"):
            connectors.claim("w", pack_install_ids=[pack], wait=wait)
    # Nothing claimable: a short wait ends with an empty answer.
    assert connectors.claim("w", pack_install_ids=[pack], wait=dt.timedelta(milliseconds=20)) == []
    assert_invariants(engine)


@pytest.fixture
def patient(engine: sa.Engine, clock: FakeClock) -> Connectors:
    """Connectors whose waiting claims never poll: only this process's work can wake them."""
    hour = 3_600_000  # milliseconds
    return Connectors(engine, Settings(max_claim_wait_ms=hour, claim_poll_ms=hour), clock=clock)


class _WaitingClaim:
    """A claim that waits for work in a thread of its own."""

    def __init__(self, connectors: Connectors, pack: str, engine: sa.Engine) -> None:
        self._answer: list[Claim] = []
        self._done = threading.Event()
        with capture(engine) as captured:
            threading.Thread(target=self._run, args=(connectors, pack), daemon=True).start()
            wait_until(
                lambda: any("WorkItem" in c.statement for c in captured.statements), "the claim's first look for work"
            )

    def _run(self, connectors: Connectors, pack: str) -> None:
        self._answer = connectors.claim("waiting", pack_install_ids=[pack], max_items=4, wait=dt.timedelta(hours=1))
        self._done.set()

    def answer(self) -> list[Claim]:
        """What the claim returned; empty until it returned."""
        return self._answer if self._done.is_set() else []


def test_a_waiting_claim_returns_as_soon_as_this_process_admits_work(engine: sa.Engine, patient: Connectors) -> None:
    pack = install_pack(engine)
    waiting = _WaitingClaim(patient, pack, engine)  # it found nothing and waits
    admitted = patient.ingest(pack, items=[delivery(lane="a"), delivery(lane="b")])
    claims = wait_until(waiting.answer, "the waiting claim to return the admitted work")
    assert sorted(c.work.work_id for c in claims) == sorted(str(r.work_id) for r in admitted)
    _finish(patient, claims)
    assert_invariants(engine)


def test_a_waiting_claim_is_woken_by_a_completion_that_unblocks_a_successor(
    engine: sa.Engine, patient: Connectors
) -> None:
    pack = install_pack(engine)
    patient.ingest(pack, items=[delivery(lane="a")])
    running = patient.claim("w", pack_install_ids=[pack])[0]
    successor = patient.ingest(pack, items=[delivery(lane="a")])[0]  # blocked behind the running generation
    waiting = _WaitingClaim(patient, pack, engine)
    _finish(patient, [running])
    claims = wait_until(waiting.answer, "the waiting claim to return the unblocked successor")
    assert [c.work.work_id for c in claims] == [successor.work_id]
    _finish(patient, claims)
    assert_invariants(engine)


def test_a_worker_runs_a_batch_in_turn_and_keeps_the_waiting_leases(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock
) -> None:
    pack = install_pack(engine)
    admitted = connectors.ingest(pack, items=[delivery(lane=f"lane-{n}") for n in range(3)])
    ran: list[str] = []

    def flow(generation: Generation) -> None:
        list(generation.inputs)
        if not ran:  # while the first runs, the two others wait their turn: their leases are renewed
            claimed = max(_lease_expiries(engine, pack))  # one claim statement: one expiry for all three
            clock.advance(2)  # less than the lease: the leases are still held
            renewed = claimed + dt.timedelta(seconds=2)  # a renewal after the advance reaches at least this
            wait_until(lambda: _renewed(_lease_expiries(engine, pack), renewed), "every lease of the batch renewed")
        ran.append(generation.work.work_id)

    worker = Worker(
        connectors, flow, worker_id="w", pack_install_ids=[pack], lease=dt.timedelta(seconds=6), batch_size=3
    )
    assert worker.run_once()
    assert sorted(ran) == sorted(str(r.work_id) for r in admitted)
    assert worker.stats.completed == 3 and not worker.run_once()
    assert_invariants(engine)


def _renewed(expiries: list[dt.datetime], renewed: dt.datetime) -> bool:
    return len(expiries) == 3 and all(expiry >= renewed for expiry in expiries)


def _lease_expiries(engine: sa.Engine, pack: str) -> list[dt.datetime]:
    with engine.connect() as connection:
        return list(
            connection.execute(
                sa.select(WorkItem.c.LeaseExpiresAt).where(
                    WorkItem.c.PackInstallId == pack, WorkItem.c.Status == WorkStatus.PROCESSING
                )
            ).scalars()
        )


def test_failing_damaged_work_unblocks_its_successor(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock
) -> None:
    """A damaged generation found on reclaim is failed and its blocked successor runs next, in the same claim."""
    pack = install_pack(engine)
    first = connectors.ingest(pack, items=[delivery(lane="a")])[0]
    connectors.claim("w1", pack_install_ids=[pack], lease=dt.timedelta(seconds=5))
    successor = connectors.ingest(pack, items=[delivery(lane="a")])[0]  # blocked behind the running generation
    assert connectors.get_work(str(successor.work_id)).work.status == WorkStatus.BLOCKED
    with engine.begin() as connection:
        events_delete(connection, pack, [int(first.enqueue_ordinal)])
    clock.advance(6)  # the lease expired: the next claim reclaims the damaged generation
    claims = connectors.claim("w2", pack_install_ids=[pack])
    assert [c.work.work_id for c in claims] == [successor.work_id]
    assert connectors.get_work(str(first.work_id)).work.status == WorkStatus.FAILED
    _finish(connectors, claims)
    lost = (pack, first.receipt_key)
    assert sorted(check_invariants(engine)) == [  # the damage, and nothing else
        f"D: receipt {lost} is confirmed but has no Event (an acknowledged input was lost)",
        f"P: {first.work_id} has no member at its InputStartOrdinal {first.enqueue_ordinal}",
        f"P: {first.work_id} has no selected Event at its LaneOrdinal {first.enqueue_ordinal}",
    ]
