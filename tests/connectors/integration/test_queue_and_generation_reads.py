"""Reads of the native queue and of generations, on every backend, in process and over gRPC.

GetQueueState / WaitQueueDrained (depth per status, receipts waiting behind a fence, the
oldest waiting generation and its age, drained), ListGenerations (an identity's generations
newest first, paged) and ListMembers (a generation's members in ordinal order, paged, without
a lease). The facade and the SDK client answer alike; bad input is INVALID_ARGUMENT naming the
field, unknown ids NOT_FOUND, and no read changes a row.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
from collections.abc import Iterator

import grpc
import pytest
import sqlalchemy as sa

from nexuscrm.connectors.v1 import connectors_pb2 as pb
from nexuscrm.connectors.v1 import connectors_pb2_grpc as pb_grpc
from nexuscrm_connectors.errors import RangeNotRecorded, UnknownPack, WorkNotFound
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.servicer import registration
from nexuscrm_connectors.settings import Settings
from nexuscrm_runtime.server import RunningServer, create_server
from nexuscrm_schema import tables
from nexuscrm_sdk.client import ConnectorsClient
from tests.support.checksums import database_digest
from tests.support.factories import FakeClock, delivery, fence_pack, install_pack, lift_fence, route
from tests.support.invariants import assert_invariants
from tests.support.statuses import violation_field
from workqueue import WorkStatus
from workqueue.errors import InvalidArgument
from workqueue.values import QueueState

pytestmark = pytest.mark.database


@pytest.fixture
def server(connectors: Connectors) -> Iterator[RunningServer]:
    running = create_server([registration(connectors)], "127.0.0.1:0")
    yield running
    running.stop(0)


@pytest.fixture
def channel(server: RunningServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        yield channel


@pytest.fixture
def client(channel: grpc.Channel) -> ConnectorsClient:
    return ConnectorsClient(channel)


def _finish(connectors: Connectors, pack: str) -> None:
    """Claim and complete every generation of the pack until none is left."""
    while claims := connectors.claim("finisher", pack_install_ids=[pack], max_items=10):
        for claim in claims:
            connectors.complete(claim.work.work_id, lease_token=claim.lease_token)


def _created_at(engine: sa.Engine, work_id: str) -> dt.datetime:
    with engine.connect() as connection:
        created = sa.select(tables.WorkItem.c.CreatedAt).where(tables.WorkItem.c.WorkId == work_id)
        value: dt.datetime = connection.execute(created).scalar_one()
    return value


def test_queue_state_counts_the_native_queue_and_names_its_oldest_waiting_generation(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock, client: ConnectorsClient
) -> None:
    pack = install_pack(engine)
    empty = connectors.queue_state(pack)
    assert empty.drained and empty.depth == 0 and empty.oldest_waiting_work_id is None
    assert empty.oldest_waiting_age is None

    first = connectors.ingest(pack, items=[delivery(lane="a"), delivery(lane="a"), delivery(lane="a")])
    clock.advance(2)
    connectors.ingest(pack, items=[delivery(lane="b")])
    clock.advance(3)
    state = connectors.queue_state(pack)
    assert (state.pending, state.blocked, state.retry, state.processing) == (2, 0, 0, 0)
    assert state.oldest_waiting_work_id == first[0].work_id  # holds ordinal 1, the oldest input
    assert state.oldest_waiting_since == _created_at(engine, first[0].work_id)
    # Ages are on the database's clock, which the test moved by 5 s (and real time a little more).
    assert state.oldest_waiting_age == state.read_at - state.oldest_waiting_since >= dt.timedelta(seconds=5)
    assert not state.drained

    held = connectors.claim("w", pack_install_ids=[pack])[0]  # lane a: running, no longer waiting
    assert held.work.work_id == first[0].work_id
    connectors.ingest(pack, items=[delivery(lane="a")])  # its successor waits behind it
    state = connectors.queue_state(pack)
    assert (state.pending, state.blocked, state.processing) == (1, 1, 1)
    lane_b = connectors.list_generations(pack, route=route("b")).generations[0]
    assert state.oldest_waiting_work_id == lane_b.work_id
    assert state.oldest_waiting_since == _created_at(engine, lane_b.work_id)
    assert dt.timedelta(seconds=3) <= state.oldest_waiting_age == state.read_at - state.oldest_waiting_since

    over_grpc = client.queue_state(pack)  # the same state, in aware UTC
    assert (
        dataclasses.replace(
            over_grpc,
            oldest_waiting_since=over_grpc.oldest_waiting_since.replace(tzinfo=None)
            if over_grpc.oldest_waiting_since
            else None,
            read_at=state.read_at,
            oldest_waiting_age=state.oldest_waiting_age,
        )
        == state
    )
    assert over_grpc.oldest_waiting_age is not None and state.oldest_waiting_age is not None
    assert over_grpc.oldest_waiting_age >= state.oldest_waiting_age  # read later, on the same clock

    connectors.fail(held.work.work_id, lease_token=held.lease_token, error="flaky")
    assert connectors.queue_state(pack).retry == 1
    clock.advance(600)  # the retry comes due
    _finish(connectors, pack)
    assert connectors.queue_state(pack).drained
    assert_invariants(engine)


def test_receipts_held_by_a_fence_keep_the_queue_undrained(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    fence = fence_pack(engine, pack, reason="maintenance")
    results = connectors.ingest(pack, items=[delivery(), delivery()])
    state = connectors.queue_state(pack)
    assert [r.outcome.value for r in results] == ["fenced", "fenced"]
    assert state.depth == 0 and state.receipts_waiting == 2 and not state.drained
    lift_fence(engine, fence)
    assert connectors.materialize() == 2
    assert connectors.queue_state(pack).pending == 1
    _finish(connectors, pack)
    final = connectors.queue_state(pack)
    assert final.drained and (final.depth, final.receipts_waiting, final.oldest_waiting_age) == (0, 0, None)
    assert_invariants(engine)


def test_old_protocol_work_is_not_part_of_the_native_queue(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery()])
    with engine.begin() as connection:  # the same generation as old-protocol work: no recorded range
        connection.execute(sa.update(tables.WorkItem).values(InputStartOrdinal=None))
    assert connectors.queue_state(pack).drained
    work_id = connectors.list_generations(pack, route=route()).generations[0].work_id
    with pytest.raises(RangeNotRecorded, match="old-protocol"):
        connectors.list_members(work_id)


def test_wait_queue_drained_answers_once_the_last_generation_completes(
    engine: sa.Engine, connectors: Connectors, client: ConnectorsClient
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane="a"), delivery(lane="b")])
    held = connectors.claim("w", pack_install_ids=[pack], max_items=2)
    assert len(held) == 2

    # The deadline is an answer: a wait that ends first says what still holds the queue.
    undrained = client.wait_queue_drained(pack, timeout=dt.timedelta(milliseconds=100))
    assert not undrained.drained and undrained.processing == 2

    waiting = threading.Event()
    answers: list[QueueState] = []

    def wait() -> None:
        waiting.set()
        answers.append(client.wait_queue_drained(pack, timeout=dt.timedelta(seconds=60)))

    waiter = threading.Thread(target=wait)
    waiter.start()
    waiting.wait()
    for claim in held:  # completing in this process wakes the waiting call at once
        connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    waiter.join()
    assert answers[0].drained and answers[0].depth == 0
    assert connectors.wait_queue_drained(pack, timeout=dt.timedelta(0)).drained  # the facade, alike
    assert_invariants(engine)


def test_one_wait_is_cut_to_the_servers_bound(engine: sa.Engine, clock: FakeClock) -> None:
    connectors = Connectors(engine, Settings(max_claim_wait_ms=50, claim_poll_ms=10), clock=clock)
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery()])
    state = connectors.wait_queue_drained_once(pack, wait=dt.timedelta(hours=1))  # returns after 50 ms
    assert not state.drained and state.pending == 1
    with pytest.raises(InvalidArgument, match="wait_ms must not be negative") as refused:
        connectors.wait_queue_drained_once(pack, wait=dt.timedelta(milliseconds=-1))
    assert refused.value.field == "wait_ms"


def test_list_generations_pages_an_identity_newest_first(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock, client: ConnectorsClient
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane="a"), delivery(lane="a")])
    first = connectors.claim("w", pack_install_ids=[pack])[0]  # lane a, [1, 2]
    connectors.ingest(pack, items=[delivery(lane="other"), delivery(lane="a")])  # lane a's successor [4, 4], blocked
    connectors.complete(first.work.work_id, lease_token=first.lease_token)
    replayed = connectors.replay(first.work.work_id).work  # [5, 5], replay of the first
    second = connectors.claim("w", pack_install_ids=[pack], max_items=3)
    failing = next(c for c in second if c.work.input_start_ordinal == 4)
    connectors.fail(failing.work.work_id, lease_token=failing.lease_token, error="boom")

    page = connectors.list_generations(pack, route=route("a"), page_size=2)
    assert [(g.input_start_ordinal, g.lane_ordinal) for g in page.generations] == [(5, 5), (4, 4)]
    assert page.generations[0].replay_of_work_id == first.work.work_id == replayed.replay_of_work_id
    assert (page.generations[1].status, page.generations[1].attempt) == (WorkStatus.RETRY, 1)
    assert page.generations[1].last_error == "boom" and page.next_page_token
    rest = connectors.list_generations(pack, route=route("a"), page_size=2, page_token=page.next_page_token)
    assert [(g.input_start_ordinal, g.lane_ordinal, g.status) for g in rest.generations] == [
        (1, 2, WorkStatus.COMPLETED)
    ]
    assert rest.next_page_token == ""

    remote = client.list_generations(pack, route=route("a"), page_size=2)
    assert [g.work_id for g in remote.generations] == [g.work_id for g in page.generations]
    assert remote.next_page_token == page.next_page_token
    assert remote.generations[1].claimable_at is not None  # next attempt time, aware UTC
    assert client.list_generations(pack, route=route("nobody")).generations == ()
    for claim in second:
        if claim is not failing:
            connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    clock.advance(600)
    _finish(connectors, pack)
    assert_invariants(engine)


def test_list_members_pages_in_ordinal_order_without_touching_the_lease(
    engine: sa.Engine, connectors: Connectors, client: ConnectorsClient
) -> None:
    pack = install_pack(engine)
    lanes = ["a", "b", "a", "a", "b", "a", "a"]
    results = connectors.ingest(pack, items=[delivery(f"m-{i}", lane=lane) for i, lane in enumerate(lanes)])
    claims = connectors.claim("w", pack_install_ids=[pack], max_items=2)
    held = next(c for c in claims if c.work.work_id == results[0].work_id)  # lane a
    before = database_digest(engine)

    ordinals: list[int] = []
    token = ""
    pages = 0
    while True:
        page = client.list_members(held.work.work_id, page_size=2, page_token=token)
        assert page.member_count == 5
        ordinals += [i.enqueue_ordinal for i in page.inputs]
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert ordinals == [1, 3, 4, 6, 7] and pages == 3
    first = connectors.list_members(held.work.work_id, page_size=2).inputs
    assert [(i.receipt_key, i.payload) for i in first] == [("m-0", b"payload of m-0"), ("m-2", b"payload of m-2")]
    assert database_digest(engine) == before  # a read: no lease, no status, nothing written

    loaded = [
        i.enqueue_ordinal
        for p in connectors.load_inputs(held.work.work_id, lease_token=held.lease_token)
        for i in p.inputs
    ]
    assert loaded == ordinals  # the worker's read of the same generation
    for claim in claims:
        connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    assert_invariants(engine)


def test_bad_input_is_refused_naming_the_field_and_changes_nothing(
    engine: sa.Engine, connectors: Connectors, channel: grpc.Channel
) -> None:
    pack = install_pack(engine)
    results = connectors.ingest(pack, items=[delivery()])
    work_id = results[0].work_id or ""
    stub = pb_grpc.ConnectorsServiceStub(channel)
    good_route = pb.ProjectionRoute(
        event_kind="contact.upsert",
        route_version="1",
        companion_version="crm-1.0",
        work_type="project",
        source_lane="lane-1",
    )
    before = database_digest(engine)

    def refused(call: grpc.UnaryUnaryMultiCallable, request: object) -> tuple[grpc.StatusCode, str, str]:  # type: ignore[type-arg]
        with pytest.raises(grpc.RpcError) as raised:
            call(request, timeout=30)
        error = raised.value
        return error.code(), violation_field(error), error.details() or ""

    invalid = grpc.StatusCode.INVALID_ARGUMENT
    cases = [
        (stub.GetQueueState, pb.GetQueueStateRequest(), invalid, "pack_install_id"),
        (stub.WaitQueueDrained, pb.WaitQueueDrainedRequest(pack_install_id=pack, wait_ms=-1), invalid, "wait_ms"),
        (
            stub.ListGenerations,
            pb.ListGenerationsRequest(
                pack_install_id=pack, route=pb.ProjectionRoute(**{**_fields(good_route), "event_kind": ""})
            ),
            invalid,
            "route.event_kind",
        ),
        (
            stub.ListGenerations,
            pb.ListGenerationsRequest(
                pack_install_id=pack, route=pb.ProjectionRoute(**{**_fields(good_route), "source_lane": " x"})
            ),
            invalid,
            "route.source_lane",
        ),
        (
            stub.ListGenerations,
            pb.ListGenerationsRequest(pack_install_id=pack, route=good_route, page_size=-1),
            invalid,
            "page_size",
        ),
        (
            stub.ListGenerations,
            pb.ListGenerationsRequest(pack_install_id=pack, route=good_route, page_token="not a token"),
            invalid,
            "page_token",
        ),
        (stub.ListMembers, pb.ListMembersRequest(work_id=work_id, page_size=5001), invalid, "page_size"),
        (stub.ListMembers, pb.ListMembersRequest(work_id=work_id, page_token="WyJ4Il0="), invalid, "page_token"),
        (stub.ListMembers, pb.ListMembersRequest(), invalid, "work_id"),
        (stub.ListMembers, pb.ListMembersRequest(work_id="w" * 10_000), invalid, "work_id"),
        (stub.GetQueueState, pb.GetQueueStateRequest(pack_install_id="p" * 10_000), invalid, "pack_install_id"),
        (
            stub.GetQueueState,
            pb.GetQueueStateRequest(pack_install_id="pk-nope"),
            grpc.StatusCode.NOT_FOUND,
            "pack_install_id",
        ),
        (
            stub.ListGenerations,
            pb.ListGenerationsRequest(pack_install_id="pk-nope", route=good_route),
            grpc.StatusCode.NOT_FOUND,
            "pack_install_id",
        ),
        (stub.ListMembers, pb.ListMembersRequest(work_id="no-such-work"), grpc.StatusCode.NOT_FOUND, "work_id"),
    ]
    for call, request, code, field in cases:
        answer = refused(call, request)
        assert answer[:2] == (code, field), (request, answer)
        assert len(answer[2]) < 2000  # never the whole input echoed back
    assert database_digest(engine) == before
    with pytest.raises(UnknownPack):
        connectors.queue_state("pk-nope")
    with pytest.raises(WorkNotFound):
        connectors.list_members("no-such-work")
    assert_invariants(engine)


def _fields(message: pb.ProjectionRoute) -> dict[str, str]:
    return {field.name: value for field, value in message.ListFields()}
