"""Claims that carry their generations' inputs (decision 129), on every backend, in process and over gRPC.

A claim asked for inline inputs reads the whole membership of the generations that fit (the
answer's inline inputs together at most one page of members and of payload bytes) in two more
statements whatever their number; the worker then makes no LoadInputs call for them. Larger
generations, and every generation from a server that sends no inline inputs, still stream
through LoadInputs, every member in ordinal order. On a database server the inputs are read
once the claim committed, so the leased rows are not locked meanwhile; on SQLite in the
claim's transaction (decision 142).
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import sqlalchemy as sa
from prometheus_client import REGISTRY

from nexuscrm_connectors.errors import MembershipMissing
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.servicer import registration
from nexuscrm_connectors.settings import Settings
from nexuscrm_runtime.database import is_sqlite
from nexuscrm_runtime.server import create_server
from nexuscrm_schema.tables import Event, EventPayload
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_sdk.flows import Generation
from nexuscrm_sdk.worker import Worker, WorkSource
from tests.connectors.integration.test_claims import CLAIM_STATEMENTS
from tests.support.factories import FakeClock, delivery, install_pack
from tests.support.invariants import assert_invariants, check_invariants
from tests.support.statements import COMMIT, capture
from tests.support.waiting import wait_until
from workqueue import WorkStatus
from workqueue.values import Claim, InputPage, InputRow

pytestmark = pytest.mark.database

# A claim's constant statements, then the leased generations' member sizes and the payloads of
# those that fit.
INLINE_STATEMENTS = [*CLAIM_STATEMENTS, "SELECT", "SELECT"]
LANES = 12
FOLLOW_UP_FAILURES = "nexuscrm_follow_up_failures_total"
KIB = 1024


def _streamed(connectors: Connectors, claim: Claim) -> list[InputRow]:
    pages = connectors.load_inputs(claim.work.work_id, lease_token=claim.lease_token)
    return [row for page in pages for row in page.inputs]


def _ordinals_by_lane(engine: sa.Engine, pack: str) -> dict[str, list[int]]:
    """Each lane's Events in ordinal order (a lane is its own identity here)."""
    with engine.connect() as connection:
        rows = connection.execute(
            sa.select(Event.c.ProjectionKey, Event.c.EnqueueOrdinal)
            .where(Event.c.PackInstallId == pack)
            .order_by(Event.c.EnqueueOrdinal)
        ).all()
    lanes: dict[str, list[int]] = {}
    for row in rows:
        lanes.setdefault(row.ProjectionKey, []).append(row.EnqueueOrdinal)
    return lanes


@pytest.mark.parametrize("max_items", [1, 8])
def test_a_claim_reads_the_inputs_of_its_generations_in_two_more_statements_whatever_their_number(
    engine: sa.Engine, connectors: Connectors, max_items: int
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane=f"lane-{n % LANES}") for n in range(3 * LANES)])
    with capture(engine) as captured:
        claims = connectors.claim("w", pack_install_ids=[pack], max_items=max_items, inline_inputs=True)
    statements = captured.round_trips()
    assert len(claims) == max_items
    assert statements == INLINE_STATEMENTS
    for claim in claims:
        assert claim.inputs is not None
        assert claim.inputs.last and claim.inputs.member_count == 3
        assert list(claim.inputs.inputs) == _streamed(connectors, claim)  # what LoadInputs streams
        connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    assert_invariants(engine)


def test_a_server_reads_the_inline_inputs_after_the_claims_commit_and_sqlite_within_it(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane=f"lane-{n % LANES}") for n in range(2 * LANES)])
    with capture(engine) as captured:
        claims = connectors.claim("w", pack_install_ids=[pack], max_items=4, inline_inputs=True)
    reads = ["SELECT", "SELECT"]
    if is_sqlite(engine):  # one process holds the writer: a second transaction would cost more
        assert captured.round_trips(commits=True) == [*CLAIM_STATEMENTS, *reads, COMMIT]
    else:  # the leased rows' locks are released before the payloads are read
        assert captured.round_trips(commits=True) == [*CLAIM_STATEMENTS, COMMIT, *reads]
    assert [len(claim.inputs.inputs) for claim in claims if claim.inputs is not None] == [2, 2, 2, 2]
    for claim in claims:
        assert claim.inputs is not None and list(claim.inputs.inputs) == _streamed(connectors, claim)
        connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    assert_invariants(engine)


