"""Two bulk replays through two Galera nodes at once replay each dead letter once (issue 49, decision 173).

Two operators (or two Connectors replicas) replay the same pack's dead letters at the same
instant, each through a Connectors writing through its own node, with different page sizes so
their pages overlap, while a worker completes each replay as soon as it is queued. Replay
decides "already replayed" under the pack's row lock, which every replay writes: on a
multi-primary engine the two transactions that replay one dead letter conflict at commit, the
loser runs again and is refused. Each dead letter ends with exactly one replay, whichever node
replayed it; no call fails.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.settings import Settings
from nexuscrm_runtime.database import create_engine
from nexuscrm_schema.tables import WorkItem
from tests.connectors.replays import race_bulk_replays, replays_per_work
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

DEAD_LETTERS = 40  # one per lane
PAGE_SIZES = (5, 7)  # each node's bulk replay pages: overlapping windows of the same dead letters


def _failures_seen(engine: sa.Engine, pack: str, count: int) -> bool:
    with engine.connect() as connection:
        connection.exec_driver_sql("SET SESSION wsrep_sync_wait = 1")  # everything committed anywhere
        seen = connection.execute(
            sa.select(sa.func.count())
            .select_from(WorkItem)
            .where(WorkItem.c.PackInstallId == pack, WorkItem.c.Status == "failed")
        ).scalar_one()
    return int(seen) == count


def test_two_bulk_replays_through_two_nodes_replay_each_dead_letter_once(node_dsns: list[str]) -> None:
    engines = [create_engine(dsn) for dsn in node_dsns[:2]]
    try:
        pack = install_pack(engines[0])
        replicas = [Connectors(engine, Settings()) for engine in engines]
        replicas[0].ingest(pack, items=[delivery(lane=f"lane-{n}") for n in range(DEAD_LETTERS)])
        while claims := replicas[0].claim("w", pack_install_ids=[pack], max_items=50):
            for claim in claims:
                replicas[0].fail(claim.work.work_id, lease_token=claim.lease_token, error="boom", retryable=False)
        wait_until(lambda: _failures_seen(engines[1], pack, DEAD_LETTERS), "every failure applied on node 2")

        replayed = race_bulk_replays(replicas, pack, PAGE_SIZES)
        with engines[0].connect() as connection:
            connection.exec_driver_sql("SET SESSION wsrep_sync_wait = 1")
            dead = sorted(
                connection.execute(
                    sa.select(WorkItem.c.WorkId).where(WorkItem.c.PackInstallId == pack, WorkItem.c.Status == "failed")
                ).scalars()
            )
            per_dead_letter = replays_per_work(connection, pack)
        assert replayed == dead  # each replayed by exactly one of the two nodes
        assert per_dead_letter == dict.fromkeys(dead, 1)
        assert_invariants(engines[0])
    finally:
        for engine in engines:
            engine.dispose()
