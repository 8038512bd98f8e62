"""Seeded ingest clients and workers that record every call as a history (tests/connectors/reliability/history.py).

Ingest clients deliver seeded batches and retry the unacknowledged receipts of a batch
(same keys, same payloads) until all are acknowledged; workers claim, load and complete
(sometimes fail, sometimes stall past their lease) until the clients are done and the queue
is drained. The fault-injecting threads of a test run beside them. The history test and the
database-restart test share this load; ``NEXUSCRM_RELIABILITY_FULL=1`` scales it up.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa

from nexuscrm_runtime.clock import utcnow
from nexuscrm_schema.tables import WorkItem
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_wire.timestamps import naive_utc
from tests.connectors.reliability.history import (
    History,
    OpOutcome,
    acknowledged_receipts,
    check_history,
    unexpected_statuses,
)
from tests.support.factories import install_pack, route
from tests.system.reliability.conftest import FULL, ConnectorsCluster
from workqueue.statuses import TERMINAL_WORK_STATUSES
from workqueue.values import ACKNOWLEDGED_OUTCOMES, IngestItem

CLIENTS, RECEIPTS_PER_CLIENT, WORKERS = (4, 250, 3) if FULL else (3, 60, 2)
LANES = 6
LEASE_SECONDS = 3
RETRY_PAUSE = 0.05  # seconds between retries of a cut-off call (backoff, not synchronization)
DRAIN_SECONDS = 120.0
# The Connectors settings the workload needs on top of a test's own.
WORKLOAD_ENV = {
    "NEXUSCRM_MATERIALIZE_INTERVAL_SECONDS": "1",
    "NEXUSCRM_MAX_ATTEMPTS": "50",  # stalls, failures and outages must not fail work for good
    "NEXUSCRM_RETRY_BASE_SECONDS": "1",
    "NEXUSCRM_RETRY_MAX_SECONDS": "1",
}
# What a caller may see instead of OK: a retryable status where the database or an injected
# fault failed under the call, and, for calls that present a lease, FAILED_PRECONDITION for a
# stale one (it ran out during a stall or an outage, or a retried call had already finished it).
RETRYABLE = frozenset({"UNAVAILABLE", "ABORTED", "DEADLINE_EXCEEDED"})
ALLOWED_STATUSES = {f: RETRYABLE | {"FAILED_PRECONDITION"} for f in ("load", "complete", "fail")}


def loaded_ordinals(connectors: ConnectorsClient, key: tuple[str, str]) -> list[int]:
    """Stream a held generation's members; their ordinals in order."""
    work_id, token = key
    return [row.enqueue_ordinal for page in connectors.load_inputs(work_id, lease_token=token) for row in page.inputs]


def guarded_thread(
    body: Callable[..., None], errors: list[BaseException], stop: threading.Event, *args: Any
) -> threading.Thread:
    """A daemon thread running ``body(*args)``; an error goes to ``errors`` and sets ``stop``."""

    def run() -> None:
        try:
            body(*args)
        except BaseException as error:
            errors.append(error)
            stop.set()

    return threading.Thread(target=run, daemon=True)


