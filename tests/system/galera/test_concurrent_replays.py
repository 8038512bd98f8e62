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

import threading

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.dead_letters import ReplayVerdict, filter_of
from nexuscrm_connectors.service import Connectors
from nexuscrm_connectors.settings import Settings
from nexuscrm_runtime.database import create_engine
from nexuscrm_schema.tables import WorkItem
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

DEAD_LETTERS = 40  # one per lane
PAGE_SIZES = (5, 7)  # each node's bulk replay pages: overlapping windows of the same dead letters


def _replays_seen(engine: sa.Engine, pack: str, count: int) -> bool:
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
        wait_until(lambda: _replays_seen(engines[1], pack, DEAD_LETTERS), "every failure applied on node 2")

        start = threading.Barrier(2)
        verdicts: list[list[tuple[str, ReplayVerdict]]] = [[], []]
        errors: list[BaseException] = []

        def bulk(side: int) -> None:
            start.wait()
            token = ""
            try:
                while True:
                    page = replicas[side].replay_dead_letters(
                        pack, filter_of(pack), dry_run=False, max_generations=PAGE_SIZES[side], page_token=token
                    )
                    verdicts[side] += [(a.work_id, a.verdict) for a in page.answers]
                    token = page.next_page_token
                    if not token:
                        return
            except BaseException as error:  # asserted below: no call may fail
                errors.append(error)

        done = threading.Event()

        def run_replays() -> None:
            # A worker on node 1 completes each replay as soon as it is queued: "already replayed"
            # must hold for a finished replay too, not only a live one.
            try:
                while not done.is_set():
                    for claim in replicas[0].claim("fixed", pack_install_ids=[pack], max_items=20):
                        replicas[0].complete(claim.work.work_id, lease_token=claim.lease_token)
            except BaseException as error:  # asserted below
                errors.append(error)

        threads = [threading.Thread(target=bulk, args=(side,)) for side in (0, 1)]
        worker = threading.Thread(target=run_replays)
        worker.start()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        done.set()
        worker.join()

        assert errors == []
        replayed = sorted(w for side in verdicts for w, verdict in side if verdict is ReplayVerdict.REPLAYED)
        with engines[0].connect() as connection:
            connection.exec_driver_sql("SET SESSION wsrep_sync_wait = 1")
            dead = sorted(
                connection.execute(
                    sa.select(WorkItem.c.WorkId).where(WorkItem.c.PackInstallId == pack, WorkItem.c.Status == "failed")
                ).scalars()
            )
            per_dead_letter = {
                work_id: int(count)
                for work_id, count in connection.execute(
                    sa.select(WorkItem.c.ReplayOfWorkId, sa.func.count())
                    .where(WorkItem.c.PackInstallId == pack, WorkItem.c.ReplayOfWorkId.is_not(None))
                    .group_by(WorkItem.c.ReplayOfWorkId)
                )
            }
        assert replayed == dead  # each replayed by exactly one of the two nodes
        assert per_dead_letter == dict.fromkeys(dead, 1)
        assert_invariants(engines[0])
    finally:
        for engine in engines:
            engine.dispose()
