"""Recovery that recovers, on every backend: a replay hands its Flow the failed inputs again, once (decision 173).

A Flow fails every input of some lanes; the Flow is fixed and the dead letters are replayed in
bulk. The SDK's worker hands each replay generation the replayed generation's members again
(transitively through a replay of a replay), then its own; the SDK's ledger applies each input
once. The read model is checked against an oracle computed here from the Event table by SQL,
never by the code under test.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import grpc
import pytest
import sqlalchemy as sa

from nexuscrm_connectors.errors import NotAReplay, ReplayRefused, WorkPruned
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.operating.dead_letters import NothingMatches, Verdict, filter_of
from nexuscrm_connectors.operating.order_policy import Policy
from nexuscrm_connectors.servicer import registration
from nexuscrm_runtime.server import create_server
from nexuscrm_schema.tables import Event, WorkItem
from nexuscrm_sdk import AppliedInputs, ConnectorsClient, Generation, PermanentFailure, RetryLater, Worker
from tests.connectors.replays import race_bulk_replays, replays_per_work
from tests.support.checksums import database_digest
from tests.support.factories import FakeClock, delivery, install_pack
from tests.support.invariants import assert_invariants
from tests.support.waiting import wait_until
from workqueue import WorkStatus, decode_projection_key
from workqueue.errors import InvalidArgument

pytestmark = pytest.mark.database

LANES = ("a", "b", "c", "d")
BROKEN = {"b", "d"}  # the lanes whose every input the bad Flow release fails


class LedgerFlow:
    """A Flow that folds each lane's payloads in the order applied, through the SDK's ledger.

    ``broken``: lanes whose generations fail (the bad release), ``permanent``: raising
    ``PermanentFailure`` instead of a retryable error. The read model ``Folded`` keeps one
    row per applied input with its position in its lane, so the applied order is checkable.
    """

    def __init__(self, engine: sa.Engine, *, broken: set[str], permanent: bool = False) -> None:
        self.engine = engine
        self.broken = set(broken)
        self.permanent = permanent
        metadata = sa.MetaData()
        self.ledger = AppliedInputs("ReplayTestApplied", metadata)
        self.folded = sa.Table(
            "ReplayTestFolded",
            metadata,
            sa.Column("Lane", sa.String(64), primary_key=True),
            sa.Column("Position", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("EnqueueOrdinal", sa.BigInteger, nullable=False),
            sa.Column("Payload", sa.LargeBinary, nullable=False),
            mysql_engine="InnoDB",
        )
        metadata.create_all(engine)
        self.replayed_seen: list[tuple[str, int]] = []  # (replayed WorkId, ordinal) as handed to the Flow

    def __call__(self, generation: Generation) -> None:
        inputs = list(generation.inputs)
        self.replayed_seen += [(row.replayed_work_id, row.enqueue_ordinal) for row in inputs if row.replayed_work_id]
        lane = generation.identity.source_lane
        if lane in self.broken:
            message = f"bad release cannot fold lane {lane}"
            raise PermanentFailure(message) if self.permanent else RuntimeError(message)

        def write(connection: sa.Connection, fresh: list) -> None:  # type: ignore[type-arg]
            position = connection.execute(
                sa.select(sa.func.count()).select_from(self.folded).where(self.folded.c.Lane == lane)
            ).scalar_one()
            rows = [row for row in fresh if not row.is_replay]  # a replay Event only names what it replays
            for offset, row in enumerate(rows):
                connection.execute(
                    sa.insert(self.folded).values(
                        Lane=lane, Position=position + offset, EnqueueOrdinal=row.enqueue_ordinal, Payload=row.payload
                    )
                )

        self.ledger.apply(self.engine, generation.work, inputs, write)

    def applied_order(self) -> dict[str, list[int]]:
        """Each lane's applied ordinals, in the order the Flow applied them."""
        with self.engine.connect() as connection:
            rows = connection.execute(
                sa.select(self.folded.c.Lane, self.folded.c.EnqueueOrdinal).order_by(
                    self.folded.c.Lane, self.folded.c.Position
                )
            )
            order: dict[str, list[int]] = {}
            for lane, ordinal in rows:
                order.setdefault(lane, []).append(ordinal)
        return order


