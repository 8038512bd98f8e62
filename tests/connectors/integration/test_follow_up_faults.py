"""An answer never hides committed work: steps after a commit that fail are not the caller's failure.

Issue 14 saw Ingest batches answered ABORTED although their admission had committed (the
failing part was a later step). Every step after a commit now runs through
``database.follow_up``: the fault point ``<transaction>:follow_up`` fails each of them here
(counting, waking claimers, the admission's newest-generation cache), and the caller still
gets the outcomes of what committed, and the database invariants hold.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import sqlalchemy as sa
from prometheus_client import REGISTRY

from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.queue.deliveries import Delivery
from nexuscrm_runtime.database import TransactionConflict
from nexuscrm_schema.tables import AdmissionFence, Event, WorkItem
from tests.support.factories import START, delivery, install_pack
from tests.support.invariants import assert_invariants
from workqueue import WorkStatus
from workqueue.values import IngestResult, Outcome

pytestmark = pytest.mark.database

FAILURES = "nexuscrm_follow_up_failures_total"
POINTS = ("admission", "claim", "complete", "fail", "replay")  # transactions whose follow-ups fail here


def _failures(transaction: str) -> float:
    return REGISTRY.get_sample_value(FAILURES, {"transaction": transaction}) or 0.0


@pytest.fixture
def failing_follow_ups(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step after an admission, claim, completion or replay commit raises (``raise*``: each time)."""
    monkeypatch.setenv("NEXUSCRM_FAULTS_ENABLED", "1")
    monkeypatch.setenv("NEXUSCRM_FAULTS", ",".join(f"{name}:follow_up=raise*" for name in POINTS))


@pytest.mark.usefixtures("failing_follow_ups")
def test_ingest_answers_the_admitted_outcomes_when_a_step_after_the_commit_fails(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    before = _failures("admission")
    items = [delivery(lane="a"), delivery(lane="b"), delivery(lane="a")]
    results = connectors.ingest(pack, items=items)
    assert [r.outcome for r in results] == [Outcome.ADMITTED] * 3, "the committed admission was hidden"
    assert [r.enqueue_ordinal for r in results] == [1, 2, 3]
    assert results[0].work_id == results[2].work_id != results[1].work_id
    assert _failures("admission") > before, "the injected follow-up failures were not counted"
    with engine.connect() as connection:
        assert connection.execute(sa.select(sa.func.count()).select_from(Event)).scalar() == 3
        work_ids = set(connection.execute(sa.select(WorkItem.c.WorkId)).scalars())
    assert work_ids == {r.work_id for r in results}, "a WorkItem exists that no Ingest answer named"
    # A second batch after the failed cache update: the cache is only an optimization.
    again = connectors.ingest(pack, items=[items[0], delivery(lane="a")])
    assert [r.outcome for r in again] == [Outcome.DUPLICATE_COVERED, Outcome.ADMITTED]
    assert again[1].work_id == results[0].work_id  # still unclaimed: extended
    assert_invariants(engine)


@pytest.mark.usefixtures("failing_follow_ups")
def test_claim_complete_and_replay_answer_what_committed_when_their_follow_ups_fail(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    before = {point: _failures(point) for point in POINTS}
    [admitted] = connectors.ingest(pack, items=[delivery(lane="a")])
    [claim] = connectors.claim("w", pack_install_ids=[pack])
    assert claim.work.work_id == admitted.work_id, "a committed lease was lost to its worker"
    done = connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    assert done.status is WorkStatus.COMPLETED
    replayed = connectors.replay(done.work_id)
    assert replayed.work.replay_of_work_id == done.work_id
    [again] = connectors.claim("w", pack_install_ids=[pack])
    failed = connectors.fail(again.work.work_id, lease_token=again.lease_token, error="boom", retryable=False)
    assert failed.status is WorkStatus.FAILED
    # Every step after each commit failed and was counted: the Ingest's count, wake-up and generation
    # cache; each claim's count; the count and the wake-up of complete, fail and replay.
    fired = {point: _failures(point) - before[point] for point in POINTS}
    assert fired == {"admission": 3, "claim": 2, "complete": 2, "fail": 2, "replay": 2}
    assert_invariants(engine)


def test_materializer_admits_the_other_packs_when_one_pack_conflicts(
    engine: sa.Engine, connectors: Connectors, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One pack's admission that outlasts its retries no longer fails the pass for packs already admitted."""
    stuck, fine = install_pack(engine), install_pack(engine)
    with engine.begin() as connection:  # a namespace fence: both packs only store their receipts
        connection.execute(
            sa.insert(AdmissionFence).values(FenceId="f-1", Namespace="acme", Scope="*", Reason="", CreatedAt=START)
        )
    for pack in (stuck, fine):
        assert connectors.ingest(pack, items=[delivery(lane="a")])[0].outcome is Outcome.FENCED
    with engine.begin() as connection:
        connection.execute(sa.delete(AdmissionFence))
    real_admit = connectors.admission.admit_batch

    def conflicting(pack_install_id: str, deliveries: Sequence[Delivery]) -> dict[str, IngestResult]:
        if pack_install_id == stuck:
            raise TransactionConflict("admission conflicted with concurrent transactions; nothing was committed")
        return real_admit(pack_install_id, deliveries)

    monkeypatch.setattr(connectors.admission, "admit_batch", conflicting)
    assert connectors.materialize() == 1  # the other pack was admitted and is counted
    monkeypatch.setattr(connectors.admission, "admit_batch", real_admit)
    assert connectors.materialize() == 1  # the next pass admits the one that conflicted
    assert_invariants(engine)
