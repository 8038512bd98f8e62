"""The database server restarted under load: gracefully (SIGTERM) and by a crash (SIGKILL).

A private MariaDB server (``tests/support/private_mariadb.py``: the shared one must never be
restarted) carries a Connectors process while the seeded clients and workers of
``tests/system/reliability/workload.py`` record a history. Each restart waits until its share of
the receipts is acknowledged, so it strikes mid-load; the server then stays down a seeded
while and comes back on the same port and datadir (after InnoDB's crash recovery, if it
was killed). Callers see OK or a retryable status, never a false success; retrying the same
receipts resolves every unknown outcome; the same Connectors process serves again after
each restart; and once the queue drains, the history checker and the invariant checker
find nothing: no acknowledged receipt or completion is lost, even across a crash.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import random
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nexuscrm_runtime.clock import utcnow
from tests.connectors.reliability.history import History, acknowledged_receipts, resolved_unknowns
from tests.support.invariants import assert_invariants
from tests.support.private_mariadb import PrivateMariaDB
from tests.support.waiting import wait_until
from tests.system.reliability.conftest import FULL, ConnectorsCluster, record_figures, service_dsn, start_pair
from tests.system.reliability.workload import CLIENTS, RECEIPTS_PER_CLIENT, WORKLOAD_ENV, Workload

pytestmark = [pytest.mark.database, pytest.mark.acceptance]

SEED = 1
RESTARTS = ("graceful", "crash") * (3 if FULL else 1)
DOWN_SECONDS = (0.2, 1.5)  # how long the server stays down (seeded): callers meet refused connections


def acknowledged_at_least(history: History, count: int) -> bool:
    """True once ``count`` receipts are acknowledged."""
    return len(acknowledged_receipts(history)) >= count


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outage:
    """One restart: how the server went down and when it was away (the test's clock)."""

    kind: str
    exit_code: int
    began: dt.datetime
    ended: dt.datetime


class Restarts:
    """Restarts the server at evenly spaced shares of the acknowledged receipts."""

    def __init__(self, workload: Workload, server: PrivateMariaDB) -> None:
        self.workload = workload
        self.server = server
        self.outages: list[Outage] = []

    def run(self) -> None:
        """Each restart in ``RESTARTS``, once its share is acknowledged and the service served since the last."""
        rng = random.Random(f"{self.workload.seed}-restarts")
        history = self.workload.history
        total = CLIENTS * RECEIPTS_PER_CLIENT
        for n, kind in enumerate(RESTARTS, start=1):
            share = total * n // (len(RESTARTS) + 1)
            if not self._wait(functools.partial(acknowledged_at_least, history, share), f"{share} acknowledged"):
                return
            began = utcnow()
            code = self.server.stop() if kind == "graceful" else self.server.crash()
            self.workload.stop.wait(rng.uniform(*DOWN_SECONDS))
            self.server.start()
            outage = Outage(kind=kind, exit_code=code, began=began, ended=utcnow())
            self.outages.append(outage)
            served = functools.partial(self._served_since, outage.ended)
            if not self._wait(served, f"an ingest answered after the {kind} restart"):
                return

    def _wait(self, condition: Callable[[], bool], what: str) -> bool:
        """Wait for ``condition``; False if the run was stopped meanwhile."""
        wait_until(lambda: self.workload.stop.is_set() or condition(), what)
        return not self.workload.stop.is_set()

    def _served_since(self, moment: dt.datetime) -> bool:
        return any(op.ok and op.invoked_at > moment for op in self.workload.history.ops("ingest"))

    def outage_statuses(self) -> Counter[str]:
        """``f:status`` of the calls invoked while the server was away."""
        return Counter(
            f"{op.f}:{op.status}"
            for op in self.workload.history.ops()
            if any(o.began <= op.invoked_at <= o.ended for o in self.outages)
        )


@pytest.fixture
def cluster(private_server: PrivateMariaDB, tmp_path: Path) -> Iterator[ConnectorsCluster]:
    """The schema catalog and Connectors on a database of the private server (stopped before it)."""
    dsn = private_server.create_database("nexuscrm")
    cluster = ConnectorsCluster(dsn, start_pair(dsn, service_dsn(dsn, private_server.port), WORKLOAD_ENV, tmp_path))
    yield cluster
    cluster.close()


def test_a_database_restart_under_load_loses_nothing_and_the_same_service_recovers(
    cluster: ConnectorsCluster, private_server: PrivateMariaDB
) -> None:
    workload = Workload(cluster, SEED)
    restarts = Restarts(workload, private_server)
    workload.run([workload.guarded(restarts.run)])
    history = workload.history
    violations = workload.violations()
    outages = restarts.outages
    record_figures(
        "database_restart",
        {
            "operations": len(history.ops()),
            "receipts": len(workload.sent()),
            "by_function": history.figures(),
            "faults": Counter(f"{outage.kind}_restart" for outage in outages),
            "during_outages": restarts.outage_statuses(),
            "unknown_ingests_resolved_as": resolved_unknowns(history),
            "violations": len(violations),
        },
    )
    assert not violations, "\n".join(violations[:50])
    assert [outage.kind for outage in outages] == list(RESTARTS)
    assert all(o.exit_code == (0 if o.kind == "graceful" else -9) for o in outages), outages
    assert cluster.connectors.process.poll() is None, "Connectors had to be restarted"
    assert_invariants(cluster.admin)
