"""Skipping dead letters in bulk, by the bulk replay's filters, and a skip shown with its generation (decision 176).

On every backend: a dry run first, then a skip per WorkId in its own transaction; a filter
that keeps no dead letter is NOT_FOUND and changes nothing, for a replay as for a skip; a bulk
skip racing a bulk replay over the same dead letters leaves each replayed once or skipped
once, never both; GetWork, ListGenerations and ExplainReceipt carry who skipped, when and why.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import grpc
import pytest
import sqlalchemy as sa

from nexuscrm.connectors.v1 import connectors_pb2 as pb
from nexuscrm.connectors.v1 import connectors_pb2_grpc as pb_grpc
from nexuscrm_connectors.errors import ReplayRefused
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.operating.dead_letters import BulkCall, NothingMatches, Verdict, filter_of
from nexuscrm_schema.tables import SkippedWork
from nexuscrm_wire import convert
from tests.connectors.integration.test_dead_letters import fail_all
from tests.connectors.integration.test_queue_and_generation_reads import channel, client, server
from tests.connectors.replays import replays_per_work
from tests.support.checksums import database_digest
from tests.support.factories import delivery, install_pack, route
from tests.support.invariants import assert_invariants
from workqueue.errors import InvalidArgument

pytestmark = pytest.mark.database
__all__ = ["channel", "client", "server"]  # the gRPC fixtures, shared


def _lane(connectors: Connectors, work_id: str) -> str:
    return connectors.get_work(work_id).work.projection_key.rsplit(":", 1)[1]


def test_dead_letters_are_skipped_in_bulk_by_filter_after_a_dry_run(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane=lane) for lane in ("a", "b", "c")])
    failed = fail_all(connectors, pack, "boom")
    by_lane = {_lane(connectors, work_id): work_id for work_id in failed}
    only_a = filter_of(pack, route=route("a"))

    before = database_digest(engine)
    dry = connectors.skip_dead_letters(pack, only_a, skipped_by="ops@acme", reason="deleted upstream", dry_run=True)
    assert database_digest(engine) == before  # a dry run changes nothing
    assert [(a.work_id, a.verdict) for a in dry.answers] == [(by_lane["a"], Verdict.WOULD_SKIP)]
    assert (dry.dry_run, dry.next_page_token) == (True, "")

    done = connectors.skip_dead_letters(pack, only_a, skipped_by="ops@acme", reason="deleted upstream", dry_run=False)
    assert [(a.work_id, a.verdict, a.replay_work_id) for a in done.answers] == [(by_lane["a"], Verdict.SKIPPED, "")]
    skip = connectors.skips([by_lane["a"], by_lane["b"]])
    assert list(skip) == [by_lane["a"]]  # b was not skipped
    assert (skip[by_lane["a"]].skipped_by, skip[by_lane["a"]].reason) == ("ops@acme", "deleted upstream")
    listed = connectors.list_dead_letters(pack, filter_of(pack)).dead_letters
    assert sorted(w.work_id for w in listed) == sorted([by_lane["b"], by_lane["c"]])
    with pytest.raises(ReplayRefused, match=f"work {by_lane['a']} failed and was skipped at .* by ops@acme"):
        connectors.replay(by_lane["a"])  # skipped once: never replayed too

    rest = connectors.skip_dead_letters(pack, filter_of(pack), skipped_by="ops", reason="bad release", dry_run=False)
    assert sorted((a.work_id, a.verdict) for a in rest.answers) == sorted(
        [(by_lane["b"], Verdict.SKIPPED), (by_lane["c"], Verdict.SKIPPED)]
    )
    assert connectors.list_dead_letters(pack, filter_of(pack)).dead_letters == ()
    assert_invariants(engine)


def test_a_filter_that_keeps_no_dead_letter_is_refused_and_changes_nothing(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane=f"l{n}") for n in range(15)])
    fail_all(connectors, pack, "boom")
    nothing = filter_of(pack, error_contains="no such error")
    before = database_digest(engine)

    def skip(dry_run: bool, page_token: str = "") -> BulkCall:
        return connectors.skip_dead_letters(
            pack, nothing, skipped_by="o", reason="r", dry_run=dry_run, max_generations=1, page_token=page_token
        )

    def replay(dry_run: bool, page_token: str = "") -> BulkCall:
        return connectors.replay_dead_letters(pack, nothing, dry_run=dry_run, max_generations=1, page_token=page_token)

    bulk_calls: list[Callable[[bool, str], BulkCall]] = [skip, replay]
    for bulk in bulk_calls:
        for dry_run in (True, False):
            # One call examines ten failed generations per dead letter asked for: the first finds
            # none yet and continues; the second reaches the end and none was ever kept.
            first = bulk(dry_run, "")
            assert first.answers == () and first.next_page_token
            with pytest.raises(NothingMatches, match=f"no dead letter of pack {pack} matches the filter") as raised:
                bulk(dry_run, first.next_page_token)
            assert raised.value.kind.value == "NOT_FOUND"
    assert database_digest(engine) == before

    replayed = connectors.replay_dead_letters(pack, filter_of(pack), dry_run=False, max_generations=15)
    assert {a.verdict for a in replayed.answers} == {Verdict.REPLAYED}
    with pytest.raises(NothingMatches, match="nothing to skip"):  # replayed: none is a dead letter any more
        connectors.skip_dead_letters(pack, filter_of(pack), skipped_by="o", reason="r", dry_run=True)
    assert_invariants(engine)


def test_bad_bulk_skips_are_refused_and_change_nothing(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery()])
    fail_all(connectors, pack, "boom")
    everything = filter_of(pack)
    before = database_digest(engine)
    with pytest.raises(InvalidArgument, match="reason is required"):
        connectors.skip_dead_letters(pack, everything, skipped_by="o", reason="", dry_run=True)
    with pytest.raises(InvalidArgument, match="skipped_by is required"):
        connectors.skip_dead_letters(pack, everything, skipped_by="", reason="r", dry_run=False)
    with pytest.raises(InvalidArgument, match="max_generations must be between 0 and"):
        connectors.skip_dead_letters(pack, everything, skipped_by="o", reason="r", dry_run=False, max_generations=-1)
    with pytest.raises(InvalidArgument, match="page_token is not a token from a previous SkipDeadLetters page"):
        connectors.skip_dead_letters(pack, everything, skipped_by="o", reason="r", dry_run=False, page_token="x")
    assert database_digest(engine) == before
    assert_invariants(engine)


def test_a_bulk_skip_racing_a_bulk_replay_leaves_each_dead_letter_replayed_or_skipped_once(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane=f"lane-{n}") for n in range(12)])
    dead = set(fail_all(connectors, pack, "boom"))
    start = threading.Barrier(2)
    done: dict[Verdict, list[str]] = {Verdict.REPLAYED: [], Verdict.SKIPPED: []}
    errors: list[BaseException] = []

    def walk(bulk: Callable[[str], BulkCall]) -> None:
        start.wait()
        token = ""
        try:
            while True:
                call = bulk(token)
                for answer in call.answers:
                    if answer.verdict in done:
                        done[answer.verdict].append(answer.work_id)
                    else:  # the other walk took it between this call's read and its act
                        assert answer.verdict is Verdict.REFUSED, answer
                        assert "was skipped at" in answer.message or "was replayed as" in answer.message
                token = call.next_page_token
                if not token:
                    return
        except NothingMatches:  # the other walk took every dead letter before this one looked
            return
        except BaseException as error:  # asserted below: nothing else may fail
            errors.append(error)

    threads = [
        threading.Thread(
            target=walk,
            args=(
                lambda token: connectors.replay_dead_letters(
                    pack, filter_of(pack), dry_run=False, max_generations=5, page_token=token
                ),
            ),
        ),
        threading.Thread(
            target=walk,
            args=(
                lambda token: connectors.skip_dead_letters(
                    pack,
                    filter_of(pack),
                    skipped_by="ops",
                    reason="race",
                    dry_run=False,
                    max_generations=7,
                    page_token=token,
                ),
            ),
        ),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    replayed, skipped = set(done[Verdict.REPLAYED]), set(done[Verdict.SKIPPED])
    assert replayed | skipped == dead and not replayed & skipped
    with engine.connect() as connection:
        assert replays_per_work(connection, pack) == dict.fromkeys(replayed, 1)
        recorded = set(connection.execute(sa.select(SkippedWork.c.WorkId)).scalars())
    assert recorded == skipped
    assert_invariants(engine)


def test_a_skip_is_shown_with_its_generation_over_grpc(
    engine: sa.Engine, connectors: Connectors, channel: grpc.Channel
) -> None:
    pack = install_pack(engine)
    first = delivery(lane="a")
    connectors.ingest(pack, items=[first, delivery(lane="b")])
    failed = fail_all(connectors, pack, "boom")
    by_lane = {_lane(connectors, work_id): work_id for work_id in failed}
    stub = pb_grpc.ConnectorsServiceStub(channel)
    request = pb.SkipDeadLettersRequest(
        filter=pb.DeadLetterFilter(pack_install_id=pack, route=convert.route_to_proto(route("a"))),
        skipped_by="ops@acme",
        reason="deleted upstream",
    )
    answered = stub.SkipDeadLetters(request, timeout=30)
    assert [(a.work_id, a.verdict) for a in answered.answers] == [(by_lane["a"], pb.DEAD_LETTER_VERDICT_SKIPPED)]

    shown = stub.GetWork(pb.GetWorkRequest(work_id=by_lane["a"]), timeout=30).work
    recorded = connectors.skips([by_lane["a"]])[by_lane["a"]]
    assert (shown.skip.skipped_by, shown.skip.reason) == ("ops@acme", "deleted upstream")
    assert shown.skip.skipped_at.ToDatetime() == recorded.skipped_at
    assert not stub.GetWork(pb.GetWorkRequest(work_id=by_lane["b"]), timeout=30).work.HasField("skip")
    listed = stub.ListGenerations(pb.ListGenerationsRequest(pack_install_id=pack), timeout=30).generations
    assert {w.work_id: w.skip.skipped_by for w in listed} == {by_lane["a"]: "ops@acme", by_lane["b"]: ""}
    why = stub.ExplainReceipt(pb.ExplainReceiptRequest(pack_install_id=pack, receipt_key=first.receipt_key))
    assert why.covered_by.skip.reason == "deleted upstream"
    assert why.explanation.endswith("by ops@acme: deleted upstream.")

    before = database_digest(engine)
    with pytest.raises(grpc.RpcError) as again:  # a is skipped, not a dead letter any more
        stub.SkipDeadLetters(request, timeout=30)
    assert again.value.code() is grpc.StatusCode.NOT_FOUND
    assert "no dead letter of pack" in (again.value.details() or "")
    with pytest.raises(grpc.RpcError) as anonymous:
        stub.SkipDeadLetters(pb.SkipDeadLettersRequest(filter=request.filter, reason="r"), timeout=30)
    assert anonymous.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert database_digest(engine) == before
    assert_invariants(engine)
