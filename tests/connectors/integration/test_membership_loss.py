"""A claimed generation that lost a member: LoadInputs answers DATA_LOSS, never the remaining members.

The first claim records the generation's member count (WorkItem.ClaimedMemberCount, decision
110) in the statement after its lease UPDATE; LoadInputs compares the range with it, and with
the count its admission recorded when that is known (decision 149), before answering anything.
A loss before the first claim: test_admitted_member_count.py.
"""

from __future__ import annotations

import datetime as dt
import threading

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from nexuscrm_connectors.errors import MembershipMissing
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.queries.retention import events_delete
from nexuscrm_runtime.sqlite_writer import SerializedWriterDialect
from nexuscrm_schema.tables import WorkItem
from tests.connectors.integration.test_claims import CLAIM_STATEMENTS
from tests.support.factories import FakeClock, delivery, install_pack
from tests.support.invariants import assert_invariants, check_invariants
from tests.support.sessions import processlist
from tests.support.statements import capture
from tests.support.waiting import wait_until
from workqueue.errors import ErrorKind
from workqueue.values import Claim

pytestmark = pytest.mark.database


def _claimed_member_count(engine: sa.Engine, work_id: str) -> int | None:
    with engine.connect() as connection:
        value = connection.execute(
            sa.select(WorkItem.c.ClaimedMemberCount).where(WorkItem.c.WorkId == work_id)
        ).scalar_one()
    return None if value is None else int(value)


def _lose(engine: sa.Engine, pack: str, ordinal: int) -> None:
    with engine.begin() as connection:
        events_delete(connection, pack, [ordinal])


