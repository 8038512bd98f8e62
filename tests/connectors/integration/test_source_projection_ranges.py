"""Source projection ranges on every backend: the PR #329 regressions and the range protocol.

Every scenario ends with the invariant checker (M, O, B, D, X, P) over the whole database.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections import Counter

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.queue import admission
from nexuscrm_connectors.queue.deliveries import payload_hash
from nexuscrm_schema.tables import Event, IngressReceipt, WorkItem
from tests.support.factories import START, FakeClock, delivery, install_pack
from tests.support.invariants import assert_invariants, bounds_violations, generation_bounds
from workqueue import ReceiptState, WorkStatus
from workqueue.values import Outcome

pytestmark = pytest.mark.database


def count(engine: sa.Engine, table: sa.Table) -> int:
    with engine.connect() as connection:
        return int(connection.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def load_all(connectors: Connectors, work_id: str, token: str, page_size: int = 0) -> list[int]:
    return [
        i.enqueue_ordinal
        for page in connectors.load_inputs(work_id, lease_token=token, page_size=page_size)
        for i in page.inputs
    ]


def claim_one(connectors: Connectors, pack: str, worker: str = "w1"):  # type: ignore[no-untyped-def]
    claims = connectors.claim(worker, pack_install_ids=[pack])
    assert len(claims) == 1, claims
    return claims[0]


def test_regression_1_membership_follows_ordinals_not_source_clocks(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    # The source's clock runs backwards relative to arrival: the old inference trusted it.
    times = [START - dt.timedelta(minutes=m) for m in (0, 10, 5, 30)]
    results = connectors.ingest(pack, items=[delivery(source_time=t) for t in times])
    assert [r.outcome for r in results] == [Outcome.ADMITTED] * 4
    ordinals = [r.enqueue_ordinal for r in results]
    assert ordinals == [1, 2, 3, 4]
    assert len({r.work_id for r in results}) == 1
    claim = claim_one(connectors, pack)
    assert (claim.work.input_start_ordinal, claim.work.lane_ordinal) == (1, 4)
    assert load_all(connectors, claim.work.work_id, claim.lease_token, page_size=3) == ordinals
    # A later input with the oldest source time still belongs to a new generation only.
    later = connectors.ingest(pack, items=[delivery(source_time=START - dt.timedelta(days=1))])[0]
    assert later.work_id != claim.work.work_id
    assert later.enqueue_ordinal == 5
    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    nxt = claim_one(connectors, pack)
    assert load_all(connectors, nxt.work.work_id, nxt.lease_token) == [5]
    assert_invariants(engine)


def test_regression_2_duplicate_of_input_with_missing_generation_is_refused(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    first = connectors.ingest(pack, items=[delivery("r-lost")])[0]
    assert first.outcome is Outcome.ADMITTED
    with engine.begin() as connection:  # a retention bug deletes the live generation
        connection.execute(sa.delete(WorkItem).where(WorkItem.c.WorkId == first.work_id))
    events, work = count(engine, Event), count(engine, WorkItem)

    again = connectors.ingest(pack, items=[delivery("r-lost")])[0]

    assert again.outcome is Outcome.COVERAGE_MISSING
    assert "coverage missing" in again.message and again.work_id is None
    assert (count(engine, Event), count(engine, WorkItem)) == (events, work)  # nothing reconstructed or replayed
    explained = connectors.explain_receipt(pack, receipt_key="r-lost")
    assert explained.receipt_state == ReceiptState.COVERAGE_MISSING
    assert explained.covered_by is None and "coverage missing" in explained.explanation
    assert connectors.claim("w1", pack_install_ids=[pack]) == []
    assert_invariants(engine, damaged=[(pack, 1)])


def test_active_generation_absorbs_until_claimed_then_successor_takes_over(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    a = connectors.ingest(pack, items=[delivery(), delivery()])
    b = connectors.ingest(pack, items=[delivery()])
    assert {r.work_id for r in a + b} == {a[0].work_id}
    before = generation_bounds(engine)
    claim = claim_one(connectors, pack)
    assert (claim.work.input_start_ordinal, claim.work.lane_ordinal) == (1, 3)

    c = connectors.ingest(pack, items=[delivery(), delivery()])
    d = connectors.ingest(pack, items=[delivery()])
    successor = connectors.get_work(c[0].work_id)
    assert successor.work.work_id != claim.work.work_id
    assert successor.work.status is WorkStatus.BLOCKED
    assert (successor.work.input_start_ordinal, successor.work.lane_ordinal, successor.member_count) == (4, 6, 3)
    assert d[0].work_id == successor.work.work_id
    assert connectors.claim("w2", pack_install_ids=[pack]) == []  # X: the successor waits

    assert load_all(connectors, claim.work.work_id, claim.lease_token) == [1, 2, 3]
    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    assert connectors.get_work(successor.work.work_id).work.status is WorkStatus.PENDING
    nxt = claim_one(connectors, pack)
    assert load_all(connectors, nxt.work.work_id, nxt.lease_token) == [4, 5, 6]
    assert bounds_violations(before, generation_bounds(engine)) == []
    assert_invariants(engine)


def test_identities_get_separate_generations_and_one_batch_query_set(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    results = connectors.ingest(pack, items=[delivery(lane=f"lane-{i % 3}") for i in range(9)])
    by_lane = Counter(r.work_id for r in results)
    assert sorted(by_lane.values()) == [3, 3, 3]
    for work_id in by_lane:
        described = connectors.get_work(work_id)
        assert described.member_count == 3
    assert_invariants(engine)


def test_mixed_duplicates(engine: sa.Engine, connectors: Connectors, clock: FakeClock) -> None:
    pack = install_pack(engine, legacy_max_ordinal=2, last_ordinal=2)
    with engine.begin() as connection:  # two inputs of the old protocol, with their receipts
        for ordinal in (1, 2):
            item = delivery(f"old-{ordinal}")
            key = item.route.identity(pack).key
            row = {"PackInstallId": pack, "ReceiptKey": item.receipt_key, "ProjectionKey": key}
            connection.execute(
                sa.insert(IngressReceipt).values(
                    **row,
                    PayloadHash=payload_hash(item.payload),
                    Payload=item.payload,
                    State=ReceiptState.CONFIRMED,
                    ReceivedAt=START,
                )
            )
            connection.execute(
                sa.insert(Event).values(
                    PackInstallId=pack,
                    EnqueueOrdinal=ordinal,
                    ProjectionKey=key,
                    ReceiptKey=item.receipt_key,
                    PayloadHash=payload_hash(item.payload),
                    Payload=item.payload,
                    Status="processed",
                    CreatedAt=START,
                )
            )
    terminal = connectors.ingest(pack, items=[delivery("done")])[0]
    claim = claim_one(connectors, pack)
    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    live = connectors.ingest(pack, items=[delivery("live")])[0]
    lost = connectors.ingest(pack, items=[delivery("lost", lane="lane-lost")])[0]
    with engine.begin() as connection:
        connection.execute(sa.delete(WorkItem).where(WorkItem.c.WorkId == lost.work_id))
    events, work = count(engine, Event), count(engine, WorkItem)

    results = connectors.ingest(
        pack,
        items=[
            delivery("old-1"),
            delivery("done"),
            delivery("live"),
            delivery("lost", lane="lane-lost"),
            delivery("new-twice"),
            delivery("new-twice"),
            delivery("live", payload=b"changed"),
            delivery("new-conflict", payload=b"one"),
            delivery("new-conflict", payload=b"two"),
        ],
    )
    outcomes = [(r.receipt_key, r.outcome, r.work_id) for r in results]
    assert outcomes[0] == ("old-1", Outcome.DUPLICATE_LEGACY, None)
    assert outcomes[1] == ("done", Outcome.DUPLICATE_COVERED, terminal.work_id)
    assert outcomes[2] == ("live", Outcome.DUPLICATE_COVERED, live.work_id)
    assert outcomes[3][:2] == ("lost", Outcome.COVERAGE_MISSING)
    assert outcomes[4][1] is Outcome.ADMITTED and outcomes[5][1] is Outcome.DUPLICATE_COVERED
    assert outcomes[4][2] == outcomes[5][2] == live.work_id  # absorbed by the live generation
    assert outcomes[6][1] is Outcome.REJECTED and "different payload" in results[6].message
    assert outcomes[7][1] is Outcome.ADMITTED and outcomes[8][1] is Outcome.REJECTED
    # D: only the two genuinely new inputs wrote Events; no duplicate created work.
    assert count(engine, Event) == events + 2
    assert count(engine, WorkItem) == work
    assert_invariants(engine, damaged=[(pack, lost.enqueue_ordinal)])


def test_retry_keeps_both_bounds_and_successor_waits(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(), delivery()])
    claim = claim_one(connectors, pack)
    failed = connectors.fail(claim.work.work_id, lease_token=claim.lease_token, error="boom")
    assert failed.status is WorkStatus.RETRY and failed.attempt == 1
    assert (failed.input_start_ordinal, failed.lane_ordinal) == (1, 2)
    later = connectors.ingest(pack, items=[delivery()])[0]
    assert later.work_id != claim.work.work_id  # a retry never extends
    assert connectors.get_work(later.work_id).work.status is WorkStatus.BLOCKED
    assert connectors.claim("w1", pack_install_ids=[pack]) == []  # backoff not over
    clock.advance(connectors.settings.backoff_seconds(1))
    again = claim_one(connectors, pack)
    assert again.work.work_id == claim.work.work_id
    assert (again.work.input_start_ordinal, again.work.lane_ordinal) == (1, 2)
    assert load_all(connectors, again.work.work_id, again.lease_token) == [1, 2]
    connectors.complete(again.work.work_id, lease_token=again.lease_token)
    assert_invariants(engine)


def test_replay_starts_with_its_event_and_absorbs_later_inputs(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(), delivery()])
    claim = claim_one(connectors, pack)
    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    result = connectors.replay(claim.work.work_id)
    replayed = result.work
    assert result.replay_event_ordinal == 3
    assert (replayed.input_start_ordinal, replayed.lane_ordinal) == (3, 3)
    assert replayed.replay_of_work_id == claim.work.work_id and replayed.status is WorkStatus.PENDING
    absorbed = connectors.ingest(pack, items=[delivery()])[0]
    assert absorbed.work_id == replayed.work_id
    replay_claim = claim_one(connectors, pack)
    pages = list(connectors.load_inputs(replay_claim.work.work_id, lease_token=replay_claim.lease_token))
    inputs = [i for page in pages for i in page.inputs]
    assert [(i.enqueue_ordinal, i.is_replay) for i in inputs] == [(3, True), (4, False)]
    assert b'"replay_of_work_id": "' + claim.work.work_id.encode() in inputs[0].payload
    assert_invariants(engine)


def test_crash_after_admission_commit(
    engine: sa.Engine, connectors: Connectors, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Receipts are written confirmed in the admission transaction: a failure after its commit leaves all facts.

    The failing step after the commit is not the caller's failure either: the answer carries
    the committed outcome (decision 107).
    """
    pack = install_pack(engine)

    def crash(*_args: object) -> None:
        raise ConnectionError("a step right after the admission commit failed")

    monkeypatch.setattr(admission.NewestMemory, "record", crash)
    [answered] = connectors.ingest(pack, items=[delivery("r-crash")])
    assert answered.outcome is Outcome.ADMITTED and answered.enqueue_ordinal == 1
    monkeypatch.undo()
    with engine.connect() as connection:
        state, payload = connection.execute(sa.select(IngressReceipt.c.State, IngressReceipt.c.Payload)).one()
    assert state == ReceiptState.CONFIRMED and payload == b""  # the payload is stored once, in the Event
    assert count(engine, Event) == 1 and count(engine, WorkItem) == 1

    retried = connectors.ingest(pack, items=[delivery("r-crash")])[0]
    assert retried.outcome is Outcome.DUPLICATE_COVERED
    assert count(engine, Event) == 1 and count(engine, WorkItem) == 1
    assert_invariants(engine)


