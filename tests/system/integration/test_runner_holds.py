"""``nexuscrm-run`` knows the "block" order policy's holds (decision 165): what it reads on the real database.

The runner's wait ends once no generation can run: a pending generation held behind a dead
letter is not one. Its read (``demo_queries.work_items_held``) must name the same generations
Connectors' claim refuses, each with the dead letter it is blocked behind. Two owners' code
(Connectors writes, the tools read), so a system test (decision 146).
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.operating.order_policy import Policy
from nexuscrm_tools import demo_queries
from nexuscrm_tools.run_outcome import Ending, ending, held_problems
from tests.support.factories import FakeClock, delivery, install_pack
from tests.support.invariants import assert_invariants

pytestmark = pytest.mark.database


def test_the_runner_reads_held_generations_and_ends_with_them_named(engine: sa.Engine) -> None:
    connectors = Connectors(engine, clock=FakeClock())
    pack = install_pack(engine)
    connectors.set_order_policy(pack, Policy.BLOCK, set_by="ops", reason="ledger order")
    connectors.ingest(pack, items=[delivery(lane="a"), delivery(lane="b")])
    claims = connectors.claim("w", pack_install_ids=[pack], max_items=10)
    (first,) = [c for c in claims if c.work.projection_key.endswith(":a")]
    (successor,) = [r.work_id for r in connectors.ingest(pack, items=[delivery(lane="a")])]
    connectors.fail(first.work.work_id, lease_token=first.lease_token, error="boom", retryable=False)
    with engine.connect() as connection:
        held = demo_queries.work_items_held(connection, pack)
        counts = demo_queries.work_item_status_counts(connection, pack)
    assert held == [(successor, first.work.work_id)]
    # lane b still runs: the wait goes on
    assert ending(delivered=True, projected=False, counts=counts, host_running=True, held=len(held)) is None
    (lane_b,) = [c for c in claims if c is not first]
    connectors.complete(lane_b.work.work_id, lease_token=lane_b.lease_token)
    assert connectors.claim("w", pack_install_ids=[pack], max_items=10) == []  # the claim agrees: held
    with engine.connect() as connection:
        held = demo_queries.work_items_held(connection, pack)
        counts = demo_queries.work_item_status_counts(connection, pack)
    assert ending(delivered=True, projected=False, counts=counts, host_running=True, held=len(held)) is Ending.STUCK
    (problem,) = held_problems(held)
    assert problem.startswith(f"1 generation blocked behind {first.work.work_id}: held by order policy block")
    # Once skipped, nothing is held and the successor can run: the runner waits for it again.
    connectors.skip_dead_letter(first.work.work_id, skipped_by="ops", reason="fixed upstream")
    with engine.connect() as connection:
        assert demo_queries.work_items_held(connection, pack) == []
    (released,) = connectors.claim("w", pack_install_ids=[pack])
    assert released.work.work_id == successor
    connectors.complete(released.work.work_id, lease_token=released.lease_token)
    assert_invariants(engine)
