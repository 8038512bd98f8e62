"""Node loss on Galera (issue 53 item 1): a node killed or cut off mid-run, then back.

Three Connectors replicas, replica n with the failover DSN of decision 182 (node n first, then
the others in order), and beside each a worker claiming through it; three seeded ingest
clients (``tests/system/reliability/workload.py``: every cut-off or refused batch is sent
again), a duplicator sending acknowledged batches again and a replayer, as in
``test_multi_writer.py``. A few seconds in, node 3 is lost, by one of two faults:

- ``kill``: its ``mariadbd`` gets SIGKILL; the two others go on; then it starts again and
  rejoins by IST or SST (which one is in the figures);
- ``partition``: its group communication is cut off (``gmcast.isolate=1``): the process keeps
  running and accepting connections, but it leaves the primary component and its queries
  fail (1047) until the cut is restored and it has caught up by IST.

Replica 3 keeps serving throughout: its connections to node 3 fail (UNAVAILABLE), its next
connections go to node 1. After the clients stop and the queue drains: the seeded history
checker (no acknowledged input lost, no input in two generations, leases never overlap), no
generation left behind (not terminal, or blocked behind a terminal predecessor), no RPC
answered INTERNAL or with a status outside the workload's documented ones (and, while the
node was lost, only UNAVAILABLE, ABORTED or DEADLINE_EXCEEDED besides OK and the stale-lease
FAILED_PRECONDITION), and the invariants. One JSON line of figures per fault (printed, and
appended to NEXUSCRM_RELIABILITY_FIGURES when set).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path

import pytest

from nexuscrm_runtime.clock import utcnow
from nexuscrm_tools.launcher import CONNECTORS, ServiceProcess, start_services, stop_services
from tests.connectors.reliability.history import Op
from tests.support.galera import GaleraCluster
from tests.support.invariants import assert_invariants
from tests.system.galera.test_multi_writer import MultiWriter, Replicas
from tests.system.galera.test_successor_blocking import BLOCKED_BEHIND_TERMINAL
from tests.system.reliability.conftest import record_figures
from tests.system.reliability.workload import WORKLOAD_ENV

pytestmark = [pytest.mark.slow, pytest.mark.acceptance]

SEED = 53
LOST = 2  # index of the node lost: node 3 (node 1 holds the tier's admin connections)
INGEST_SECONDS = 24.0  # seconds the clients start new batches
BEFORE_FAULT = 4.0  # seconds of load on three nodes before the fault
ON_TWO = 6.0  # seconds of load on two nodes once they have seen the loss
# What a call may answer while the node is lost, besides OK and a stale lease's FAILED_PRECONDITION.
WHILE_LOST = frozenset({"OK", "UNAVAILABLE", "ABORTED", "DEADLINE_EXCEEDED", "FAILED_PRECONDITION"})


class NodeLoss(MultiWriter):
    """Three clients, three workers (worker n beside replica n + 1), the duplicator and the replayer; node 3 lost."""

    workers = 3
    ingest_seconds = INGEST_SECONDS

    def __init__(self, replicas: Replicas, galera: GaleraCluster, fault: str) -> None:
        super().__init__(replicas, SEED)
        self.galera = galera
        self.fault = fault
        self.lost_at: dt.datetime | None = None  # the fault (naive UTC, as the history's times)
        self.back_at: dt.datetime | None = None  # every node ready again
        self.rejoined_by = ""

    def lose_a_node(self) -> None:
        """Lose node 3 a few seconds in, go on with two, bring it back, wait until all three are ready."""
        node = self.galera.nodes[LOST]
        others = [n for n in self.galera.nodes if n is not node]
        if self.stop.wait(BEFORE_FAULT):
            return
        self.lost_at = utcnow()
        if self.fault == "kill":
            self.galera.kill(node)
        else:
            self.galera.isolate(node, True)
        self.galera.wait_size(2, others)
        self.faults[f"node_{self.fault}"] += 1
        if self.stop.wait(ON_TWO):
            return
        if self.fault == "kill":
            self.rejoined_by = self.galera.restart(node)
        else:
            self.galera.isolate(node, False)
            self.galera.wait_size(3, self.galera.nodes)
            self.rejoined_by = "IST"
        self.back_at = utcnow()

    def while_lost(self) -> list[Op]:
        """The calls invoked while node 3 was lost (from the fault until all three nodes were ready)."""
        assert self.lost_at is not None and self.back_at is not None, "the node was not lost and brought back"
        return [op for op in self.history.ops() if self.lost_at <= op.invoked_at <= self.back_at]


@pytest.mark.parametrize("fault", ["kill", "partition"])
def test_a_lost_node_loses_nothing_and_its_replica_fails_over(
    cluster: GaleraCluster, node_dsns: list[str], tmp_path: Path, fault: str
) -> None:
    """Issue 53 item 1: a node lost mid-run and back; history, liveness, statuses and invariants hold."""
    database = node_dsns[0].rsplit("/", 1)[1]
    services: list[ServiceProcess] = []
    try:
        for n in range(len(node_dsns)):
            services += start_services(
                [CONNECTORS],
                env={"NEXUSCRM_DSN": cluster.failover_dsn(database, n), **WORKLOAD_ENV},
                workdir=tmp_path / f"replica{n + 1}",
            )
        replicas = Replicas(node_dsns, services)
    except BaseException:
        stop_services(services)
        raise
    try:
        scenario = NodeLoss(replicas, cluster, fault)
        scenario.run([scenario.guarded(t) for t in (scenario.replayer, scenario.duplicator, scenario.lose_a_node)])
        history = scenario.history
        violations = scenario.violations()
        with replicas.admin.connect() as connection:
            stranded = list(connection.execute(BLOCKED_BEHIND_TERMINAL).scalars())
        statuses = Counter(op.status for op in history.ops())
        while_lost = Counter(op.status for op in scenario.while_lost())
        assert scenario.lost_at is not None and scenario.back_at is not None
        duplicated = sum(
            1 for op in history.ops("ingest") if op.ok for r in op.result if r.outcome.value.startswith("duplicate")
        )
        record_figures(
            f"galera-node-loss[{fault}]",
            {
                "rpcs": len(history.ops()),
                "inputs": len(scenario.sent()),
                "statuses": dict(statuses),
                "statuses_while_lost": dict(while_lost),
                "faults": dict(scenario.faults),
                "node_lost_seconds": round((scenario.back_at - scenario.lost_at).total_seconds(), 1),
                "rejoined_by": scenario.rejoined_by,
                "duplicate_answers": duplicated,
                "violations": len(violations),
                "stuck": len(stranded),
                "internal": statuses["INTERNAL"],
            },
        )
        assert history.ops("complete") and history.ops("replay"), "the run did nothing"
        assert not statuses["INTERNAL"], f"{statuses['INTERNAL']} RPCs answered INTERNAL"
        assert set(while_lost) <= WHILE_LOST, f"while node 3 was lost: {dict(while_lost)}"
        assert not violations, "\n".join(violations[:50])
        assert not stranded, f"{len(stranded)} generations blocked behind a terminal predecessor"
        assert all(service.process.poll() is None for service in services), "a replica exited"
        assert_invariants(replicas.admin)
    finally:
        replicas.close()
