"""The history checker with the pruner active: aggressive retention loses nothing and breaks no check.

The seeded workload of the history test (clients retrying unacknowledged receipts, workers
that fail and stall) runs against a Connectors process whose background pass (every second)
prunes every terminal generation that is not the newest of its identity. Once the pruner has
let everything go, every batch is delivered again: each duplicate must be acknowledged
(pruned or covered), never coverage_missing, never new work. The checker sees pruned inputs
through their tombstones and pruned generations through their records (decision 125), so
every check still covers every input.
"""

from __future__ import annotations

import functools

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.context import Context
from nexuscrm_connectors.operating import retention
from nexuscrm_schema.tables import Event, PrunedReceipt, PrunedWork, WorkItem
from tests.support.invariants import assert_invariants
from tests.support.waiting import wait_until
from tests.system.reliability.conftest import StartProxied, record_figures
from tests.system.reliability.workload import WORKLOAD_ENV, Workload
from workqueue.values import Outcome

pytestmark = [
    pytest.mark.database,
    pytest.mark.acceptance,
    pytest.mark.parametrize("empty_dsn", ["mysql"], indirect=True),  # the proxied pair speaks MySQL
]


def _count(engine: sa.Engine, table: sa.Table) -> int:
    with engine.connect() as connection:
        return int(connection.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def test_history_with_aggressive_retention_has_no_anomaly(start_proxied: StartProxied) -> None:
    cluster = start_proxied(WORKLOAD_ENV)
    workload = Workload(cluster, seed=11)
    retention.set_policy(Context.of(cluster.admin), workload.pack, keep_generations=1, keep_seconds=0)

    workload.run([])
    wait_until(
        lambda: retention.prune(Context.of(cluster.admin), workload.pack, dry_run=True)[0].generations == 0,
        "the background pass to prune every generation the policy lets go",
    )
    events, generations = _count(cluster.admin, Event), _count(cluster.admin, WorkItem)
    with cluster.client() as connectors:
        for client in range(workload.clients):
            for batch in workload.batches(client):
                workload.history.call(
                    "redelivery",
                    "ingest",
                    tuple((i.receipt_key, i.payload) for i in batch),
                    functools.partial(connectors.ingest, workload.pack, items=batch),
                )

    violations = workload.violations()
    redelivered = [r.outcome for op in workload.history.ops("ingest") if op.process == "redelivery" for r in op.result]
    record_figures(
        "history with retention",
        {
            "operations": len(workload.history.ops()),
            "receipts": len(workload.sent()),
            "pruned_generations": _count(cluster.admin, PrunedWork),
            "tombstones": _count(cluster.admin, PrunedReceipt),
            "retained_events": events,
            "redelivered": {outcome.value: redelivered.count(outcome) for outcome in set(redelivered)},
            "violations": len(violations),
        },
    )
    assert not violations, "\n".join(violations[:50])
    assert len(redelivered) == len(workload.sent())
    assert set(redelivered) == {Outcome.DUPLICATE_PRUNED, Outcome.DUPLICATE_COVERED}
    assert (_count(cluster.admin, Event), _count(cluster.admin, WorkItem)) == (events, generations)  # no new work
    assert _count(cluster.admin, PrunedReceipt) + events == len(workload.sent())  # each input: retained or tombstone
    assert_invariants(cluster.admin)