def admitted_inputs(engine: sa.Engine, pack: str) -> dict[str, list[int]]:
    """The oracle: each lane's fresh (non-replay) Event ordinals, read from the Event table."""
    with engine.connect() as connection:
        rows = connection.execute(
            sa.select(Event.c.ProjectionKey, Event.c.EnqueueOrdinal)
            .where(Event.c.PackInstallId == pack, Event.c.IsReplay == sa.false())
            .order_by(Event.c.EnqueueOrdinal)
        )
        lanes: dict[str, list[int]] = {}
        for key, ordinal in rows:
            lanes.setdefault(decode_projection_key(key).source_lane, []).append(ordinal)
    return lanes


def drain(connectors: Connectors, flow: Callable[[Generation], None], pack: str) -> Worker:
    """Run a worker over ``pack`` until no claim returns work."""
    worker = Worker(connectors, flow, worker_id="recovery", pack_install_ids=[pack], batch_size=4)
    while worker.run_once():
        pass
    return worker


def ingest_rounds(connectors: Connectors, pack: str, rounds: int, flow: LedgerFlow) -> None:
    """``rounds`` batches of one input per lane, each followed by a worker pass (several generations per lane)."""
    for _ in range(rounds):
        connectors.ingest(pack, items=[delivery(lane=lane) for lane in LANES])
        drain(connectors, flow, pack)


def statuses(engine: sa.Engine, pack: str) -> dict[str, int]:
    with engine.connect() as connection:
        rows = connection.execute(
            sa.select(WorkItem.c.Status, sa.func.count())
            .where(WorkItem.c.PackInstallId == pack)
            .group_by(WorkItem.c.Status)
        )
        return {str(status): int(count) for status, count in rows}


def test_a_fixed_flow_replayed_in_bulk_applies_every_failed_input_once(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock
) -> None:
    pack = install_pack(engine)
    flow = LedgerFlow(engine, broken=BROKEN)
    ingest_rounds(connectors, pack, 3, flow)
    ingest_rounds(connectors, pack, 1, flow)  # retries run out meanwhile: every broken generation fails for good
    while statuses(engine, pack).get(WorkStatus.RETRY, 0):
        clock.advance(3600)  # past every backoff
        drain(connectors, flow, pack)
    dead = connectors.list_dead_letters(pack, filter_of(pack)).dead_letters
    assert {decode_projection_key(w.projection_key).source_lane for w in dead} == BROKEN
    applied = flow.applied_order()
    assert set(applied) == set(LANES) - BROKEN  # the broken lanes applied nothing

    flow.broken.clear()  # the fixed release
    done = connectors.replay_dead_letters(pack, filter_of(pack), dry_run=False)
    assert sorted(a.work_id for a in done.answers if a.verdict is Verdict.REPLAYED) == sorted(w.work_id for w in dead)
    drain(connectors, flow, pack)

    expected = admitted_inputs(engine, pack)
    assert sorted(ordinal for lane in LANES for ordinal in flow.applied_order()[lane]) == sorted(
        ordinal for lane in LANES for ordinal in expected[lane]
    )  # every input applied exactly once (Folded's key and the ledger's keep duplicates out)
    for lane in set(LANES) - BROKEN:
        assert flow.applied_order()[lane] == expected[lane]  # never failed: in ordinal order
    replayed = {work.work_id for work in dead}
    assert {work_id for work_id, _ in flow.replayed_seen} == replayed  # marked with the generation replayed
    with engine.connect() as connection:
        ledger = flow.ledger.applied(connection, pack)
    assert ledger >= {o for lane in LANES for o in expected[lane]}
    assert connectors.list_dead_letters(pack, filter_of(pack)).dead_letters == ()
    coverage = connectors.get_coverage(pack, filter_of(pack))
    assert [(i.route.source_lane, i.tiled) for i in coverage.identities] == [(lane, True) for lane in LANES]
    assert_invariants(engine)


