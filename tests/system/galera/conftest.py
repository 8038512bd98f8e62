"""The Galera tier: a throwaway 3-node MariaDB Galera cluster on loopback (``tests.support.galera``).

Skipped unless NEXUSCRM_GALERA=1; NEXUSCRM_GALERA_REQUIRED=1 also runs it and turns a cluster
that cannot start into a failure instead of a skip (as NEXUSCRM_TIDB_REQUIRED does for the
MySQL-protocol server). One cluster serves this directory's tests; each test gets its own
database on it, migrated to the newest schema, with one DSN per node.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from nexuscrm_runtime.database import create_engine
from nexuscrm_schema_catalog import migrations
from tests.support.galera import GaleraCluster

REQUIRED = os.environ.get("NEXUSCRM_GALERA_REQUIRED") == "1"
ENABLED = REQUIRED or os.environ.get("NEXUSCRM_GALERA") == "1"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test of this directory ``galera``."""
    for item in items:
        if "tests/system/galera/" in item.nodeid:
            item.add_marker(pytest.mark.galera)


@pytest.fixture(scope="package")
def cluster() -> Iterator[GaleraCluster]:
    """The started cluster; stopped and removed after this directory's tests (also after a failure).

    Package scope: the three nodes do not outlive the tier, so the rest of the run has the
    machine's two cores and the shared server to itself.
    """
    if not ENABLED:
        pytest.skip("the Galera tier runs with NEXUSCRM_GALERA=1 or NEXUSCRM_GALERA_REQUIRED=1 (docs/galera.md)")
    started = GaleraCluster(Path(tempfile.mkdtemp(prefix="galera-")))
    try:
        started.start()
    except Exception as error:
        started.close()
        message = f"the Galera cluster could not start: {error}"
        if REQUIRED:
            pytest.fail(f"NEXUSCRM_GALERA_REQUIRED=1: {message}")
        pytest.skip(message)
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def node_dsns(cluster: GaleraCluster) -> Iterator[list[str]]:
    """One isolated database at the newest schema on the cluster: its DSN on each node (node 1 first)."""
    name = f"nxgalera_{uuid.uuid4().hex[:12]}"
    dsns = cluster.create_database(name)
    engine = create_engine(dsns[0])
    migrations.apply_schema(engine)
    engine.dispose()
    try:
        yield dsns
    finally:
        cluster.drop_database(name)