class Workload:
    """One seeded run of clients and workers on a new pack, recorded in ``history``.

    A subclass may change the counts, bound the clients' delivery in time
    (``ingest_seconds``: no new batch after it, the batch in hand is still retried until
    acknowledged) and choose which service each client and worker talks to (``connect``).
    """

    clients = CLIENTS
    workers = WORKERS
    receipts_per_client = RECEIPTS_PER_CLIENT
    ingest_seconds: float | None = None  # seconds; None: every batch is delivered

    def __init__(self, cluster: ConnectorsCluster, seed: int) -> None:
        self.cluster = cluster
        self.seed = seed
        self.history = History()
        self.pack = install_pack(cluster.admin)
        self.clients_done = threading.Event()
        self.stop = threading.Event()
        self.errors: list[BaseException] = []

    def batches(self, client: int) -> list[list[IngestItem]]:
        """The seeded deliveries of one client: batches of 1-8 over LANES lanes."""
        rng = random.Random(f"{self.seed}-client-{client}")
        items = [
            IngestItem(
                receipt_key=f"s{self.seed}-c{client}-{n}",
                route=route(f"lane-{rng.randrange(LANES)}"),
                payload=f"seed {self.seed} client {client} input {n}".encode(),
            )
            for n in range(self.receipts_per_client)
        ]
        batches = []
        while items:
            size = rng.randint(1, 8)
            batches.append(items[:size])
            items = items[size:]
        return batches

    def guarded(self, body: Callable[..., None], *args: Any) -> threading.Thread:
        """A thread running ``body``; an error stops the whole run and is kept for the test."""
        return guarded_thread(body, self.errors, self.stop, *args)

    def connect(self, role: str, n: int) -> contextlib.AbstractContextManager[ConnectorsClient]:
        """The client that ingest client or worker ``n`` (``role``) calls through: the cluster's one service."""
        return self.cluster.client()

    def ingest_client(self, client: int) -> None:
        """Deliver every batch; retry the unacknowledged receipts of a batch until all are acknowledged."""
        until = None if self.ingest_seconds is None else time.monotonic() + self.ingest_seconds
        with self.connect("client", client) as connectors:
            for batch in self.batches(client):
                if until is not None and time.monotonic() > until:
                    return
                waiting = {item.receipt_key: item for item in batch}
                while waiting and not self.stop.is_set():
                    items = list(waiting.values())
                    op = self.history.call(
                        f"client-{client}",
                        "ingest",
                        tuple((i.receipt_key, i.payload) for i in items),
                        functools.partial(connectors.ingest, self.pack, items=items),
                    )
                    if op.ok:
                        for result in op.result:
                            if result.outcome in ACKNOWLEDGED_OUTCOMES:
                                waiting.pop(result.receipt_key)
                    if waiting:
                        self.stop.wait(RETRY_PAUSE)

    def worker(self, n: int) -> None:
        """Claim, load and finish until the clients are done and nothing is left to run."""
        rng = random.Random(f"{self.seed}-worker-{n}")
        name = f"worker-{n}"
        with self.connect("worker", n) as connectors:
            while not self.stop.is_set() and not (self.clients_done.is_set() and self.drained()):
                op = self.history.call(
                    name,
                    "claim",
                    name,
                    lambda: connectors.claim(
                        name, pack_install_ids=[self.pack], lease=dt.timedelta(seconds=LEASE_SECONDS)
                    ),
                )
                if not op.ok or not op.result:
                    self.stop.wait(RETRY_PAUSE)
                    continue
                (claim,) = op.result
                key = (claim.work.work_id, claim.lease_token)
                load = self.history.call(
                    name,
                    "load",
                    key,
                    functools.partial(loaded_ordinals, connectors, key),
                )
                roll = rng.random()
                if not load.ok or roll < 0.05:
                    self.finish(connectors, name, "fail", key)
                    continue
                if roll < 0.10:  # a stalled worker: wake up after its lease ran out
                    self.stop.wait(max(0.0, (naive_utc(claim.work.lease_expires_at) - utcnow()).total_seconds()) + 0.1)
                self.finish(connectors, name, "complete", key)

    def finish(self, connectors: ConnectorsClient, name: str, f: str, key: tuple[str, str]) -> None:
        """Complete or fail with the claim's token, again after a cut-off answer, until a definite one."""
        work_id, token = key
        while not self.stop.is_set():
            if f == "complete":
                op = self.history.call(name, f, key, lambda: connectors.complete(work_id, lease_token=token))
            else:
                op = self.history.call(
                    name,
                    f,
                    key,
                    lambda: connectors.fail(work_id, lease_token=token, error="injected by the history test"),
                )
            if op.outcome is not OpOutcome.UNKNOWN:
                return
            self.stop.wait(RETRY_PAUSE)

    def drained(self) -> bool:
        """True when every generation of the pack is terminal."""
        with self.cluster.admin.connect() as connection:
            statuses = connection.execute(sa.select(WorkItem.c.Status).where(WorkItem.c.PackInstallId == self.pack))
            return all(status in TERMINAL_WORK_STATUSES for status in statuses.scalars())

    def run(self, others: Sequence[threading.Thread]) -> None:
        """Run clients, workers and ``others`` (which end once ``clients_done`` is set) until drained."""
        clients = [self.guarded(self.ingest_client, n) for n in range(self.clients)]
        workers = [self.guarded(self.worker, n) for n in range(self.workers)]
        for thread in [*clients, *workers, *others]:
            thread.start()
        for thread in clients:
            thread.join()
        self.clients_done.set()
        for thread in others:
            thread.join()
        for thread in workers:
            thread.join(DRAIN_SECONDS)
        self.stop.set()
        assert not any(t.is_alive() for t in workers), "the queue did not drain"
        assert not self.errors, self.errors

    def violations(self) -> list[str]:
        """The history checker's findings, statuses outside ``ALLOWED_STATUSES``, receipts never acknowledged."""
        history = self.history
        violations = check_history(history, self.cluster.admin, lease_seconds=LEASE_SECONDS)
        strange = unexpected_statuses(history, ALLOWED_STATUSES, RETRYABLE)
        violations += [f"status {status} answered {n} times" for status, n in strange.items()]
        unacknowledged = self.sent() - acknowledged_receipts(history)
        if unacknowledged:
            violations.append(f"{len(unacknowledged)} receipts never acknowledged")
        return violations

    def sent(self) -> set[str]:
        """Every receipt key some ingest call sent."""
        return {key for op in self.history.ops("ingest") for key, _ in op.value}