def test_under_block_a_bulk_replay_runs_each_head_first_and_every_lane_applies_in_ordinal_order(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock
) -> None:
    pack = install_pack(engine)
    connectors.set_order_policy(pack, Policy.BLOCK, set_by="ops@acme", reason="ledger order matters")
    flow = LedgerFlow(engine, broken=BROKEN)
    ingest_rounds(connectors, pack, 3, flow)
    while statuses(engine, pack).get(WorkStatus.RETRY, 0):
        clock.advance(3600)  # past every backoff
        drain(connectors, flow, pack)
    ingest_rounds(connectors, pack, 2, flow)  # held behind each broken lane's dead letter
    dead = connectors.list_dead_letters(pack, filter_of(pack)).dead_letters
    assert sorted(decode_projection_key(w.projection_key).source_lane for w in dead) == sorted(BROKEN)  # the heads

    flow.broken.clear()  # the fixed release
    done = connectors.replay_dead_letters(pack, filter_of(pack), dry_run=False)
    assert {a.verdict for a in done.answers} == {Verdict.REPLAYED}
    connectors.ingest(pack, items=[delivery(lane=lane) for lane in LANES])  # fresh inputs queue behind the held
    assert_invariants(engine)
    drain(connectors, flow, pack)

    assert flow.applied_order() == admitted_inputs(engine, pack)  # every lane: each input once, in ordinal order
    assert connectors.list_dead_letters(pack, filter_of(pack)).dead_letters == ()
    coverage = connectors.get_coverage(pack, filter_of(pack))
    assert [(i.route.source_lane, i.tiled) for i in coverage.identities] == [(lane, True) for lane in LANES]
    assert_invariants(engine)


def test_a_replay_of_a_replay_hands_over_both_generations_in_ordinal_order(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane="a"), delivery(lane="a")])
    (first,) = connectors.claim("w", pack_install_ids=[pack])
    connectors.fail(first.work.work_id, lease_token=first.lease_token, error="boom", retryable=False)
    again = connectors.replay(first.work.work_id)
    connectors.ingest(pack, items=[delivery(lane="a")])  # absorbed by the unclaimed replay
    (second,) = connectors.claim("w", pack_install_ids=[pack])
    assert second.work.work_id == again.work.work_id
    connectors.fail(second.work.work_id, lease_token=second.lease_token, error="boom again", retryable=False)
    third = connectors.replay(second.work.work_id)
    (claim,) = connectors.claim("w", pack_install_ids=[pack])
    pages = list(connectors.load_replayed_inputs(claim.work.work_id, lease_token=claim.lease_token, page_size=1))
    handed = [(row.replayed_work_id, row.enqueue_ordinal, row.is_replay) for page in pages for row in page.inputs]
    assert handed == [
        (first.work.work_id, 1, False),
        (first.work.work_id, 2, False),
        (second.work.work_id, 3, True),  # the first replay's Event, then what it absorbed
        (second.work.work_id, 4, False),
    ]
    assert [page.last for page in pages] == [False, False, False, True]
    assert {page.member_count for page in pages} == {4}
    own = [
        row.enqueue_ordinal
        for page in connectors.load_inputs(claim.work.work_id, lease_token=claim.lease_token)
        for row in page.inputs
    ]
    assert own == [third.replay_event_ordinal]
    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    assert_invariants(engine)


def test_replayed_inputs_are_refused_for_work_that_replays_nothing(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery()])
    (claim,) = connectors.claim("w", pack_install_ids=[pack])
    with pytest.raises(NotAReplay, match="is not a replay"):
        list(connectors.load_replayed_inputs(claim.work.work_id, lease_token=claim.lease_token))
    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    assert_invariants(engine)


def test_a_dead_letter_is_replayed_once_even_after_its_replay_finished(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery()])
    (claim,) = connectors.claim("w", pack_install_ids=[pack])
    connectors.fail(claim.work.work_id, lease_token=claim.lease_token, error="boom", retryable=False)
    replayed = connectors.replay(claim.work.work_id)
    (rerun,) = connectors.claim("w", pack_install_ids=[pack])
    connectors.complete(rerun.work.work_id, lease_token=rerun.lease_token)
    with pytest.raises(ReplayRefused, match=f"replayed already by {replayed.work.work_id}"):
        connectors.replay(claim.work.work_id)
    with pytest.raises(NothingMatches, match="no dead letter of pack"):  # no longer a dead letter
        connectors.replay_dead_letters(pack, filter_of(pack), dry_run=False)
    with engine.connect() as connection:
        replays = connection.execute(
            sa.select(sa.func.count()).select_from(WorkItem).where(WorkItem.c.ReplayOfWorkId == claim.work.work_id)
        ).scalar_one()
    assert replays == 1
    assert_invariants(engine)