def test_a_failed_read_after_the_commit_loses_no_claim_and_loadinputs_streams_its_inputs(
    engine: sa.Engine, connectors: Connectors, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEXUSCRM_FAULTS_ENABLED", "1")
    monkeypatch.setenv("NEXUSCRM_FAULTS", "claim inputs:follow_up=raise*")
    pack = install_pack(engine)
    admitted = connectors.ingest(pack, items=[delivery(lane="a"), delivery(lane="b"), delivery(lane="a")])
    failures = REGISTRY.get_sample_value(FOLLOW_UP_FAILURES, {"transaction": "claim inputs"}) or 0.0
    claims = connectors.claim("w", pack_install_ids=[pack], max_items=2, inline_inputs=True)
    assert sorted(claim.work.work_id for claim in claims) == sorted({result.work_id for result in admitted})
    # The read runs after the commit on a server only: there the claims come without inputs,
    # and the failed step is counted.
    assert all((claim.inputs is None) != is_sqlite(engine) for claim in claims)
    counted = REGISTRY.get_sample_value(FOLLOW_UP_FAILURES, {"transaction": "claim inputs"}) or 0.0
    assert counted - failures == (0 if is_sqlite(engine) else 1)
    streamed = {claim.work.work_id: [row.enqueue_ordinal for row in _streamed(connectors, claim)] for claim in claims}
    assert streamed == {
        admitted[0].work_id: [admitted[0].enqueue_ordinal, admitted[2].enqueue_ordinal],
        admitted[1].work_id: [admitted[1].enqueue_ordinal],
    }
    for claim in claims:
        connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    assert_invariants(engine)


def test_a_claim_that_does_not_ask_carries_no_inputs_and_runs_no_more_statements(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane="a"), delivery(lane="a")])
    with capture(engine) as captured:
        (claim,) = connectors.claim("w", pack_install_ids=[pack])
    assert captured.round_trips() == CLAIM_STATEMENTS
    assert claim.inputs is None
    assert len(_streamed(connectors, claim)) == 2
    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    assert_invariants(engine)


def _budgeted(engine: sa.Engine, clock: FakeClock) -> Connectors:
    """Pages of 4 members and 6 KiB: the inline inputs of one claim are at most that, together."""
    settings = Settings(default_page_size=4, max_payload_bytes=4 * KIB, max_page_bytes=6 * KIB)
    return Connectors(engine, settings, clock=clock)


@pytest.mark.parametrize(
    ("members", "payload_bytes"),
    [(1, 4 * KIB), (3, KIB)],  # 4 KiB each under 6 KiB; 3 members each under 4
    ids=["bytes", "members"],
)
def test_the_inline_inputs_of_one_claim_are_at_most_one_page_together(
    engine: sa.Engine, clock: FakeClock, members: int, payload_bytes: int
) -> None:
    connectors = _budgeted(engine, clock)
    pack = install_pack(engine)
    items = [delivery(lane=lane, payload=b"x" * payload_bytes) for lane in ("a", "b") for _ in range(members)]
    connectors.ingest(pack, items=items)
    claims = connectors.claim("w", pack_install_ids=[pack], max_items=2, inline_inputs=True)
    # The first claimed fits; the second would not fit beside it.
    assert [claim.inputs is not None for claim in claims] == [True, False]
    for claim in claims:
        assert [len(row.payload) for row in _streamed(connectors, claim)] == [payload_bytes] * members
        connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    assert_invariants(engine)


class _Counting:
    """A work source that counts the LoadInputs calls it passes on."""

    def __init__(self, source: Any) -> None:
        self._source = source
        self.loaded: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)

    def load_inputs(self, work_id: str, *, lease_token: str, page_size: int = 0) -> Iterator[InputPage]:
        self.loaded.append(work_id)
        pages: Iterator[InputPage] = self._source.load_inputs(work_id, lease_token=lease_token, page_size=page_size)
        return pages


def _run_mixed_batch(connectors: Connectors, source: WorkSource, pack: str) -> tuple[dict[str, list[int]], set[str]]:
    """Admit a small, a long and a heavy generation and run them in one batch.

    Returns each generation's inputs as the Flow saw them (by projection key) and the WorkIds
    of those that do not fit inline (the long and the heavy one).
    """
    small = [delivery(lane="small", payload=b"s" * KIB) for _ in range(3)]  # 3 KiB: fits
    long = [delivery(lane="long", payload=b"l") for _ in range(9)]  # 9 members: more than a page
    heavy = [delivery(lane="heavy", payload=b"h" * (4 * KIB)) for _ in range(2)]  # 8 KiB: above the budget
    results = connectors.ingest(pack, items=[*small, *long[:5], *heavy, *long[5:]])
    seen: dict[str, list[int]] = {}

    def flow(generation: Generation) -> None:
        seen[generation.work.projection_key] = [row.enqueue_ordinal for row in generation.inputs]

    worker = Worker(source, flow, worker_id="w", pack_install_ids=[pack], batch_size=3)
    assert worker.run_once()
    assert worker.stats.completed == 3 and worker.stats.failed_attempts == 0
    return seen, {str(result.work_id) for result in results[len(small) :]}


def test_generations_beyond_the_inline_budget_still_stream_every_input_in_order(
    engine: sa.Engine, clock: FakeClock
) -> None:
    connectors = _budgeted(engine, clock)
    pack = install_pack(engine)
    source = _Counting(connectors)
    seen, streamed = _run_mixed_batch(connectors, source, pack)
    lanes = _ordinals_by_lane(engine, pack)
    assert seen == lanes  # every member of every generation, in ordinal order
    assert sorted(len(ordinals) for ordinals in lanes.values()) == [2, 3, 9]
    assert sorted(source.loaded) == sorted(streamed)  # the small one came with the claim
    assert_invariants(engine)


