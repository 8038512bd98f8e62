"""The dashboard shows what operators decided of a generation, on every backend (decision 176).

A replayed and a skipped dead letter leave the pack card's "Failed generations" and the dead
letter count, and their timeline bars say "replayed" and "skipped" (no longer failed); a
generation the "block" order policy holds says what it is held behind; search says the same,
with who skipped, when and why; the collector's dead-letter gauge agrees.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.operating.order_policy import Policy
from nexuscrm_controlplane.dashboard import overview
from nexuscrm_controlplane.dashboard.collector import QueueCollector
from nexuscrm_controlplane.dashboard.connectors import ConnectorsReads
from tests.support.factories import FakeClock, delivery, install_pack
from tests.support.invariants import assert_invariants
from workqueue import decode_projection_key

pytestmark = pytest.mark.database


def test_replayed_and_skipped_dead_letters_leave_the_failures_and_held_work_says_held(
    engine: sa.Engine, connectors: ConnectorsReads
) -> None:
    clock = FakeClock()
    pack = install_pack(engine)
    facade = Connectors(engine, clock=clock)
    facade.ingest(pack, items=[delivery(lane=lane) for lane in ("a", "b", "c")])
    failed = {}
    for claim in facade.claim("w", pack_install_ids=[pack], max_items=3):
        facade.fail(claim.work.work_id, lease_token=claim.lease_token, error="boom", retryable=False)
        failed[decode_projection_key(claim.work.projection_key).source_lane] = claim.work.work_id
    facade.set_order_policy(pack, Policy.BLOCK, set_by="ops", reason="ledger order")
    (held,) = [r.work_id for r in facade.ingest(pack, items=[delivery(lane="c")])]  # c's successor: held behind c
    replay = facade.replay(failed["a"]).work.work_id
    facade.skip_dead_letter(failed["b"], skipped_by="ops@acme", reason="deleted upstream")

    [card] = [c for c in overview.packs_overview(engine, clock)["packs"] if c["pack_install_id"] == pack]
    assert [f["work_id"] for f in card["failures"]] == [failed["c"]]  # the one dead letter left
    assert (card["queue"]["failed"], card["queue"]["dead_letters"]) == (3, 1)

    timeline = overview.pack_timeline(engine, pack)
    bars = {g["work_id"]: g for i in timeline["identities"] for g in i["generations"]}
    assert (bars[failed["a"]]["resolution"], bars[failed["a"]]["skip"]) == ("replayed", None)
    assert bars[failed["b"]]["resolution"] == "skipped"
    assert (bars[failed["b"]]["skip"]["skipped_by"], bars[failed["b"]]["skip"]["reason"]) == (
        "ops@acme",
        "deleted upstream",
    )
    assert (bars[failed["c"]]["status"], bars[failed["c"]]["resolution"]) == ("failed", None)  # still a dead letter
    assert (bars[held]["status"], bars[held]["held_behind"]) == ("pending", failed["c"])
    assert bars[replay]["held_behind"] is None  # a replay of a dead letter with no successor runs at once

    [shown] = overview.search(engine, connectors, failed["b"])
    assert shown["resolution"] == "skipped" and shown["skip"]["skipped_at"] == bars[failed["b"]]["skip"]["skipped_at"]
    [waiting] = overview.search(engine, connectors, held)
    assert (waiting["status"], waiting["held_behind"]) == ("pending", failed["c"])

    gauge = [
        s.value
        for family in QueueCollector(engine, clock).collect()
        for s in family.samples
        if s.name == "nexuscrm_dead_letters" and s.labels == {"pack": pack}
    ]
    assert gauge == [1]

    facade.skip_dead_letter(failed["c"], skipped_by="ops", reason="fixed upstream")
    timeline = overview.pack_timeline(engine, pack)
    bars = {g["work_id"]: g for i in timeline["identities"] for g in i["generations"]}
    assert (bars[failed["c"]]["resolution"], bars[held]["held_behind"]) == ("skipped", None)  # released
    [card] = [c for c in overview.packs_overview(engine, clock)["packs"] if c["pack_install_id"] == pack]
    assert (card["failures"], card["queue"]["dead_letters"]) == ([], 0)
    assert_invariants(engine)
