"""The liveness backstop: a generation blocked behind a terminal predecessor becomes claimable.

On one server the completion that makes a predecessor terminal unblocks its successor in the
same transaction, so the stranded state is built directly here: the state a multi-primary
write skew left before decision 106 (tests/system/galera reproduces the race itself).
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from prometheus_client import REGISTRY

from nexuscrm_connectors.facade import Connectors
from nexuscrm_schema.tables import WorkItem
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants
from workqueue import WorkStatus

pytestmark = pytest.mark.database

HEALED = "nexuscrm_stranded_generations_healed_total"


def _healed() -> float:
    return REGISTRY.get_sample_value(HEALED) or 0.0


def test_a_successor_blocked_behind_a_completed_predecessor_is_healed(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    first = connectors.ingest(pack, items=[delivery(lane="a")])[0].work_id
    [claim] = connectors.claim("w", pack_install_ids=[pack])
    successor = connectors.ingest(pack, items=[delivery(lane="a")])[0].work_id
    with engine.begin() as connection:  # it is blocked and linked on its predecessor
        assert connection.execute(sa.select(WorkItem.c.SuccessorWorkId).where(WorkItem.c.WorkId == first)).scalar() == (
            successor
        )
        # The skew of issue 14: the predecessor completed without seeing its successor.
        connection.execute(
            sa.update(WorkItem)
            .where(WorkItem.c.WorkId == claim.work.work_id)
            .values(Status=WorkStatus.COMPLETED, ClaimableAt=None, SuccessorWorkId=None)
        )
    assert connectors.get_work(successor).work.status is WorkStatus.BLOCKED
    assert connectors.claim("w", pack_install_ids=[pack]) == []  # stranded: nothing would ever run it

    before = _healed()
    assert connectors.heal_stranded() == 1
    assert _healed() == before + 1
    assert connectors.heal_stranded() == 0  # a second pass finds nothing

    [healed] = connectors.claim("w", pack_install_ids=[pack])
    assert healed.work.work_id == successor
    connectors.complete(successor, lease_token=healed.lease_token)
    assert_invariants(engine)


def test_the_sweep_leaves_a_successor_of_running_work_blocked(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane="a")])
    [claim] = connectors.claim("w", pack_install_ids=[pack])
    successor = connectors.ingest(pack, items=[delivery(lane="a")])[0].work_id
    assert connectors.heal_stranded() == 0
    assert connectors.get_work(successor).work.status is WorkStatus.BLOCKED
    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)  # unblocks it by its link
    assert connectors.get_work(successor).work.status is WorkStatus.PENDING
    assert_invariants(engine)


def test_the_sweep_reads_a_bounded_page_per_pass(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane=f"l{n}") for n in range(5)])
    claims = connectors.claim("w", pack_install_ids=[pack], max_items=5)
    connectors.ingest(pack, items=[delivery(lane=f"l{n}") for n in range(5)])
    with engine.begin() as connection:
        connection.execute(
            sa.update(WorkItem)
            .where(WorkItem.c.WorkId.in_([c.work.work_id for c in claims]))
            .values(Status=WorkStatus.COMPLETED, ClaimableAt=None, SuccessorWorkId=None)
        )
    connectors.stranded = type(connectors.stranded)(limit=2)
    assert [connectors.heal_stranded() for _ in range(4)] == [2, 2, 1, 0]
    assert_invariants(engine)
