"""The cutover runbook (docs/runbook-cutover.md), executed step by step on the real database.

Old-protocol history with live work -> schema v2 and the namespace fence -> old workers drain
-> old writers stop -> cutover -> native Connectors -> fence lifted -> new inputs admitted in
ranges, duplicates of old inputs acknowledged, receipts stored while fenced admitted.
"""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.errors import LegacyRefused
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.legacy.runtime import LegacyRuntime
from nexuscrm_controlplane import drain, fences
from nexuscrm_controlplane.cutover import Outcome as CutoverOutcome
from nexuscrm_schema.tables import WorkItem
from nexuscrm_schema_catalog import migrations
from tests.controlplane.integration.history import FakeClock, arm, cut, install, items
from tests.support.invariants import assert_invariants
from tests.system.integration.old_workers import run_old_workers
from workqueue.values import Outcome

pytestmark = pytest.mark.database


def test_the_runbook_cuts_over_live_old_history_without_losing_an_input(empty_engine: sa.Engine) -> None:
    engine, clock = empty_engine, FakeClock()
    migrations.apply_schema(engine, 1)  # the pre-upgrade schema
    migrations.apply_schema(engine)  # step 1: the additive v2 schema (old writers keep working on it) ...
    pack = install(engine, clock)
    legacy = LegacyRuntime(engine, clock)
    legacy.ingest(pack, items(["old-1", "old-2"]))
    live = legacy.claim("old-worker", pack)
    fence = arm(engine, clock)  # ... and the namespace fence
    connectors = Connectors(engine, clock=clock)
    fenced = connectors.ingest(pack, items=items(["while-fenced"], "lane-b"))
    assert [r.outcome for r in fenced] == [Outcome.FENCED]

    # step 2: the old workers finish their durable backlog; the wait reports until then
    assert not drain.drain_status(engine, pack, clock).drained
    legacy.complete(live.work.work_id, live.lease_token)
    assert drain.drain_status(engine, pack, clock).drained
    # Event 2 was coalesced and is above the completed boundary: the audit refuses
    assert cut(engine, pack, clock).outcome is CutoverOutcome.REFUSED_AUDIT

    # (the refusal is resolved by history the old runtime writes, not by marking input)
    fences.disarm_fence(engine, fence)
    legacy.ingest(pack, items(["old-3"]))
    fence = arm(engine, clock)
    run_old_workers(legacy, pack)
    # step 3: old writers stop; step 4: the checkpoint
    result = cut(engine, pack, clock)
    assert result.outcome is CutoverOutcome.WRITTEN and result.protocol.legacy_max_ordinal == 3

    # step 5: the native runtime, the fence lifted, stored receipts admitted
    fences.disarm_fence(engine, fence)
    assert connectors.materialize() == 1
    new = connectors.ingest(pack, items=items(["new-1", "new-2"]))
    assert [r.outcome for r in new] == [Outcome.ADMITTED, Outcome.ADMITTED]
    assert [r.enqueue_ordinal for r in new] == [5, 6]
    duplicates = connectors.ingest(pack, items=items(["old-1", "new-1"]))
    assert [r.outcome for r in duplicates] == [Outcome.DUPLICATE_LEGACY, Outcome.DUPLICATE_COVERED]
    with pytest.raises(LegacyRefused, match="rollback"):
        legacy.ingest(pack, items(["old-4"]))

    claims = connectors.claim("new-worker", pack_install_ids=[pack], max_items=10, lease=dt.timedelta(seconds=30))
    ranges = sorted((c.work.input_start_ordinal, c.work.lane_ordinal) for c in claims)
    assert ranges == [(4, 4), (5, 6)]
    for claim in claims:
        members = [
            i.enqueue_ordinal
            for page in connectors.load_inputs(claim.work.work_id, lease_token=claim.lease_token)
            for i in page.inputs
        ]
        assert members == list(range(claim.work.input_start_ordinal, claim.work.lane_ordinal + 1))
        connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    with engine.connect() as connection:
        old = connection.execute(
            sa.select(sa.func.count()).select_from(WorkItem).where(WorkItem.c.InputStartOrdinal.is_(None))
        ).scalar()
    assert old == 2
    assert_invariants(engine)
