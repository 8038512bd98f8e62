"""Every mutating operator RPC raced by two operators through two Galera nodes (issue 53 item 2, decision 183).

The races of ``tests/system/reliability/test_operator_races.py``, with replica n (a Connectors
and a Controlplane process) writing through node n: a row read FOR UPDATE is locked on its own
node only, so two calls that decide under the same lock on two nodes both decide before either
commits, and only a write both make (a conflict at certification) can make the later one run
again and see the first. Each node answers reads with ``wsrep_sync_wait = 1`` while this module
runs, so a read through node 2 sees what node 1 committed just before (the setup of a round).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from nexuscrm_runtime.database import create_engine
from nexuscrm_schema_catalog import migrations
from tests.support.galera import GaleraCluster
from tests.support.invariants import assert_invariants
from tests.system.reliability.operator_races import Operators, serving_operators
from tests.system.reliability.test_operator_races import (  # the same races, collected here through two nodes
    test_bulk,
    test_cutover,
    test_fences_and_overrides,
    test_order_and_retry_policies,
    test_pause_and_resume,
    test_replay,
    test_retention_set_and_prune,
    test_retry_now,
    test_skip,
    test_skip_against_replay,
)

pytestmark = pytest.mark.slow
__all__ = [
    "test_bulk",
    "test_cutover",
    "test_fences_and_overrides",
    "test_order_and_retry_policies",
    "test_pause_and_resume",
    "test_replay",
    "test_retention_set_and_prune",
    "test_retry_now",
    "test_skip",
    "test_skip_against_replay",
]


def _sync_wait(dsns: list[str], value: int) -> None:
    for dsn in dsns:
        engine = create_engine(dsn)
        try:
            with engine.connect() as connection:
                connection.exec_driver_sql(f"SET GLOBAL wsrep_sync_wait = {int(value)}")
        finally:
            engine.dispose()


@pytest.fixture(scope="module")
def operators(cluster: GaleraCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operators]:
    """Replica 1 on node 1, replica 2 on node 2, one database at the newest schema; checks read through node 1."""
    name = f"nxgalera_{uuid.uuid4().hex[:12]}"
    dsns = cluster.create_database(name)
    engine = create_engine(dsns[0])
    migrations.apply_schema(engine)
    _sync_wait(dsns, 1)  # before any service connects: every new session waits for the cluster
    try:
        with serving_operators((dsns[0], dsns[1]), tmp_path_factory.mktemp("races-galera"), "galera") as operators:
            yield operators
            assert_invariants(operators.engine)
    finally:
        _sync_wait(dsns, 0)
        engine.dispose()
        cluster.drop_database(name)
