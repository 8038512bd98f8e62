"""Crash safety: SIGKILL the Connectors process at each fault point under concurrent load.

After a restart, clients retry every delivery whose outcome they did not see (same receipt
keys, same payloads) and workers drain the queue. Then: no acknowledged receipt is lost,
every input is in exactly one generation, no input was executed by two completed
generations, and the invariants M, O, B, D, X, P hold.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import sqlalchemy as sa

from nexuscrm_runtime.database import create_engine
from nexuscrm_schema.tables import Event, WorkItem
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_sdk.flows import Generation
from nexuscrm_sdk.worker import Worker
from nexuscrm_tools.launcher import (
    CONNECTORS,
    SCHEMA_CATALOG,
    ServiceProcess,
    start_service,
    start_services,
    stop_services,
)
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants
from workqueue import WorkStatus
from workqueue.values import ACKNOWLEDGED_OUTCOMES, IngestItem

pytestmark = [pytest.mark.database, pytest.mark.acceptance]

FAULT_POINTS = ["admission:before_commit", "admission:after_commit", "claim:before_commit", "complete:after_commit"]
CLIENTS, BATCHES, PER_BATCH = 3, 6, 10


class Cluster:
    """Schema catalog plus a Connectors process that can be killed and restarted."""

    def __init__(self, dsn: str, workdir: Path, fault: str) -> None:
        self.dsn, self.workdir = dsn, workdir
        self.env = {"NEXUSCRM_DSN": dsn, "NEXUSCRM_MATERIALIZE_INTERVAL_SECONDS": "0"}
        self.catalog, self.connectors = start_services(
            [SCHEMA_CATALOG, CONNECTORS],
            env={**self.env, "NEXUSCRM_FAULTS_ENABLED": "1", "NEXUSCRM_FAULTS": f"{fault}=kill"},
            workdir=workdir,
        )
        self.restarted = threading.Event()
        self.lock = threading.Lock()

    def address(self) -> str:
        return self.connectors.address

    def restart_when_dead(self, errors: list[BaseException]) -> None:
        """Wait for the fault to kill Connectors, then start a clean one."""
        try:
            self.connectors.process.wait(timeout=120)
            assert self.connectors.process.returncode == -9, "Connectors was not SIGKILLed at the fault point"
            with self.lock:
                self.connectors = start_service(CONNECTORS, env=self.env, workdir=self.workdir)
        except BaseException as error:
            errors.append(error)
        finally:
            self.restarted.set()

    def services(self) -> list[ServiceProcess]:
        return [self.catalog, self.connectors]


def call_until_done(cluster: Cluster, call):  # type: ignore[no-untyped-def]
    """Retry a call across the crash: an UNAVAILABLE outcome is unknown, so try again."""
    while True:
        try:
            with grpc.insecure_channel(cluster.address()) as channel:
                return call(ConnectorsClient(channel, timeout=dt.timedelta(seconds=10)))
        except grpc.RpcError as error:
            if error.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
            assert cluster.restarted.wait(timeout=120), "Connectors did not come back"


@pytest.fixture(params=FAULT_POINTS)
def cluster(request: pytest.FixtureRequest, empty_dsn: str, tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(empty_dsn, tmp_path, request.param)
    try:
        yield cluster
    finally:
        stop_services(cluster.services())


def test_sigkill_at_each_fault_point_loses_nothing(cluster: Cluster) -> None:
    engine = create_engine(cluster.dsn)
    pack = install_pack(engine)
    acknowledged: set[str] = set()
    errors: list[BaseException] = []
    reviver = threading.Thread(target=cluster.restart_when_dead, args=(errors,))
    reviver.start()
    executed: set[tuple[str, int]] = set()  # (WorkId, ordinal) of every input a Flow ran
    lock = threading.Lock()

    def client(n: int) -> None:
        try:
            for b in range(BATCHES):
                items: list[IngestItem] = [
                    delivery(f"c{n}-{b}-{i}", lane=f"lane-{i % 4}", payload=f"c{n}-{b}-{i}".encode())
                    for i in range(PER_BATCH)
                ]
                results = call_until_done(cluster, lambda c, items=items: c.ingest(pack, items=items))
                with lock:
                    acknowledged.update(r.receipt_key for r in results if r.outcome in ACKNOWLEDGED_OUTCOMES)
        except BaseException as error:
            errors.append(error)

    def flow(generation: Generation) -> None:
        ran = {(generation.work.work_id, i.enqueue_ordinal) for i in generation.inputs}
        with lock:
            executed.update(ran)

    def worker() -> None:
        try:
            while not cluster.restarted.is_set() or any(t.is_alive() for t in clients):
                call_until_done(
                    cluster,
                    lambda c: Worker(
                        c, flow, worker_id="w", pack_install_ids=[pack], lease=dt.timedelta(seconds=2)
                    ).run_once(),
                )
        except BaseException as error:
            errors.append(error)

    clients = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
    workers = [threading.Thread(target=worker) for _ in range(2)]
    for t in clients + workers:
        t.start()
    for t in clients + workers:
        t.join()
    reviver.join()
    assert not errors, errors
    # Drain: leases taken by the killed process expire; the work is taken over.
    drain = Worker(
        ConnectorsClient(grpc.insecure_channel(cluster.address())),
        flow,
        worker_id="drain",
        pack_install_ids=[pack],
        lease=dt.timedelta(seconds=2),
    )
    while True:
        with engine.connect() as connection:
            open_work = connection.execute(
                sa.select(sa.func.count())
                .select_from(WorkItem)
                .where(WorkItem.c.Status.not_in([WorkStatus.COMPLETED, WorkStatus.FAILED]))
            ).scalar_one()
        if not open_work:
            break
        drain.run_once()

    keys = {f"c{n}-{b}-{i}" for n in range(CLIENTS) for b in range(BATCHES) for i in range(PER_BATCH)}
    assert acknowledged == keys  # every delivery was eventually acknowledged
    with engine.connect() as connection:
        events = dict(connection.execute(sa.select(Event.c.ReceiptKey, Event.c.EnqueueOrdinal)).all())
    assert set(events) == keys  # 0 acknowledged receipts lost, none admitted twice
    with engine.connect() as connection:
        statuses = set(connection.execute(sa.select(WorkItem.c.Status)).scalars())
    assert statuses == {WorkStatus.COMPLETED}  # every generation that ran an input completed
    # Every input ran, in exactly one generation; an attempt cut off by the crash may have run it
    # once more, but in that same generation.
    runners: dict[int, set[str]] = {}
    for work_id, ordinal in executed:
        runners.setdefault(ordinal, set()).add(work_id)
    assert {ordinal: len(work_ids) for ordinal, work_ids in runners.items()} == dict.fromkeys(events.values(), 1)
    assert_invariants(engine)
    engine.dispose()