def test_the_first_claim_records_the_member_count_in_its_constant_statements(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    results = connectors.ingest(pack, items=[delivery(lane="a"), delivery(lane="b"), delivery(lane="a")])
    assert _claimed_member_count(engine, str(results[0].work_id)) is None  # unclaimed: the range may still grow
    with capture(engine) as captured:
        claims = connectors.claim("w", pack_install_ids=[pack], max_items=2)
    statements = captured.round_trips()
    assert statements == CLAIM_STATEMENTS
    counts = {c.work.work_id: _claimed_member_count(engine, c.work.work_id) for c in claims}
    assert counts == {str(results[0].work_id): 2, str(results[1].work_id): 1}
    for claim in claims:
        list(connectors.load_inputs(claim.work.work_id, lease_token=claim.lease_token))
        connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    assert_invariants(engine)


@pytest.mark.parametrize("before_v11", [False, True], ids=["admitted-count", "before-v11"])
@pytest.mark.parametrize("reclaimed", [False, True])
def test_a_lost_middle_member_answers_data_loss(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock, reclaimed: bool, before_v11: bool
) -> None:
    pack = install_pack(engine)
    results = connectors.ingest(pack, items=[delivery(lane="a") for _ in range(3)])
    work_id = str(results[0].work_id)
    if before_v11:  # what applying v11 leaves on an existing row: only the first claim's count guards it
        with engine.begin() as connection:
            connection.execute(
                sa.update(WorkItem)
                .where(WorkItem.c.WorkId == work_id)
                .values(AdmittedMemberCount=None, AdmittedThroughOrdinal=None)
            )
    claim = connectors.claim("w", pack_install_ids=[pack], lease=dt.timedelta(seconds=5))[0]
    middle = results[1].enqueue_ordinal
    _lose(engine, pack, middle)
    if reclaimed:  # a later claim keeps the count of the first: the loss is not forgotten
        clock.advance(6)
        claim = connectors.claim("w2", pack_install_ids=[pack])[0]
        assert claim.work.attempt == 1
    assert _claimed_member_count(engine, work_id) == 3
    with pytest.raises(MembershipMissing) as raised:
        list(connectors.load_inputs(work_id, lease_token=claim.lease_token))
    assert raised.value.kind is ErrorKind.DATA_LOSS
    first, last = results[0].enqueue_ordinal, results[2].enqueue_ordinal
    recorded = "held 3 when it was claimed" if before_v11 else "admission recorded 3"
    assert str(raised.value) == f"work {work_id}: its range [{first}, {last}] holds 2 inputs but {recorded}"
    lost = (pack, results[1].receipt_key)
    damage = [f"D: receipt {lost} is confirmed but has no Event (an acknowledged input was lost)"]
    if not before_v11:
        damage.append(f"P: {work_id} [{first},{last}] has 2 members but admission recorded 3")
    assert sorted(check_invariants(engine)) == damage  # the damage, and nothing else


def _claim_waits_for_a_lock(engine: sa.Engine, claim_thread: threading.Thread) -> bool:
    """Whether the claim is blocked behind the admission's locks (not merely about to be)."""
    if isinstance(engine.dialect, SerializedWriterDialect):  # the whole claim waits for the writer
        return engine.dialect.waiting > 0
    # The lease UPDATE has run for a second while the admission cannot commit: it waits for
    # the generation's row lock (MariaDB lists no InnoDB transaction for it in INNODB_TRX).
    with engine.connect() as connection:
        waiting = connection.exec_driver_sql(
            f"SELECT COUNT(*) FROM {processlist(connection)} WHERE DB = DATABASE()"
            " AND COMMAND = 'Query' AND INFO LIKE 'UPDATE `WorkItem` SET `Attempt`%%' AND TIME >= 1"
        ).scalar_one()
    return bool(waiting)


def test_a_claim_that_waited_for_an_extension_counts_the_extended_range(
    engine: sa.Engine, connectors: Connectors
) -> None:
    """An admission extends a pending generation while a claim of two waits for its row lock.

    On MySQL-protocol servers a statement's subqueries read from one view, taken at its first
    read: the lease UPDATE counts the first generation it leases (in WorkId order), waits for
    the second one's lock, re-reads that row extended, but would count its Events in the view
    from before the wait and miss the extension's input (found by the peer benchmark). The
    recorded count must be the whole range.
    """
    pack = install_pack(engine)
    generations = {lane: connectors.ingest(pack, items=[delivery(lane=lane)])[0] for lane in ("a", "b")}
    lane = max(generations, key=lambda name: str(generations[name].work_id))  # leased second
    extended = str(generations[lane].work_id)
    committing, release = threading.Event(), threading.Event()
    ingest_thread: list[threading.Thread] = []
    claims: list[Claim] = []

    def hold_the_admission_commit(_connection: sa.Connection) -> None:
        if threading.current_thread() in ingest_thread:
            committing.set()
            release.wait(30)

    event.listen(engine, "commit", hold_the_admission_commit)
    extension = threading.Thread(target=lambda: connectors.ingest(pack, items=[delivery(lane=lane)]))
    ingest_thread.append(extension)
    claim_thread = threading.Thread(
        target=lambda: claims.extend(connectors.claim("w", pack_install_ids=[pack], max_items=2))
    )
    try:
        extension.start()
        assert committing.wait(30)
        claim_thread.start()
        wait_until(
            lambda: _claim_waits_for_a_lock(engine, claim_thread),
            "the claim to wait for the admission's locks",
        )
    finally:
        release.set()
        extension.join(30)
        claim_thread.join(30)
        event.remove(engine, "commit", hold_the_admission_commit)

    assert sorted(c.work.work_id for c in claims) == sorted(str(g.work_id) for g in generations.values())
    counts = {c.work.work_id: _claimed_member_count(engine, c.work.work_id) for c in claims}
    assert counts[extended] == 2  # the extension's input counted
    for claim in claims:
        pages = list(connectors.load_inputs(claim.work.work_id, lease_token=claim.lease_token))
        assert pages[-1].member_count == counts[claim.work.work_id]
        connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    assert_invariants(engine)
