"""The coverage proof per identity on every backend: tiled, gaps, overlaps, and each range's state (decision 161)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.errors import ProtocolMissing, UnknownPack
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.operating.coverage import CoveragePage, ExceptionKind, IdentityCoverage, RangeState
from nexuscrm_connectors.operating.dead_letters import filter_of
from nexuscrm_connectors.operating.order_policy import Policy
from nexuscrm_connectors.settings import Settings
from nexuscrm_schema.tables import Event, WorkItem
from tests.support.factories import delivery, install_pack, route
from tests.support.invariants import assert_invariants
from tests.support.plans import explain_problems
from tests.support.statements import capture
from workqueue.errors import InvalidArgument

pytestmark = pytest.mark.database


def _coverage(connectors: Connectors, pack: str) -> dict[str, IdentityCoverage]:
    """Every identity's proof, all pages walked, by source lane."""
    found: dict[str, IdentityCoverage] = {}
    token = ""
    while True:
        page: CoveragePage = connectors.get_coverage(pack, filter_of(pack), page_size=2, page_token=token)
        found |= {i.route.source_lane: i for i in page.identities}
        token = page.next_page_token
        if not token:
            return found


def _states(identity: IdentityCoverage) -> list[RangeState]:
    return [r.state for r in identity.ranges]


def _drain(connectors: Connectors, pack: str, *, fail_lanes: frozenset[str] = frozenset()) -> None:
    """Claim everything claimable; fail for good the generations of ``fail_lanes``, complete the others."""
    while claims := connectors.claim("w", pack_install_ids=[pack], max_items=100):
        for claim in claims:
            if claim.work.projection_key.rsplit(":", 1)[1] in fail_lanes:
                connectors.fail(claim.work.work_id, lease_token=claim.lease_token, error="boom", retryable=False)
            else:
                connectors.complete(claim.work.work_id, lease_token=claim.lease_token)