def test_two_bulk_replays_at_once_replay_each_dead_letter_once(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    lanes = [f"lane-{n}" for n in range(12)]
    connectors.ingest(pack, items=[delivery(lane=lane) for lane in lanes])
    while claims := connectors.claim("w", pack_install_ids=[pack], max_items=20):
        for claim in claims:
            connectors.fail(claim.work.work_id, lease_token=claim.lease_token, error="boom", retryable=False)
    dead = {w.work_id for w in connectors.list_dead_letters(pack, filter_of(pack)).dead_letters}
    assert len(dead) == len(lanes)
    replayed = race_bulk_replays([connectors, connectors], pack, (5, 7))
    assert replayed == sorted(dead)  # each by exactly one of the two
    with engine.connect() as connection:
        per_dead_letter = replays_per_work(connection, pack)
    assert per_dead_letter == dict.fromkeys(dead, 1)
    assert_invariants(engine)


def test_a_permanent_failure_is_a_dead_letter_after_one_attempt(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    flow = LedgerFlow(engine, broken={"poison"}, permanent=True)
    connectors.ingest(pack, items=[delivery(lane="poison"), delivery(lane="fine")])
    worker = drain(connectors, flow, pack)
    (dead,) = connectors.list_dead_letters(pack, filter_of(pack)).dead_letters
    assert (dead.status, dead.attempt, dead.max_attempts > 1) == (WorkStatus.FAILED, 1, True)
    assert dead.last_error == "PermanentFailure: bad release cannot fold lane poison"
    assert (worker.stats.executions, worker.stats.failed_attempts) == (2, 1)
    assert statuses(engine, pack) == {WorkStatus.FAILED: 1, WorkStatus.COMPLETED: 1}
    assert_invariants(engine)


def test_a_replay_of_work_whose_replayed_generation_was_pruned_says_so(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane="a")])
    (claim,) = connectors.claim("w", pack_install_ids=[pack])
    connectors.fail(claim.work.work_id, lease_token=claim.lease_token, error="boom", retryable=False)
    replay = connectors.replay(claim.work.work_id)
    (rerun,) = connectors.claim("w", pack_install_ids=[pack])
    connectors.fail(rerun.work.work_id, lease_token=rerun.lease_token, error="boom again", retryable=False)
    # The failed replay is the identity's newest generation: kept; what it replays is not.
    connectors.set_retention_policy(pack, keep_generations=1, keep_seconds=None)
    while connectors.prune(pack).generations:
        pass
    assert connectors.get_work(replay.work.work_id).work.status is WorkStatus.FAILED  # the dead letter is kept
    with engine.connect() as connection:
        pruned = connection.execute(
            sa.select(sa.func.count()).select_from(WorkItem).where(WorkItem.c.WorkId == claim.work.work_id)
        ).scalar_one()
    assert pruned == 0
    with pytest.raises(WorkPruned, match=f"work {claim.work.work_id} was pruned"):
        connectors.replay(replay.work.work_id)
    assert_invariants(engine)


def test_retention_keeps_the_generation_a_live_replay_runs_again(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane="a")])
    (claim,) = connectors.claim("w", pack_install_ids=[pack])
    connectors.fail(claim.work.work_id, lease_token=claim.lease_token, error="boom", retryable=False)
    replay = connectors.replay(claim.work.work_id)
    connectors.set_retention_policy(pack, keep_generations=1, keep_seconds=None)
    report = connectors.prune(pack)
    assert report.generations == 0  # the replay is newer, but it hands its Flow this generation's inputs
    (rerun,) = connectors.claim("w", pack_install_ids=[pack])
    assert rerun.work.work_id == replay.work.work_id
    handed = [
        row.enqueue_ordinal
        for page in connectors.load_replayed_inputs(rerun.work.work_id, lease_token=rerun.lease_token)
        for row in page.inputs
    ]
    assert handed == [claim.work.lane_ordinal]
    connectors.complete(rerun.work.work_id, lease_token=rerun.lease_token)
    assert connectors.prune(pack).generations == 1  # its replay finished: the policy lets it go
    assert_invariants(engine)