@pytest.mark.parametrize("recovery", ["retried delivery", "materializer"])
def test_receipt_left_stored_beside_its_event_is_confirmed(
    engine: sa.Engine, connectors: Connectors, recovery: str
) -> None:
    """An older release confirmed receipts after the commit: a crash in between left them stored beside their Events."""
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery("r-old")])
    with engine.begin() as connection:
        connection.execute(
            sa.update(IngressReceipt).values(State=ReceiptState.STORED, ConfirmedAt=None, Payload=b"copy")
        )
    if recovery == "materializer":
        assert connectors.materialize() == 1
    else:
        assert connectors.ingest(pack, items=[delivery("r-old")])[0].outcome is Outcome.DUPLICATE_COVERED
    explained = connectors.explain_receipt(pack, receipt_key="r-old")
    assert explained.receipt_state == ReceiptState.CONFIRMED
    with engine.connect() as connection:
        assert connection.execute(sa.select(IngressReceipt.c.Payload)).scalar_one() == b""
    assert count(engine, Event) == 1 and count(engine, WorkItem) == 1
    assert_invariants(engine)


def test_enqueue_and_claim_race_threads(engine: sa.Engine) -> None:
    connectors = Connectors(engine)
    pack = install_pack(engine)
    lanes, batches, per_batch = 5, 12, 10
    admitted: list[int] = []
    executed: Counter[int] = Counter()
    errors: list[BaseException] = []
    done = threading.Event()

    def producer(n: int) -> None:
        try:
            for b in range(batches):
                results = connectors.ingest(
                    pack, items=[delivery(f"p{n}-{b}-{i}", lane=f"lane-{i % lanes}") for i in range(per_batch)]
                )
                admitted.extend(r.enqueue_ordinal for r in results if r.outcome is Outcome.ADMITTED)
        except BaseException as error:
            errors.append(error)

    def worker(n: int) -> None:
        try:
            while True:
                # Read "done" before claiming: an empty claim counts only if every batch had
                # committed before it looked for candidates.
                finished = done.is_set()
                claims = connectors.claim(f"w{n}", pack_install_ids=[pack], max_items=2)
                for c in claims:
                    executed.update(load_all(connectors, c.work.work_id, c.lease_token))
                    connectors.complete(c.work.work_id, lease_token=c.lease_token)
                if not claims and finished:
                    return
        except BaseException as error:
            errors.append(error)

    producers = [threading.Thread(target=producer, args=(n,)) for n in range(3)]
    workers = [threading.Thread(target=worker, args=(n,)) for n in range(3)]
    for t in producers + workers:
        t.start()
    for t in producers:
        t.join()
    done.set()
    for t in workers:
        t.join()
    assert not errors, errors
    assert sorted(admitted) == list(range(1, 3 * batches * per_batch + 1))
    # Every input executed exactly once, by the one generation that holds it (M, P, X).
    assert executed == Counter(admitted)
    assert_invariants(engine)


