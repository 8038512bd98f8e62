"""A claimed generation that lost a member: LoadInputs answers DATA_LOSS, never the remaining members.

The first claim records the generation's member count (WorkItem.ClaimedMemberCount, decision
110) in its lease UPDATE; LoadInputs compares the range with it before answering anything.
"""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.errors import MembershipMissing
from nexuscrm_connectors.service import Connectors
from nexuscrm_schema.tables import Event, WorkItem
from tests.integration.test_claims import CLAIM_STATEMENTS
from tests.integration.test_index_plans import capture
from tests.support.factories import FakeClock, delivery, install_pack
from tests.support.invariants import assert_invariants, check_invariants
from workqueue.errors import ErrorKind

pytestmark = pytest.mark.database


def _claimed_member_count(engine: sa.Engine, work_id: str) -> int | None:
    with engine.connect() as connection:
        value = connection.execute(
            sa.select(WorkItem.c.ClaimedMemberCount).where(WorkItem.c.WorkId == work_id)
        ).scalar_one()
    return None if value is None else int(value)


def _lose(engine: sa.Engine, pack: str, ordinal: int) -> None:
    with engine.begin() as connection:
        connection.execute(sa.delete(Event).where(Event.c.PackInstallId == pack, Event.c.EnqueueOrdinal == ordinal))


def test_the_first_claim_records_the_member_count_in_its_constant_statements(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    results = connectors.ingest(pack, items=[delivery(lane="a"), delivery(lane="b"), delivery(lane="a")])
    assert _claimed_member_count(engine, str(results[0].work_id)) is None  # unclaimed: the range may still grow
    with capture(engine) as captured:
        claims = connectors.claim("w", pack_install_ids=[pack], max_items=2)
    statements = [c.statement.split()[0].upper() for c in captured if c.statement != "BEGIN IMMEDIATE"]
    assert statements == CLAIM_STATEMENTS
    counts = {c.work.work_id: _claimed_member_count(engine, c.work.work_id) for c in claims}
    assert counts == {str(results[0].work_id): 2, str(results[1].work_id): 1}
    for claim in claims:
        list(connectors.load_inputs(claim.work.work_id, lease_token=claim.lease_token))
        connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    assert_invariants(engine)


@pytest.mark.parametrize("reclaimed", [False, True])
def test_a_lost_middle_member_answers_data_loss(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock, reclaimed: bool
) -> None:
    pack = install_pack(engine)
    results = connectors.ingest(pack, items=[delivery(lane="a") for _ in range(3)])
    work_id = str(results[0].work_id)
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
    assert (
        str(raised.value)
        == f"work {work_id}: its range [{first}, {last}] holds 2 inputs but held 3 when it was claimed"
    )
    lost = (pack, results[1].receipt_key)
    assert sorted(check_invariants(engine)) == [  # the damage, and nothing else
        f"D: receipt {lost} is confirmed but has no Event (an acknowledged input was lost)",
    ]
