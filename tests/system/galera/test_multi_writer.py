"""The multi-writer tier: three Connectors replicas, each writing through a different Galera node.

As an operator scaling out would run it (issue 14): three Connectors processes, replica n
with NEXUSCRM_DSN on node n; three seeded ingest clients and four workers of
``tests/system/reliability/workload.py`` spread over the replicas (duplicates: every cut-off or
refused batch is sent again; failures, stalls past the lease, retries); beside them, for a
bounded run, an operator replaying completed work through the replicas, admission fences
armed and disarmed with the Controlplane's domain code on node 1, and faults: a commit point
per replica that answers UNAVAILABLE once (applied or not) and connections killed on every
node. Then the queue drains, and the seeded history checker (``tests/connectors/reliability/history.py``),
the invariant checker and the liveness check (no generation blocked behind a terminal
predecessor) look at the cluster.

Figures (one JSON line, printed and appended to NEXUSCRM_RELIABILITY_FIGURES when set):
operations, conflicts retried (the replicas' logged transaction retries), RPCs answered
INTERNAL, violations, generations left stranded and generations the liveness sweep healed,
and ``aborted_ingests``: how the receipts of Ingest calls refused with ABORTED were later
acknowledged (``duplicate_covered`` would mean the refused call had committed the admission:
since decision 107 an ABORTED answer means nothing committed, so none may be). The seed is in the test id; set
NEXUSCRM_HISTORY_SEED to replay one schedule.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import itertools
import os
import random
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import sqlalchemy as sa

from nexuscrm_controlplane import fences
from nexuscrm_runtime.database import create_engine
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_tools.launcher import CONNECTORS, ServiceProcess, start_services, stop_services
from tests.connectors.reliability.history import OpOutcome
from tests.support.invariants import check_invariants
from tests.system.galera.test_successor_blocking import BLOCKED_BEHIND_TERMINAL
from tests.system.reliability.conftest import CALL_TIMEOUT, ConnectorsCluster, record_figures
from tests.system.reliability.workload import WORKLOAD_ENV, Workload
from workqueue import WorkStatus
from workqueue.statuses import NONTERMINAL_WORK_STATUSES
from workqueue.values import ACKNOWLEDGED_OUTCOMES

pytestmark = [pytest.mark.slow, pytest.mark.acceptance]

SEEDS = [int(os.environ["NEXUSCRM_HISTORY_SEED"])] if os.environ.get("NEXUSCRM_HISTORY_SEED") else [14]
INGEST_SECONDS = 25.0  # seconds the clients start new batches
FENCE_HOLD = (0.3, 1.0)  # seconds a fence holds the pack
FENCE_GAP = (1.5, 4.0)  # seconds between fences
REPLAY_GAP = (0.5, 1.5)  # seconds between replays
KILL_GAP = (0.5, 2.0)  # seconds between connection kills
DUPLICATE_GAP = (0.1, 0.4)  # seconds between redeliveries of an acknowledged batch
# Each fires once per replica: a commit whose caller sees UNAVAILABLE (applied or not).
FAULT_POINTS = ("admission:after_commit", "claim:after_commit", "complete:after_commit", "fail:before_commit")
SERVICE_ENV = {
    **WORKLOAD_ENV,
    "NEXUSCRM_FAULTS_ENABLED": "1",
    "NEXUSCRM_FAULTS": ",".join(f"{point}=raise" for point in FAULT_POINTS),
}
RETRIED = re.compile(r"retrying (?P<name>[a-z ]+) after")
HEALED = re.compile(r"made (?P<count>\d+) blocked generations")


# Completed generations without a live replay: Replay refuses a second one (FAILED_PRECONDITION),
# and a replay answered UNAVAILABLE may have committed. This thread replays one at a time and
# reads with wsrep_sync_wait, so it sees every replay it started.
_REPLAYABLE = sa.text(
    "SELECT WorkId FROM WorkItem AS done WHERE PackInstallId = :pack AND Status = :status AND NOT EXISTS ("
    " SELECT 1 FROM WorkItem AS again WHERE again.ReplayOfWorkId = done.WorkId AND again.Status IN :live)"
).bindparams(sa.bindparam("live", value=[status.value for status in NONTERMINAL_WORK_STATUSES], expanding=True))


def _sync_reads(engine: sa.Engine, own: set[int]) -> sa.Engine:
    """``engine``, each connection waiting for every write committed anywhere before it reads.

    Each connection's id goes into ``own`` before its first use: the killer spares the tier's
    own connections (the fencer's transaction, the checks), it kills the replicas'.
    """

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        with contextlib.closing(dbapi_connection.cursor()) as cursor:
            cursor.execute("SET SESSION wsrep_sync_wait = 1")
            cursor.execute("SELECT CONNECTION_ID()")
            own.add(int(cursor.fetchone()[0]))

    return engine


@contextlib.contextmanager
def _unless_causal_read_timed_out(faults: Counter[str]) -> Iterator[None]:
    """Skip a read of the tier's own threads that waited past Galera's causal-read timeout.

    With ``wsrep_sync_wait`` a read first waits until its node has applied every write committed
    anywhere; past ``repl.causal_read_timeout`` (30 s) the node answers 1205, "lock wait timeout
    exceeded", although no lock was involved: a slow applier on a loaded host, not a product fault.
    """
    try:
        yield
    except sa.exc.OperationalError as error:
        if error.orig is None or error.orig.args[0] != 1205:
            raise
        faults["causal_reads_timed_out"] += 1


class Replicas(ConnectorsCluster):
    """Connectors replica n writing through node n; an admin engine per node (node 1's checks)."""

    def __init__(self, dsns: list[str], services: list[ServiceProcess]) -> None:
        super().__init__(dsns[0], services)
        self.admin.dispose()
        self.own: list[set[int]] = [set() for _ in dsns]  # per node, the ids of this tier's connections
        self.nodes = [_sync_reads(create_engine(dsn), own) for dsn, own in zip(dsns, self.own, strict=True)]
        self.admin = self.nodes[0]

    @contextlib.contextmanager
    def replica(self, n: int) -> Iterator[ConnectorsClient]:
        """A client of replica ``n`` (modulo the replicas) on a fresh channel, with a deadline on every call."""
        with grpc.insecure_channel(self.services[n % len(self.services)].address) as channel:
            yield ConnectorsClient(channel, timeout=dt.timedelta(seconds=CALL_TIMEOUT))

    def close(self) -> dict[str, int]:
        """Stop the replicas and dispose every engine."""
        codes = stop_services(self.services)
        for engine in self.nodes:
            engine.dispose()
        return codes


class MultiWriter(Workload):
    """The seeded workload over three replicas, with replays, fences and faults beside it."""

    cluster: Replicas
    clients = 3
    workers = 4
    receipts_per_client = 5_000  # more than INGEST_SECONDS lets a client deliver
    ingest_seconds = INGEST_SECONDS

    def __init__(self, cluster: Replicas, seed: int) -> None:
        super().__init__(cluster, seed)
        self.faults: Counter[str] = Counter()
        batches = itertools.chain.from_iterable(self.batches(n) for n in range(self.clients))
        self.items = {item.receipt_key: item for batch in batches for item in batch}

    def connect(self, role: str, n: int) -> contextlib.AbstractContextManager[ConnectorsClient]:
        """Client n on replica n; worker n on replica n + 1 (so no replica only admits or only runs)."""
        return self.cluster.replica(n if role == "client" else n + 1)

    def replayer(self) -> None:
        """Replay a completed generation of the pack through a seeded replica every 0.5-1.5 s."""
        rng = random.Random(f"{self.seed}-replays")
        for n in itertools.count():
            if self.stop.wait(rng.uniform(*REPLAY_GAP)) or self.clients_done.is_set():
                return
            candidates: list[str] = []
            with self.cluster.admin.connect() as connection, _unless_causal_read_timed_out(self.faults):
                done = connection.execute(_REPLAYABLE, {"pack": self.pack, "status": WorkStatus.COMPLETED.value})
                candidates = sorted(done.scalars())
            if not candidates:
                continue
            work_id = rng.choice(candidates)
            with self.cluster.replica(n) as connectors:
                self.history.call("replayer", "replay", work_id, functools.partial(connectors.replay, work_id))
            self.faults["replays"] += 1

    def duplicator(self) -> None:
        """Deliver an acknowledged batch again (same keys, same payloads) through a seeded replica."""
        rng = random.Random(f"{self.seed}-duplicates")
        for n in itertools.count():
            if self.stop.wait(rng.uniform(*DUPLICATE_GAP)) or self.clients_done.is_set():
                return
            delivered = [op for op in self.history.ops("ingest") if op.ok and op.process.startswith("client-")]
            if not delivered:
                continue
            sent = rng.choice(delivered)
            items = [self.items[key] for key, _ in sent.value]
            with self.cluster.replica(n) as connectors:
                op = self.history.call(
                    "duplicator", "ingest", sent.value, functools.partial(connectors.ingest, self.pack, items=items)
                )
            for result in op.result if op.ok else ():
                self.faults[f"redelivered_{result.outcome.value}"] += 1

    def fencer(self) -> None:
        """Arm a fence on the pack through node 1, hold it a while, disarm it; again until the clients are done."""
        rng = random.Random(f"{self.seed}-fences")
        while not self.stop.wait(rng.uniform(*FENCE_GAP)) and not self.clients_done.is_set():
            fence = fences.arm_fence(self.cluster.admin, "acme", self.pack, reason="multi-writer tier")
            self.faults["fences"] += 1
            self.stop.wait(rng.uniform(*FENCE_HOLD))
            fences.disarm_fence(self.cluster.admin, fence.fence_id)

    def killer(self) -> None:
        """Kill a random connection of the replicas on a random node, every 0.5-2 s."""
        rng = random.Random(f"{self.seed}-kills")
        while not self.stop.wait(rng.uniform(*KILL_GAP)) and not self.clients_done.is_set():
            index = rng.randrange(len(self.cluster.nodes))
            with self.cluster.nodes[index].connect() as connection:
                ids: list[int] = []
                with _unless_causal_read_timed_out(self.faults):
                    rows = connection.execute(
                        sa.text(
                            "SELECT ID FROM information_schema.PROCESSLIST "
                            "WHERE DB = DATABASE() AND USER = 'root' AND ID <> CONNECTION_ID() ORDER BY ID"
                        )
                    ).scalars()
                    ids = [i for i in rows if i not in self.cluster.own[index]]
                if not ids:
                    continue
                try:
                    connection.exec_driver_sql(f"KILL CONNECTION {int(rng.choice(ids))}")
                except sa.exc.OperationalError:  # closed meanwhile
                    continue
            self.faults["connections_killed"] += 1

    def run_beside_faults(self) -> None:
        """The workload, with the replayer, the duplicator, the fencer and the connection killer beside it."""
        self.run([self.guarded(t) for t in (self.replayer, self.duplicator, self.fencer, self.killer)])

    def aborted_ingests(self) -> Counter[str]:
        """How the receipts of ingests refused with ABORTED were acknowledged later (first acknowledgement).

        ``duplicate_covered``: the admission had committed although the answer said nothing was
        done (or the materializer admitted a stored receipt meanwhile); ``admitted``: it had not.
        """
        aborted = {key for op in self.history.ops("ingest") if op.status == "ABORTED" for key, _ in op.value}
        first: dict[str, str] = {}
        for op in self.history.ops("ingest"):
            for result in op.result if op.ok else ():
                if result.receipt_key in aborted and result.outcome in ACKNOWLEDGED_OUTCOMES:
                    first.setdefault(result.receipt_key, result.outcome.value)
        return Counter(first.values())


def _log_figures(services: list[ServiceProcess]) -> tuple[Counter[str], int]:
    """Transaction retries per transaction name, and generations the liveness sweep healed, from the logs."""
    retried: Counter[str] = Counter()
    healed = 0
    for service in services:
        text = Path(service.log_path).read_text(errors="replace")
        retried.update(match["name"] for match in RETRIED.finditer(text))
        healed += sum(int(match["count"]) for match in HEALED.finditer(text))
    return retried, healed


@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed={s}" for s in SEEDS])
def test_three_replicas_on_three_nodes_keep_the_history_and_the_invariants(
    node_dsns: list[str], tmp_path: Path, seed: int
) -> None:
    """Issue 14 item 1: replicas on different nodes; history, invariants and liveness hold."""
    services: list[ServiceProcess] = []
    try:
        for n, dsn in enumerate(node_dsns):
            services += start_services(
                [CONNECTORS], env={"NEXUSCRM_DSN": dsn, **SERVICE_ENV}, workdir=tmp_path / f"replica{n + 1}"
            )
        cluster = Replicas(node_dsns, services)
    except BaseException:
        stop_services(services)
        raise
    try:
        scenario = MultiWriter(cluster, seed)
        scenario.run_beside_faults()
        history = scenario.history
        violations = scenario.violations()
        problems = check_invariants(cluster.admin)
        with cluster.admin.connect() as connection:
            stranded = list(connection.execute(BLOCKED_BEHIND_TERMINAL).scalars())
        retried, healed = _log_figures(services)
        internal = [op for op in history.ops() if op.status == "INTERNAL"]
        unknown = Counter(op.f for op in history.ops() if op.outcome is OpOutcome.UNKNOWN)
        aborted = scenario.aborted_ingests()
        record_figures(
            f"galera-multi-writer[seed={seed}]",
            {
                "operations": len(history.ops()),
                "receipts": len(scenario.sent()),
                "by_function": history.figures(),
                "conflicts_retried": sum(retried.values()),
                "conflicts_retried_by_transaction": dict(retried),
                "internal_answers": len(internal),
                "unknown_outcomes": dict(unknown),
                "aborted_ingests": dict(aborted),
                "faults": dict(scenario.faults) | {"fault_points_armed": len(FAULT_POINTS) * len(services)},
                "violations": len(violations) + len(problems),
                "stranded_after_quiescence": len(stranded),
                "healed_by_the_sweep": healed,
            },
        )
        assert history.ops("complete") and history.ops("replay"), "the run did nothing"
        assert scenario.faults["connections_killed"] and scenario.faults["fences"], "the faults did not happen"
        assert not internal, f"seed {seed}: {len(internal)} RPCs answered INTERNAL: {internal[:5]}"
        assert not violations, f"seed {seed} (replay: NEXUSCRM_HISTORY_SEED={seed}):\n" + "\n".join(violations[:50])
        assert not problems, "invariant violations:\n" + "\n".join(problems[:50])
        assert not aborted["duplicate_covered"], f"an ABORTED Ingest had committed its admission: {dict(aborted)}"
        assert not stranded, f"X (liveness): {len(stranded)} generations blocked behind a terminal predecessor"
        assert all(service.process.poll() is None for service in services), "a replica exited"
    finally:
        cluster.close()
