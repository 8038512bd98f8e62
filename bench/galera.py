"""Section galera: admission and end-to-end throughput with 1 writer node vs 3 (issue 14 item 5).

Starts its own throwaway 3-node Galera cluster on loopback (``tests.support.galera``; the
server of ``NEXUSCRM_BENCH_DSN`` is not used) and five Connectors processes: three on
node 1 and one each on nodes 2 and 3. Both topologies run three replicas, so only the
number of writer nodes differs: "1 node" is the three replicas of node 1, "3 nodes" is one
replica per node. Runs alternate (1 node, 3 nodes, 3 nodes with pack affinity, and again),
each on a fresh pack, and the report gives every run.

- Admission: ``CLIENTS`` threads (spread over the replicas) send batches of ``BATCH`` fresh
  deliveries over ``IDENTITIES`` identities of one pack for ``ADMISSION_SECONDS``; inputs
  admitted per second, and calls refused ABORTED after their retries.
- Pack affinity (3 nodes): three packs, client n's pack only ever written through
  replica n, against the same clients all sending to one pack through every replica.
- End to end: ``E2E_INPUTS`` inputs sent by the clients while one worker per replica claims
  (8 at a time), loads and completes; inputs per second from the first send until every
  generation of the pack is terminal.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc
import sqlalchemy as sa

from bench import seed
from bench.environment import Backend, Report
from nexuscrm_runtime.database import create_engine
from nexuscrm_schema.tables import WorkItem
from nexuscrm_schema_catalog import migrations
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_tools.launcher import CONNECTORS, ServiceProcess, start_services, stop_services
from tests.support.factories import install_pack
from tests.support.galera import galera_cluster
from workqueue.statuses import TERMINAL_WORK_STATUSES
from workqueue.values import Outcome

SECTION = "galera"
CLIENTS = 6  # ingest threads, two per replica
BATCH = 50  # deliveries per call
IDENTITIES = 200  # projection identities of a pack
WORKERS_PER_REPLICA = 1
CLAIM_ITEMS = 8  # generations per claim
ADMISSION_SECONDS, E2E_INPUTS, ROUNDS = 8.0, 6_000, 2
QUICK = (5.0, 2_400, 1)  # admission seconds, end-to-end inputs, rounds with --quick
DRAIN_TIMEOUT = 300.0  # seconds an end-to-end run may take to drain
SERVICE_ENV = {"NEXUSCRM_MATERIALIZE_INTERVAL_SECONDS": "5"}


@contextlib.contextmanager
def _replicas(workdir: Path) -> Iterator[tuple[list[ServiceProcess], list[ServiceProcess], sa.Engine]]:
    """A cluster, a migrated database, (replicas on node 1, one replica per node) and an engine on node 1."""
    with galera_cluster() as cluster:
        dsns = cluster.create_database("nxbench_galera")
        engine = create_engine(dsns[0])
        migrations.apply_schema(engine)
        services: list[ServiceProcess] = []
        try:
            for n, dsn in enumerate([dsns[0], dsns[0], dsns[0], dsns[1], dsns[2]]):
                services += start_services(
                    [CONNECTORS], env={"NEXUSCRM_DSN": dsn, **SERVICE_ENV}, workdir=workdir / f"replica{n}"
                )
            yield services[:3], [services[0], services[3], services[4]], engine
        finally:
            stop_services(services)
            engine.dispose()


@contextlib.contextmanager
def _clients(replicas: Sequence[ServiceProcess]) -> Iterator[list[ConnectorsClient]]:
    with contextlib.ExitStack() as stack:
        channels = [stack.enter_context(grpc.insecure_channel(r.address)) for r in replicas]
        yield [ConnectorsClient(channel, timeout=dt.timedelta(seconds=60)) for channel in channels]


def _admission(replicas: Sequence[ServiceProcess], packs: Sequence[str], seconds: float, tag: str) -> tuple[float, int]:
    """Inputs admitted per second by ``CLIENTS`` threads for ``seconds``; client n sends to packs[n % len]."""
    admitted, aborted = Counter[int](), Counter[int]()
    until = time.monotonic() + seconds

    def client(n: int, connectors: ConnectorsClient) -> None:
        pack = packs[n % len(packs)]
        for b in itertools.count():
            if time.monotonic() > until:
                return
            items = seed.batch(f"{tag}-{n}-{b}", BATCH, IDENTITIES, offset=n * BATCH)
            try:
                results = connectors.ingest(pack, items=items)
            except grpc.RpcError as error:
                if error.code() is not grpc.StatusCode.ABORTED:
                    raise
                aborted[n] += 1
                continue
            admitted[n] += sum(r.outcome is Outcome.ADMITTED for r in results)

    with _clients(replicas) as connectors:
        started = time.monotonic()
        threads = [threading.Thread(target=client, args=(n, connectors[n % len(connectors)])) for n in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - started
    return sum(admitted.values()) / elapsed, sum(aborted.values())


def _drained(engine: sa.Engine, pack: str, inputs: int) -> bool:
    with engine.connect() as connection:
        rows = connection.execute(
            sa.select(WorkItem.c.Status, sa.func.sum(WorkItem.c.LaneOrdinal - WorkItem.c.InputStartOrdinal + 1))
            .where(WorkItem.c.PackInstallId == pack)
            .group_by(WorkItem.c.Status)
        ).all()
    covered = sum(int(row[1]) for row in rows)
    return covered >= inputs and all(row[0] in TERMINAL_WORK_STATUSES for row in rows)


def _end_to_end(replicas: Sequence[ServiceProcess], engine: sa.Engine, pack: str, inputs: int, tag: str) -> float:
    """Inputs per second from the first send until all ``inputs`` are executed, workers on every replica."""
    done = threading.Event()
    per_client = inputs // CLIENTS

    def client(n: int, connectors: ConnectorsClient) -> None:
        for b in range(0, per_client, BATCH):
            items = seed.batch(f"{tag}-{n}-{b}", min(BATCH, per_client - b), IDENTITIES, offset=n * BATCH + b)
            while True:
                try:
                    connectors.ingest(pack, items=items)  # resent whole after ABORTED: duplicates are acknowledged
                    break
                except grpc.RpcError as error:
                    if error.code() is not grpc.StatusCode.ABORTED:
                        raise

    def worker(n: int, connectors: ConnectorsClient) -> None:
        while not done.is_set():
            try:
                claims = connectors.claim(
                    f"bench-{n}", pack_install_ids=[pack], max_items=CLAIM_ITEMS, wait=dt.timedelta(milliseconds=200)
                )
                for claim in claims:
                    for _page in connectors.load_inputs(claim.work.work_id, lease_token=claim.lease_token):
                        pass
                    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
            except grpc.RpcError as error:
                if error.code() not in (grpc.StatusCode.ABORTED, grpc.StatusCode.FAILED_PRECONDITION):
                    raise

    with _clients(replicas) as connectors:
        started = time.monotonic()
        workers = [
            threading.Thread(target=worker, args=(n, connectors[n % len(connectors)]))
            for n in range(WORKERS_PER_REPLICA * len(replicas))
        ]
        clients = [threading.Thread(target=client, args=(n, connectors[n % len(connectors)])) for n in range(CLIENTS)]
        for thread in [*workers, *clients]:
            thread.start()
        for thread in clients:
            thread.join()
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while not _drained(engine, pack, per_client * CLIENTS) and time.monotonic() < deadline:
            time.sleep(0.1)
        elapsed = time.monotonic() - started
        done.set()
        for thread in workers:
            thread.join()
    return per_client * CLIENTS / elapsed


def run(backend: Backend, report: Report, *, quick: bool) -> None:
    """Alternate 1 writer node and 3 (and 3 with pack affinity) on a cluster of this section's own."""
    if backend.name != "mysql":
        return  # the cluster is its own backend: run once, with the MySQL-protocol pass
    seconds, inputs, rounds = QUICK if quick else (ADMISSION_SECONDS, E2E_INPUTS, ROUNDS)
    with tempfile.TemporaryDirectory(prefix="nxbench-galera-") as workdir, _replicas(Path(workdir)) as topologies:
        one_node, three_nodes, engine = topologies
        for r in range(1, rounds + 1):
            for label, replicas in (("1 node", one_node), ("3 nodes", three_nodes)):
                rate, aborted = _admission(replicas, [install_pack(engine)], seconds, f"a{r}{label[0]}")
                report.add(
                    SECTION, "galera", f"admission, {label}, round {r}", f"{rate:.0f} inputs/s ({aborted} ABORTED)"
                )
            packs = [install_pack(engine) for _ in range(3)]
            rate, aborted = _admission(three_nodes, packs, seconds, f"p{r}")
            report.add(
                SECTION,
                "galera",
                f"admission, 3 nodes, pack per node, round {r}",
                f"{rate:.0f} inputs/s ({aborted} ABORTED)",
            )
            for label, replicas in (("1 node", one_node), ("3 nodes", three_nodes)):
                rate = _end_to_end(replicas, engine, install_pack(engine), inputs, f"e{r}{label[0]}")
                report.add(SECTION, "galera", f"end to end, {label}, round {r}", f"{rate:.0f} inputs/s")
    report.notes.append(
        "galera: three Connectors replicas either all on node 1 (1 node) or one per node (3 nodes) of a loopback "
        f"Galera cluster on this machine; {CLIENTS} clients x {BATCH} deliveries over {IDENTITIES} identities; "
        "pack per node: client n's pack is written only through replica n (3 packs)."
    )
