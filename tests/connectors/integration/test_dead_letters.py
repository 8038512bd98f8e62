"""Failed work as a dead-letter queue on every backend: list, count, bulk replay with a dry run (decision 159)."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.errors import ReplayRefused, UnknownPack
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.operating import dead_letters
from nexuscrm_connectors.operating.dead_letters import Verdict, filter_of
from nexuscrm_connectors.settings import Settings
from tests.support.checksums import database_digest
from tests.support.factories import delivery, install_pack, route
from tests.support.invariants import assert_invariants
from tests.support.plans import explain_problems
from tests.support.statements import capture
from workqueue import WorkStatus
from workqueue.errors import InvalidArgument

pytestmark = pytest.mark.database


def fail_all(connectors: Connectors, pack: str, error: str) -> list[str]:
    """Claim everything claimable in ``pack`` and fail it for good with ``error``; the WorkIds, in claim order."""
    failed = []
    while claims := connectors.claim("w", pack_install_ids=[pack], max_items=100):
        for claim in claims:
            connectors.fail(claim.work.work_id, lease_token=claim.lease_token, error=error, retryable=False)
            failed.append(claim.work.work_id)
    return failed


def test_a_failing_flow_is_listed_counted_dry_run_and_replayed_in_ordinal_order(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane="a"), delivery(lane="b"), delivery(lane="c")])
    claims = connectors.claim("w", pack_install_ids=[pack], max_items=3)
    by_lane = {c.work.projection_key.rsplit(":", 1)[1]: c for c in claims}
    connectors.ingest(pack, items=[delivery(lane="a")])  # a's successor, blocked behind the running generation
    connectors.complete(by_lane["c"].work.work_id, lease_token=by_lane["c"].lease_token)
    for lane in ("a", "b"):
        claim = by_lane[lane]
        connectors.fail(claim.work.work_id, lease_token=claim.lease_token, error=f"boom {lane}", retryable=False)
    (second_a,) = fail_all(connectors, pack, "boom again")  # a's successor ran after a failed, and failed too
    everything = filter_of(pack)

    page = connectors.list_dead_letters(pack, everything)
    assert [w.work_id for w in page.dead_letters] == [
        by_lane["a"].work.work_id,
        by_lane["b"].work.work_id,
        second_a,
    ]
    assert [w.last_error for w in page.dead_letters] == ["boom a", "boom b", "boom again"]
    assert all(w.status is WorkStatus.FAILED and w.attempt == 1 for w in page.dead_letters)
    assert page.next_page_token == ""
    only_a = connectors.list_dead_letters(pack, filter_of(pack, route=route("a")))
    assert [w.work_id for w in only_a.dead_letters] == [by_lane["a"].work.work_id, second_a]
    assert [
        w.work_id for w in connectors.list_dead_letters(pack, filter_of(pack, error_contains="again")).dead_letters
    ] == [second_a]
    assert connectors.list_dead_letters(pack, filter_of(pack, work_type="invoice")).dead_letters == ()
    later = page.dead_letters[2].finished_at
    assert later is not None
    assert [
        w.work_id for w in connectors.list_dead_letters(pack, filter_of(pack, finished_after=later)).dead_letters
    ] == [second_a]

    count = connectors.count_dead_letters(pack, everything)
    assert [(i.route.source_lane, i.dead_letters) for i in count.identities] == [("a", 2), ("b", 1)]
    assert (count.total, count.examined, count.complete) == (3, 3, True)

    before = database_digest(engine)
    dry = connectors.replay_dead_letters(pack, everything, dry_run=True)
    assert database_digest(engine) == before  # a dry run changes nothing
    assert [(a.route.source_lane, a.verdict) for a in dry.answers] == [
        ("a", Verdict.WOULD_REPLAY),
        ("a", Verdict.WOULD_REPLAY),
        ("b", Verdict.WOULD_REPLAY),
    ]

    done = connectors.replay_dead_letters(pack, everything, dry_run=False)
    assert [(a.work_id, a.verdict) for a in done.answers] == [
        (by_lane["a"].work.work_id, Verdict.REPLAYED),
        (second_a, Verdict.REPLAYED),
        (by_lane["b"].work.work_id, Verdict.REPLAYED),
    ]
    replays = {a.work_id: connectors.get_work(a.replay_work_id).work for a in done.answers}
    first, then = replays[by_lane["a"].work.work_id], replays[second_a]
    assert first.lane_ordinal < then.lane_ordinal  # one identity's replays keep their ordinal order
    assert (first.status, then.status) == (WorkStatus.PENDING, WorkStatus.BLOCKED)
    assert connectors.list_dead_letters(pack, everything).dead_letters == ()  # replayed: no longer dead letters
    claimed = connectors.claim("w", pack_install_ids=[pack], max_items=10)
    assert sorted(c.work.work_id for c in claimed) == sorted(
        [first.work_id, replays[by_lane["b"].work.work_id].work_id]
    )
    for claim in claimed:
        connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    (last,) = connectors.claim("w", pack_install_ids=[pack])
    assert last.work.work_id == then.work_id  # unblocked once the first replay completed
    connectors.complete(last.work.work_id, lease_token=last.lease_token)
    assert_invariants(engine)


def test_a_refused_replay_is_answered_alone_and_the_others_go_on(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane="a"), delivery(lane="b")])
    failed = fail_all(connectors, pack, "boom")
    refused_id = min(failed)

    def replay_one(work_id: str) -> str:
        if work_id == refused_id:
            raise ReplayRefused(f"work {work_id} refused by the test")
        return connectors.replay(work_id).work.work_id

    answered = dead_letters.replay_dead_letters(connectors.context, pack, filter_of(pack), replay_one, dry_run=False)
    verdicts = {a.work_id: (a.verdict, a.error_kind) for a in answered.answers}
    assert verdicts[refused_id] == (Verdict.REFUSED, "FAILED_PRECONDITION")
    assert [v for w, v in verdicts.items() if w != refused_id] == [(Verdict.REPLAYED, "")]
    assert [w.work_id for w in connectors.list_dead_letters(pack, filter_of(pack)).dead_letters] == [refused_id]
    assert_invariants(engine)


def test_a_filter_matching_many_rows_is_paged_and_never_one_transaction(engine: sa.Engine) -> None:
    connectors = Connectors(engine, Settings(default_page_size=50, max_page_size=200))
    pack = install_pack(engine)
    for batch in range(6):
        connectors.ingest(pack, items=[delivery(lane=f"l{batch}-{n}") for n in range(100)])
    failed = fail_all(connectors, pack, "boom")
    assert len(failed) == 600
    listed, token, pages = [], "", 0
    while True:
        page = connectors.list_dead_letters(pack, filter_of(pack), page_token=token)
        assert len(page.dead_letters) <= 50
        listed += [w.work_id for w in page.dead_letters]
        pages, token = pages + 1, page.next_page_token
        if not token:
            break
    assert sorted(listed) == sorted(failed) and pages >= 12
    with pytest.raises(InvalidArgument, match="max_generations must be between 0 and 200"):
        connectors.replay_dead_letters(pack, filter_of(pack), dry_run=False, max_generations=201)
    calls, replayed, token = 0, 0, ""
    while True:
        call = connectors.replay_dead_letters(
            pack, filter_of(pack), dry_run=False, max_generations=200, page_token=token
        )
        assert len(call.answers) <= 200  # one call: at most 200 replays, each its own transaction
        replayed += sum(a.verdict is Verdict.REPLAYED for a in call.answers)
        calls, token = calls + 1, call.next_page_token
        if not token:
            break
    assert (replayed, calls) == (600, 4)  # three full calls, and a fourth that finds no more
    assert connectors.count_dead_letters(pack, filter_of(pack)).total == 0
    assert_invariants(engine)


def test_bad_dead_letter_requests_are_refused(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    now = dt.datetime(2026, 1, 1)
    with pytest.raises(UnknownPack):
        connectors.list_dead_letters("pk-none", filter_of("pk-none"))
    with pytest.raises(UnknownPack):
        connectors.replay_dead_letters("pk-none", filter_of("pk-none"), dry_run=True)
    with pytest.raises(InvalidArgument, match="page_token is not a token"):
        connectors.list_dead_letters(pack, filter_of(pack), page_token="garbage")
    with pytest.raises(InvalidArgument, match=r"finished_after .* must be before finished_before"):
        filter_of(pack, finished_after=now, finished_before=now)
    with pytest.raises(InvalidArgument, match=r"route\.source_lane"):
        filter_of(pack, route=route(""))
    with pytest.raises(InvalidArgument, match="differs from the route's"):
        filter_of(pack, route=route("a"), work_type="invoice")
    with pytest.raises(InvalidArgument, match="pack_install_id is required"):
        filter_of("")


def test_the_dead_letter_reads_are_bounded_index_ranges(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane=f"l{n}") for n in range(60)])
    fail_all(connectors, pack, "boom")
    wanted = filter_of(pack, error_contains="bo", finished_after=dt.datetime(2000, 1, 1))
    with capture(engine) as captured:
        page = connectors.list_dead_letters(pack, wanted, page_size=10)
        connectors.list_dead_letters(pack, wanted, page_size=10, page_token=page.next_page_token)
        connectors.count_dead_letters(pack, wanted)
    reads = [c for c in captured.statements if "ClaimPause" not in c.statement and "WorkItem" in c.statement]
    assert len(reads) == 3
    with engine.connect() as connection:
        for read in reads:
            assert explain_problems(connection, read.statement, read.parameters) == [], read.statement
