"""A worker whose host clock is off by more than its lease keeps its leases and reports the skew (decision 119)."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from nexuscrm_schema.tables import WorkItem
from nexuscrm_sdk.flows import Generation
from nexuscrm_sdk.worker import Worker
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants
from tests.support.waiting import wait_until
from workqueue import WorkStatus

SKEW = dt.timedelta(seconds=90)
LEASE = dt.timedelta(seconds=3)  # a heartbeat every second


def lease_expiry(engine: sa.Engine, work_id: str) -> dt.datetime:
    with engine.connect() as connection:
        expiry: dt.datetime = connection.execute(
            sa.select(WorkItem.c.LeaseExpiresAt).where(WorkItem.c.WorkId == work_id)
        ).scalar_one()
        return expiry


def test_a_worker_ahead_by_more_than_its_lease_keeps_it_and_reports_the_skew(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    (admitted,) = connectors.ingest(pack, items=[delivery()])
    work_id = str(admitted.work_id)
    renewals: list[bool] = []

    def flow(generation: Generation) -> None:
        list(generation.inputs)
        granted = lease_expiry(engine, work_id)
        # The heartbeat's cadence comes from the lease's duration: this host's clock, which says
        # the lease expired long ago, neither stops nor hurries it.
        renewals.append(wait_until(lambda: lease_expiry(engine, work_id) > granted, "a heartbeat to renew the lease"))

    worker = Worker(
        connectors,
        flow,
        worker_id="skewed",
        pack_install_ids=[pack],
        lease=LEASE,
        wall_clock=lambda: dt.datetime.now(dt.UTC) + SKEW,
    )
    assert worker.stats.clock_skew is None
    assert worker.run_once()
    assert worker.stats.completed == 1 and len(renewals) == 1
    assert connectors.get_work(work_id).work.status == WorkStatus.COMPLETED
    measured = worker.stats.clock_skew
    assert measured is not None and abs(measured - SKEW) < dt.timedelta(seconds=5), measured
    assert_invariants(engine)