def test_a_clean_run_is_proven_complete(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    for _ in range(3):
        connectors.ingest(pack, items=[delivery(lane=lane) for lane in "abcde"])
        _drain(connectors, pack)
    connectors.ingest(pack, items=[delivery(lane="a")])  # queued
    connectors.ingest(pack, items=[delivery(lane="b")])
    claimed = connectors.claim("w", pack_install_ids=[pack], max_items=2)
    assert len(claimed) == 2
    connectors.ingest(pack, items=[delivery(lane="c")])  # queued behind nothing: c's last completed

    found = _coverage(connectors, pack)
    assert sorted(found) == list("abcde")
    assert all(i.tiled and i.exceptions == () and i.exception_count == 0 for i in found.values())
    assert _states(found["a"]) == [RangeState.COMPLETED] * 3 + [RangeState.IN_FLIGHT]
    assert _states(found["c"]) == [RangeState.COMPLETED] * 3 + [RangeState.QUEUED]
    assert _states(found["d"]) == [RangeState.COMPLETED] * 3 and found["d"].inputs == 3
    assert found["c"].high_water_ordinal == found["c"].ranges[-1].end_ordinal
    only = connectors.get_coverage(pack, filter_of(pack, route=route("b")))
    assert [i.route.source_lane for i in only.identities] == ["b"] and only.next_page_token == ""
    assert connectors.get_coverage(pack, filter_of(pack, work_type="invoice")).identities == ()
    assert_invariants(engine)


def test_a_gap_and_an_overlap_written_directly_are_detected_and_listed(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    for _ in range(3):
        connectors.ingest(pack, items=[delivery(lane="a"), delivery(lane="b")])
        _drain(connectors, pack)
    a = _coverage(connectors, pack)["a"]
    middle = a.ranges[1]
    with engine.begin() as connection:  # a's middle generation is lost: its input is in no range
        connection.execute(sa.delete(WorkItem).where(WorkItem.c.WorkId == middle.work_id))
    b = _coverage(connectors, pack)["b"]
    with engine.begin() as connection:  # b's last generation is stretched over its middle one
        connection.execute(
            sa.update(WorkItem)
            .where(WorkItem.c.WorkId == b.ranges[2].work_id)
            .values(InputStartOrdinal=b.ranges[1].start_ordinal)
        )

    found = _coverage(connectors, pack)
    assert not found["a"].tiled and found["a"].exception_count == 1
    (gap,) = found["a"].exceptions
    assert (gap.kind, gap.start_ordinal, gap.end_ordinal) == (
        ExceptionKind.GAP,
        middle.start_ordinal,
        middle.end_ordinal,
    )
    (overlap,) = found["b"].exceptions
    assert overlap.kind is ExceptionKind.OVERLAP
    assert overlap.work_ids == (b.ranges[1].work_id, b.ranges[2].work_id)
    assert (overlap.start_ordinal, overlap.end_ordinal) == (b.ranges[1].start_ordinal, b.ranges[1].end_ordinal)
    with engine.begin() as connection:  # an input admitted to a with no generation at all
        last = connection.execute(
            sa.select(Event).where(Event.c.PackInstallId == pack, Event.c.EnqueueOrdinal == a.ranges[-1].end_ordinal)
        ).one()
        orphan = last._asdict() | {"EnqueueOrdinal": last.EnqueueOrdinal + 1000, "ReceiptKey": None}
        connection.execute(sa.insert(Event).values(**orphan))
    late = _coverage(connectors, pack)["a"]
    assert [e.kind for e in late.exceptions] == [ExceptionKind.GAP, ExceptionKind.GAP]
    assert late.high_water_ordinal == a.ranges[-1].end_ordinal + 1000


def test_failed_replayed_skipped_and_pruned_ranges_are_reported_as_such(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    for _ in range(3):
        connectors.ingest(pack, items=[delivery(lane="a"), delivery(lane="b"), delivery(lane="c")])
        _drain(connectors, pack, fail_lanes=frozenset("abc"))
    dead = _coverage(connectors, pack)
    connectors.replay(dead["b"].ranges[0].work_id)
    connectors.skip_dead_letter(dead["c"].ranges[0].work_id, skipped_by="ops", reason="not needed")
    _drain(connectors, pack)
    connectors.set_retention_policy(pack, keep_generations=2, keep_seconds=None)
    connectors.prune(pack)

    found = _coverage(connectors, pack)
    assert all(i.tiled for i in found.values())
    assert _states(found["a"]) == [RangeState.PRUNED, RangeState.FAILED, RangeState.FAILED]
    assert _states(found["c"]) == [RangeState.PRUNED, RangeState.FAILED, RangeState.FAILED]
    b = found["b"]
    assert _states(b) == [RangeState.PRUNED, RangeState.PRUNED, RangeState.FAILED, RangeState.COMPLETED]
    assert b.inputs == 2 and b.high_water_ordinal == b.ranges[-1].end_ordinal
    assert_invariants(engine)


def test_skipped_and_replayed_ranges_before_pruning(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane="a"), delivery(lane="b")])
    _drain(connectors, pack, fail_lanes=frozenset("ab"))
    dead = _coverage(connectors, pack)
    replay = connectors.replay(dead["a"].ranges[0].work_id)
    connectors.skip_dead_letter(dead["b"].ranges[0].work_id, skipped_by="ops", reason="not needed")
    found = _coverage(connectors, pack)
    (failed, replaying) = found["a"].ranges
    assert (failed.state, failed.replayed_by) == (RangeState.REPLAYED, replay.work.work_id)
    assert (replaying.work_id, replaying.state) == (replay.work.work_id, RangeState.QUEUED)
    assert _states(found["b"]) == [RangeState.SKIPPED]
    assert all(i.tiled for i in found.values())
    assert_invariants(engine)


@pytest.mark.parametrize("policy", [Policy.CONTINUE, Policy.BLOCK])
def test_a_failing_flow_before_and_after_a_bulk_replay(
    engine: sa.Engine, connectors: Connectors, policy: Policy
) -> None:
    pack = install_pack(engine)
    connectors.set_order_policy(pack, policy, set_by="ops", reason="test")
    connectors.ingest(pack, items=[delivery(lane="a"), delivery(lane="b")])
    _drain(connectors, pack, fail_lanes=frozenset("a"))
    connectors.ingest(pack, items=[delivery(lane="a"), delivery(lane="b")])
    _drain(connectors, pack)  # under "block" a's successor is held behind its dead letter
    before = _coverage(connectors, pack)
    held = RangeState.QUEUED if policy is Policy.BLOCK else RangeState.COMPLETED
    assert _states(before["a"]) == [RangeState.FAILED, held]
    assert _states(before["b"]) == [RangeState.COMPLETED] * 2
    assert all(i.tiled for i in before.values())

    replayed = connectors.replay_dead_letters(pack, filter_of(pack), dry_run=False)
    assert len(replayed.answers) == 1
    _drain(connectors, pack)
    after = _coverage(connectors, pack)
    assert _states(after["a"]) == [RangeState.REPLAYED, RangeState.COMPLETED, RangeState.COMPLETED]
    assert after["a"].ranges[0].replayed_by == after["a"].ranges[2].work_id
    assert all(i.tiled for i in after.values())
    assert after["a"].high_water_ordinal > before["a"].high_water_ordinal
    assert_invariants(engine)


def test_bad_coverage_requests_are_refused(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    with pytest.raises(UnknownPack, match="is not installed"):
        connectors.get_coverage("pk-none", filter_of("pk-none"))
    with pytest.raises(InvalidArgument, match="page_token is not a token from a previous GetCoverage page"):
        connectors.get_coverage(pack, filter_of(pack), page_token="garbage")
    with pytest.raises(InvalidArgument, match="page_size must be between"):
        connectors.get_coverage(pack, filter_of(pack), page_size=-1)
    with pytest.raises(ProtocolMissing, match="no projection protocol row"):
        legacy = install_pack(engine, legacy_max_ordinal=None)
        connectors.get_coverage(legacy, filter_of(legacy))


def test_a_coverage_page_reads_index_seeks_and_ranges(engine: sa.Engine) -> None:
    connectors = Connectors(engine, Settings(default_page_size=5, max_page_size=50))
    pack = install_pack(engine)
    for _ in range(3):
        connectors.ingest(pack, items=[delivery(lane=f"l{n:02}") for n in range(30)])
        _drain(connectors, pack, fail_lanes=frozenset({"l03"}))
    connectors.set_retention_policy(pack, keep_generations=1, keep_seconds=None)
    connectors.prune(pack)
    with capture(engine) as captured:
        page = connectors.get_coverage(pack, filter_of(pack))
        connectors.get_coverage(pack, filter_of(pack), page_token=page.next_page_token)
    assert len(page.identities) == 5
    reads = [c for c in captured.statements if "ProjectionKey" in c.statement]
    assert len(reads) == 2 * (5 * 3 + 5 * 3)  # per identity: three seeks for its key, three ranges
    with engine.connect() as connection:
        for read in {r.statement: r for r in reads}.values():
            assert explain_problems(connection, read.statement, read.parameters) == [], read.statement