def _ingest_process(dsn: str, pack: str, name: str, batches: int, per_batch: int) -> list[int]:
    """Run in a separate process: admit batches over its own engine."""
    from nexuscrm_runtime.database import create_engine

    engine = create_engine(dsn)
    connectors = Connectors(engine)
    admitted: list[int] = []
    for b in range(batches):
        results = connectors.ingest(
            pack, items=[delivery(f"{name}-{b}-{i}", lane=f"lane-{i % 4}") for i in range(per_batch)]
        )
        admitted.extend(r.enqueue_ordinal for r in results if r.outcome is Outcome.ADMITTED)
    engine.dispose()
    return admitted


def test_enqueue_and_claim_race_processes(engine: sa.Engine, dsn: str) -> None:
    import concurrent.futures
    import multiprocessing

    connectors = Connectors(engine)
    pack = install_pack(engine)
    executed: Counter[int] = Counter()
    context = multiprocessing.get_context("spawn")

    def work_off() -> int:
        claims = connectors.claim("w", pack_install_ids=[pack], max_items=4)
        for c in claims:
            executed.update(load_all(connectors, c.work.work_id, c.lease_token))
            connectors.complete(c.work.work_id, lease_token=c.lease_token)
        return len(claims)

    with concurrent.futures.ProcessPoolExecutor(max_workers=2, mp_context=context) as pool:
        futures = [pool.submit(_ingest_process, dsn, pack, f"proc{n}", 10, 8) for n in range(2)]
        while not all(f.done() for f in futures):
            work_off()  # claims race the other processes' admissions
        admitted = [o for f in futures for o in f.result()]
    while work_off():
        pass
    assert sorted(admitted) == list(range(1, 161))
    assert executed == Counter(admitted)
    assert_invariants(engine)