def test_over_grpc_the_worker_skips_loadinputs_for_inline_inputs_and_an_old_server_still_works(
    engine: sa.Engine, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    connectors = _budgeted(engine, clock)
    loaded: list[str] = []
    load_inputs = connectors.load_inputs

    def counted(work_id: str, *, lease_token: str, page_size: int = 0) -> Iterator[InputPage]:
        loaded.append(work_id)
        return load_inputs(work_id, lease_token=lease_token, page_size=page_size)

    monkeypatch.setattr(connectors, "load_inputs", counted)
    server = create_server([registration(connectors)], "127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            client = ConnectorsClient(channel)
            pack = install_pack(engine)
            seen, streamed = _run_mixed_batch(connectors, client, pack)
            assert seen == _ordinals_by_lane(engine, pack)
            assert sorted(loaded) == sorted(streamed)  # the small generation's inputs came with the claim

            # A server that predates the field ignores it and answers without inputs.
            claim = connectors.complete_and_claim
            monkeypatch.setattr(connectors, "complete_and_claim", lambda *a, inline_inputs=False, **k: claim(*a, **k))
            loaded.clear()
            old = install_pack(engine)
            seen, streamed = _run_mixed_batch(connectors, client, old)
            assert seen == _ordinals_by_lane(engine, old)
            assert len(loaded) == 3 and set(loaded) > streamed  # every generation through LoadInputs
    finally:
        server.stop(0)
    assert_invariants(engine)


class _RefusingRenewals(_Counting):
    """Counts LoadInputs calls and refuses every lease renewal of one generation (a lease it lost)."""

    def __init__(self, source: Any) -> None:
        super().__init__(source)
        self.refuse: str | None = None
        self.refused = threading.Event()

    def heartbeat(self, work_id: str, *, lease_token: str, lease: dt.timedelta | None = None) -> dt.datetime:
        if work_id == self.refuse:
            self.refused.set()
            raise RuntimeError(f"lease of work {work_id} is no longer held")
        expires: dt.datetime = self._source.heartbeat(work_id, lease_token=lease_token, lease=lease)
        return expires


def test_a_generation_whose_renewal_was_refused_while_it_waited_its_turn_is_loaded_not_run_from_the_claim(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    first, second = connectors.ingest(pack, items=[delivery(lane="a"), delivery(lane="b")])
    source = _RefusingRenewals(connectors)
    ran: list[str] = []

    def flow(generation: Generation) -> None:
        list(generation.inputs)
        if not ran:  # while the first runs, the other one's renewal is refused
            source.refuse = next(str(r.work_id) for r in (first, second) if r.work_id != generation.work.work_id)
            wait_until(source.refused.is_set, "a refused renewal of the waiting generation")
        ran.append(generation.work.work_id)

    worker = Worker(source, flow, worker_id="w", pack_install_ids=[pack], lease=dt.timedelta(seconds=3), batch_size=2)
    assert worker.run_once()
    # Its inputs came with the claim, but the worker asked LoadInputs, which judges the lease
    # (held here: only the renewal was refused), and nothing else.
    assert source.loaded == [source.refuse]
    assert worker.stats.completed == 2
    assert_invariants(engine)


def test_a_member_lost_since_the_first_claim_is_never_inlined_and_loadinputs_refuses(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock
) -> None:
    pack = install_pack(engine)
    results = connectors.ingest(pack, items=[delivery(lane="a") for _ in range(3)])
    (first,) = connectors.claim("w", pack_install_ids=[pack], inline_inputs=True)
    assert first.inputs is not None and first.inputs.member_count == 3
    retried = connectors.fail(first.work.work_id, lease_token=first.lease_token, error="try again")
    assert retried.status is WorkStatus.RETRY
    with engine.begin() as connection:  # the middle member is lost between the attempts
        for table in (EventPayload, Event):
            connection.execute(
                sa.delete(table).where(
                    table.c.PackInstallId == pack, table.c.EnqueueOrdinal == results[1].enqueue_ordinal
                )
            )
    clock.advance(dt.timedelta(days=1).total_seconds())  # past the backoff
    (second,) = connectors.claim("w", pack_install_ids=[pack], inline_inputs=True)
    assert second.inputs is None  # two members where admission and the first claim counted three
    with pytest.raises(MembershipMissing, match="holds 2 inputs but admission recorded 3"):
        _streamed(connectors, second)
    lost = (pack, results[1].receipt_key)
    first_ordinal, last_ordinal = results[0].enqueue_ordinal, results[2].enqueue_ordinal
    assert sorted(check_invariants(engine)) == [
        f"D: receipt {lost} is confirmed but has no Event (an acknowledged input was lost)",
        f"P: {first.work.work_id} [{first_ordinal},{last_ordinal}] has 2 members but admission recorded 3",
    ]
