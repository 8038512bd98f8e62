"""Retention's decisions against their conflicting writers on two Galera nodes (decision 123).

Same method as ``test_control_decisions.py``: both transactions are held at their commit
after writing everything, the first commits, then the second, which must be made to decide
again (certification failure, retried by ``run_transaction``) instead of committing on a
stale read.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from nexuscrm_connectors import retention
from nexuscrm_connectors.service import Connectors
from nexuscrm_connectors.settings import Settings
from nexuscrm_runtime.clock import DATABASE_CLOCK
from nexuscrm_schema.tables import PrunedWork, WorkItem
from tests.galera.test_control_decisions import Gate, engines, synced
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants

__all__ = ["engines"]  # the fixture, shared with the control decisions


def _two_generations(engine: sa.Engine) -> str:
    """A pack whose lane "a" has two completed generations, and a keep-1 policy."""
    connectors = Connectors(engine)
    pack = install_pack(engine)
    for _ in range(2):
        connectors.ingest(pack, items=[delivery(lane="a"), delivery(lane="a")])
        [claim] = connectors.claim("w", pack_install_ids=[pack])
        connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    retention.set_policy(engine, DATABASE_CLOCK, pack, keep_generations=1, keep_seconds=None)
    return pack


def _count(engine: sa.Engine, table: sa.Table) -> int:
    with engine.connect() as connection:
        return int(connection.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def test_pruning_cannot_commit_after_the_policy_was_turned_off_on_another_node(
    engines: list[sa.Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pruning vs a policy change: both write the RetentionPolicy row, so the pruning decides again."""
    pack = _two_generations(engines[0])
    synced(engines[1])
    gate = Gate(monkeypatch)
    gate.hold("retention prune")
    gate.hold("retention policy")
    pruning = gate.run("retention prune", lambda: retention.prune(engines[0], Settings(), DATABASE_CLOCK, pack)[0])
    turned_off = gate.run(
        "retention policy",
        lambda: retention.set_policy(engines[1], DATABASE_CLOCK, pack, keep_generations=None, keep_seconds=None),
    )
    assert not turned_off().active  # the policy change commits first ...
    report = pruning()  # ... then the pruning, which read the policy before it
    assert gate.attempts["retention prune"] >= 2, "the pruning was not made to decide again"
    assert report.generations == 0 and _count(engines[0], PrunedWork) == 0
    assert _count(engines[0], WorkItem) == 2
    assert_invariants(engines[0])
