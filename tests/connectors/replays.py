"""Two bulk replays racing a worker: the race issue 49 saw, for the in-process and the Galera tiers."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.operating.dead_letters import NothingMatches, Verdict, filter_of
from nexuscrm_schema.tables import WorkItem


def race_bulk_replays(replicas: Sequence[Connectors], pack: str, page_sizes: Sequence[int]) -> list[str]:
    """Replay ``pack``'s dead letters through each replica at once, page by page; the WorkIds answered replayed.

    ``page_sizes`` (one per replica) differ, so the bulk replays' pages overlap. Meanwhile a
    worker on the first replica completes each replay as soon as it is queued: "already
    replayed" must hold for a finished replay too, not only a live one. Fails on any error.
    """
    start = threading.Barrier(len(replicas))
    replayed: list[str] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def bulk(replica: Connectors, size: int) -> None:
        start.wait()
        token = ""
        try:
            while True:
                try:
                    page = replica.replay_dead_letters(
                        pack, filter_of(pack), dry_run=False, max_generations=size, page_token=token
                    )
                except NothingMatches:  # the other bulk replays took every dead letter before this one looked
                    return
                replayed.extend(a.work_id for a in page.answers if a.verdict is Verdict.REPLAYED)
                token = page.next_page_token
                if not token:
                    return
        except BaseException as error:  # asserted below: no call may fail
            errors.append(error)

    def run_replays() -> None:
        try:
            while not done.is_set():
                for claim in replicas[0].claim("fixed", pack_install_ids=[pack], max_items=20):
                    replicas[0].complete(claim.work.work_id, lease_token=claim.lease_token)
        except BaseException as error:  # asserted below
            errors.append(error)

    threads = [threading.Thread(target=bulk, args=pair) for pair in zip(replicas, page_sizes, strict=True)]
    worker = threading.Thread(target=run_replays)
    worker.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    worker.join()
    assert errors == []
    return sorted(replayed)


def replays_per_work(connection: sa.Connection, pack: str) -> dict[str, int]:
    """How many replays each replayed WorkId of ``pack`` has."""
    rows = connection.execute(
        sa.select(WorkItem.c.ReplayOfWorkId, sa.func.count())
        .where(WorkItem.c.PackInstallId == pack, WorkItem.c.ReplayOfWorkId.is_not(None))
        .group_by(WorkItem.c.ReplayOfWorkId)
    )
    return {str(work_id): int(count) for work_id, count in rows}