def test_replay_and_admission_never_interleave(engine: sa.Engine) -> None:
    connectors = Connectors(engine)
    pack = install_pack(engine)
    first = connectors.ingest(pack, items=[delivery(lane="lane-r")])[0]
    claim = claim_one(connectors, pack)
    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    replay_ordinals: list[int] = []
    admitted: list[int] = []
    errors: list[BaseException] = []

    def replayer() -> None:
        try:
            target = first.work_id
            for _ in range(8):
                replayed = connectors.replay(target)
                work = replayed.work
                replay_ordinals.append(replayed.replay_event_ordinal)
                while True:  # run the replay generation (it may absorb fresh inputs of lane-r)
                    claims = connectors.claim("rw", pack_install_ids=[pack], max_items=4)
                    for c in claims:
                        list(connectors.load_inputs(c.work.work_id, lease_token=c.lease_token))
                        connectors.complete(c.work.work_id, lease_token=c.lease_token)
                    if connectors.get_work(work.work_id).work.status is WorkStatus.COMPLETED:
                        break
        except BaseException as error:
            errors.append(error)

    def producer(n: int) -> None:
        try:
            for b in range(8):
                results = connectors.ingest(
                    pack, items=[delivery(f"i{n}-{b}-{i}", lane=("lane-r", "lane-x")[i % 2]) for i in range(5)]
                )
                admitted.extend(r.enqueue_ordinal for r in results)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=replayer)] + [threading.Thread(target=producer, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    all_ordinals = sorted([1, *replay_ordinals, *admitted])
    assert all_ordinals == list(range(1, len(all_ordinals) + 1))  # O: one sequence, no reuse, no gap
    with engine.connect() as connection:
        replay_events = (
            connection.execute(sa.select(Event.c.EnqueueOrdinal).where(Event.c.IsReplay.is_(True))).scalars().all()
        )
    assert sorted(replay_events) == sorted(replay_ordinals)
    assert_invariants(engine)