def test_retry_later_waits_its_delay_without_counting_an_attempt(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane="a")])
    calls: list[int] = []

    def waits_for_its_dependency(generation: Generation) -> None:
        list(generation.inputs)
        calls.append(generation.work.attempt)
        if len(calls) < 3:
            raise RetryLater("the CRM is in maintenance", delay=dt.timedelta(minutes=10))

    worker = drain(connectors, waits_for_its_dependency, pack)
    (waiting,) = connectors.list_generations(pack, route=None).generations
    assert (waiting.status, waiting.attempt, waiting.last_error) == (
        WorkStatus.RETRY,
        0,
        "RetryLater: the CRM is in maintenance",
    )
    assert waiting.claimable_at is not None and waiting.lease_expires_at is None
    clock.advance(9 * 60)
    assert connectors.claim("w", pack_install_ids=[pack]) == []  # not before its delay
    for _ in range(2):
        clock.advance(60 + 10 * 60)
        while worker.run_once():
            pass
    assert calls == [0, 0, 0]  # three runs, none counted against MaxAttempts
    assert connectors.get_work(waiting.work_id).work.status is WorkStatus.COMPLETED
    assert_invariants(engine)


@pytest.mark.parametrize(
    ("retry_after", "retryable"),
    [(dt.timedelta(0), True), (dt.timedelta(days=1, seconds=1), True), (dt.timedelta(minutes=1), False)],
    ids=["zero", "over-a-day", "not-retryable"],
)
def test_a_retry_after_out_of_range_is_refused_and_changes_nothing(
    engine: sa.Engine, connectors: Connectors, retry_after: dt.timedelta, retryable: bool
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane="a")])
    (claim,) = connectors.claim("w", pack_install_ids=[pack])
    before = database_digest(engine)
    with pytest.raises(InvalidArgument, match="retry_after must be more than 0 and at most 1 day") as refused:
        connectors.fail(
            claim.work.work_id, lease_token=claim.lease_token, error="x", retryable=retryable, retry_after=retry_after
        )
    assert refused.value.field == "retry_after"
    assert database_digest(engine) == before
    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    assert_invariants(engine)


def test_over_grpc_a_replay_hands_over_the_replayed_inputs_and_retry_later_its_delay(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    server = create_server([registration(connectors)], "127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            client = ConnectorsClient(channel)
            client.ingest(pack, items=[delivery(lane="a"), delivery(lane="a")])
            (claim,) = client.claim("w", pack_install_ids=[pack])
            client.fail(claim.work.work_id, lease_token=claim.lease_token, error="bad release", retryable=False)
            client.replay(claim.work.work_id)
            handed: list[tuple[str | None, int]] = []
            runs: list[int] = []

            def flow(generation: Generation) -> None:
                handed.extend((row.replayed_work_id, row.enqueue_ordinal) for row in generation.inputs)
                runs.append(generation.work.attempt)
                if len(runs) == 1:
                    raise RetryLater("later", delay=dt.timedelta(milliseconds=1500))

            worker = Worker(client, flow, worker_id="grpc", pack_install_ids=[pack])
            assert worker.run_once()
            (waiting,) = [w for w in connectors.list_generations(pack, route=None).generations if w.replay_of_work_id]
            assert (waiting.status, waiting.attempt) == (WorkStatus.RETRY, 0)
            wait_until(lambda: worker.run_once() or bool(runs[1:]), "the retry after its delay")
    finally:
        server.stop(0)
    first = claim.work.work_id
    assert runs == [0, 0]
    assert handed == [(first, 1), (first, 2), (None, 3)] * 2  # replayed inputs first, then the replay's own
    assert_invariants(engine)
