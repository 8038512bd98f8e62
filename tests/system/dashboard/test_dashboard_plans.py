"""The dashboard's and the queue collector's reads use index ranges, on every backend.

Same method and seeded history as the hot-query plan test (``tests/system/integration/test_hot_query_plans.py``):
each read runs through the function the page calls, the statements are captured and EXPLAINed.
Search, the receipt list and the operating panels (claim pauses and order policies, dead
letters, coverage) ask a ConnectorsService served in this process over the same engine
(``conftest``), so the statements its RPCs run are captured too.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.operating.claim_pauses import PauseScope, scope_of
from nexuscrm_controlplane.dashboard import operations, overview, queries
from nexuscrm_controlplane.dashboard.connectors import ConnectorsReads
from tests.connectors.integration.test_index_plans import seed
from tests.support.factories import START
from tests.support.invariants import assert_invariants
from tests.support.plans import GROWING_TABLES, explain_problems
from tests.support.statements import Captured, capture

pytestmark = pytest.mark.database


def touches_growing_table(captured: Captured) -> bool:
    """False for reads of small control tables only (PackInstall, fences, protocol rows), whose sorts are cheap."""
    return any(f'"{table}"' in captured.statement or f"`{table}`" in captured.statement for table in GROWING_TABLES)


def on_connection(read: Callable[[sa.Connection], object], engine: sa.Engine) -> Callable[[], object]:
    def run() -> object:
        with engine.connect() as connection:
            return read(connection)

    return run


def test_dashboard_reads_use_index_ranges(
    engine: sa.Engine, connectors: ConnectorsReads, monkeypatch: pytest.MonkeyPatch
) -> None:
    seeded = seed(engine)
    pack, work_id = seeded.native_pack, seeded.claimed_work_id
    facade = Connectors(engine)
    [failing] = facade.claim("plans", pack_install_ids=[pack])  # a dead letter, so its panel asks Connectors
    facade.fail(failing.work.work_id, lease_token=failing.lease_token, error="boom", retryable=False)
    facade.pause_claims(scope_of(pack, PauseScope.PACK, None, ""), paused_by="ops", reason="plans")
    # The statements of a coverage page are the same for any size; 3 identities keep it well
    # within the call's deadline on SQLite with the statements captured.
    monkeypatch.setattr(operations, "COVERAGE_PAGE", 3)
    reads: dict[str, Callable[[], object]] = {
        "pack_queue": on_connection(lambda c: overview.pack_queue(c, pack, START), engine),
        "failures": on_connection(
            lambda c: queries.work_dead_letters_newest(c, pack, overview.FAILURES_EXAMINED), engine
        ),
        "pack_timeline": lambda: overview.pack_timeline(engine, pack),
        "receipts": lambda: overview.receipts(connectors, "stored", pack),
        "search": lambda: overview.search(engine, connectors, work_id),
        "packs_list": on_connection(lambda c: queries.packs_list(c, overview.PACK_LIMIT), engine),
        "claim_pauses": lambda: operations.claim_pauses(engine, connectors),
        "dead_letters": lambda: operations.dead_letters(engine, connectors, pack),
        "coverage": lambda: operations.coverage(connectors, pack),
    }
    failures = []
    for name, read in reads.items():
        with capture(engine) as captured:
            read()
        assert captured.statements, f"{name} ran no statement"
        with engine.connect() as connection:
            failures += [
                f"{name}: {problem}\n    in: {statement.statement[:300]}"
                for statement in captured.statements
                if touches_growing_table(statement)
                for problem in explain_problems(connection, statement.statement, statement.one_row_parameters)
            ]
    assert not failures, "dashboard reads without an index range plan:\n" + "\n".join(failures)
    assert operations.dead_letters(engine, connectors, pack)["packs"][0]["total"] == 1
    assert [
        p["pauses"] != [] for p in operations.claim_pauses(engine, connectors)["packs"] if p["pack_install_id"] == pack
    ] == [True]
    assert_invariants(engine)
