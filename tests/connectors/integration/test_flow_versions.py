"""Flow versions built from history beside the live one, switched, rolled back and retired (decision 185).

Each scenario runs every generation it claims over the members LoadInputs streams, and checks
which inputs each version ran, live or in a build, against what was admitted, then the
invariants (M per track) on the final database.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
import threading
from collections import Counter
from collections.abc import Sequence

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.operating import flow_versions, retention
from nexuscrm_connectors.queries.dead_letters import Filter
from nexuscrm_schema.tables import Event, WorkItem
from tests.support.checksums import database_digest
from tests.support.factories import FakeClock, install_pack, route
from tests.support.invariants import assert_invariants
from workqueue.errors import DomainError, ErrorKind
from workqueue.values import IngestItem, Outcome

pytestmark = pytest.mark.database

V1, V2 = "crm-1.0", "crm-2.0"  # the companion version deliveries carry (tests.support.factories.route), and the new


def _items(start: int, count: int, lanes: int = 3) -> list[IngestItem]:
    return [
        IngestItem(receipt_key=f"r-{n}", route=route(f"lane-{n % lanes}"), payload=f"input {n}".encode())
        for n in range(start, start + count)
    ]


@dataclasses.dataclass
class Runs:
    """The ordinals each (version, build) ran, as many times as run."""

    ran: Counter[tuple[str, bool, int]] = dataclasses.field(default_factory=Counter)

    def of(self, version: str, *, build: bool) -> list[int]:
        return sorted(o for (v, b, o), n in self.ran.items() for _ in range(n) if v == version and b == build)


def _drain(connectors: Connectors, pack: str, runs: Runs, versions: Sequence[str] = (), limit: int = 1000) -> int:
    """Claim (as a pool of ``versions``), load and complete until nothing is claimable; generations run."""
    done = 0
    while done < limit:
        claims = connectors.claim("w", pack_install_ids=[pack], flow_versions=versions, max_items=10)
        if not claims:
            return done
        for claim in claims:
            version = claim.work.flow_version or V1
            pages = list(connectors.load_inputs(claim.work.work_id, lease_token=claim.lease_token))
            if claim.work.replay_of_work_id:  # a replay runs what it replays first
                pages[:0] = connectors.load_replayed_inputs(claim.work.work_id, lease_token=claim.lease_token)
            for page in pages:
                for member in page.inputs:
                    runs.ran[(version, claim.work.build_run, member.enqueue_ordinal)] += 1
            connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
            done += 1
    raise AssertionError("the queue did not drain")


def _three_generations(connectors: Connectors, pack: str, *, size: int, lanes: int) -> Runs:
    """Admit ``size`` inputs three times, each batch run live before the next: three generations per lane."""
    runs = Runs()
    for start in (1, size + 1, 2 * size + 1):
        connectors.ingest(pack, items=_items(start, size, lanes=lanes))
        _drain(connectors, pack, runs)
    return runs


def _build(
    connectors: Connectors, pack: str, **options: object
) -> tuple[flow_versions.VersionView, flow_versions.CatchUp]:
    arguments: dict[str, object] = {
        "from_retained": False,
        "max_inputs_per_second": 0,
        "started_by": "ops",
        "reason": "v2",
    }
    return flow_versions.build(connectors.context, pack, "project", V2, **(arguments | options))  # type: ignore[arg-type]


def _states(connectors: Connectors, pack: str) -> dict[str, str]:
    return {view.track.version: view.state for view in flow_versions.list_versions(connectors.context, pack, "project")}


def test_a_version_is_built_from_history_switched_rolled_back_switched_again_and_the_old_one_retired(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    runs = Runs()
    for start in range(1, 1201, 400):
        connectors.ingest(pack, items=_items(start, 400))
    assert _drain(connectors, pack, runs) > 0
    view, made = _build(connectors, pack)
    # 1200 inputs on three lanes: 400 each, one catch-up generation per lane (500 members at most).
    assert (made.generations, made.inputs, view.state, view.track.catch_up_through_ordinal) == (
        3,
        1200,
        "building",
        1200,
    )
    assert _states(connectors, pack) == {V1: "live", V2: "building"}

    # While the build catches up, new inputs (and a duplicate) go to both versions; the answer names V1's.
    results = connectors.ingest(pack, items=[*_items(1201, 30), _items(5, 1)[0]])
    assert [r.outcome for r in results].count(Outcome.ADMITTED) == 30
    assert results[-1].outcome is Outcome.DUPLICATE_COVERED
    with engine.connect() as connection:
        answered = {r.work_id for r in results[:30]}
        versions = set(
            connection.execute(sa.select(WorkItem.c.FlowVersion).where(WorkItem.c.WorkId.in_(answered))).scalars()
        )
    assert versions == {None}

    with pytest.raises(DomainError) as behind:
        flow_versions.switch(connectors.context, pack, "project", V2, switched_by="ops", reason="too early")
    assert behind.value.kind is ErrorKind.FAILED_PRECONDITION and "is behind" in str(behind.value)

    _drain(connectors, pack, runs)  # V1's new inputs, live
    _drain(connectors, pack, runs, [V2])  # V2's catch-up and new inputs, as builds
    assert runs.of(V2, build=True) == list(range(1, 1231))
    assert runs.of(V1, build=False) == list(range(1, 1231))
    assert _states(connectors, pack) == {V1: "live", V2: "standby"}
    assert_invariants(engine)

    live, previous = flow_versions.switch(connectors.context, pack, "project", V2, switched_by="ops", reason="ship")
    assert (live.state, previous.state, previous.track.cover_through_ordinal) == ("live", "stopped", 1230)
    connectors.ingest(pack, items=_items(1231, 9, lanes=4))  # lane-3 is new: only V2 has generations of it
    # A redelivery of an input only V2 received is covered by V2's generation.
    (again,) = connectors.ingest(pack, items=_items(1231, 1, lanes=4))
    assert again.outcome is Outcome.DUPLICATE_COVERED and again.work_id in again.message
    assert _drain(connectors, pack, runs) == 0  # V1 receives nothing any more
    _drain(connectors, pack, runs, [V2])
    assert runs.of(V2, build=False) == list(range(1231, 1240))  # after the switch, V2 runs live
    assert_invariants(engine)

    back, was_live, missed = flow_versions.rollback(
        connectors.context, pack, "project", rolled_back_by="ops", reason="v2 writes wrong totals"
    )
    assert (back.track.version, back.state, was_live.track.version, missed.inputs) == (V1, "live", V2, 9)
    connectors.ingest(pack, items=_items(1240, 3))
    _drain(connectors, pack, runs)
    _drain(connectors, pack, runs, [V2])
    assert runs.of(V1, build=True) == list(range(1231, 1240))  # what it missed, caught up as a build
    assert runs.of(V1, build=False) == [*range(1, 1231), *range(1240, 1243)]
    assert runs.of(V2, build=True) == [*range(1, 1231), *range(1240, 1243)]
    assert_invariants(engine)

    flow_versions.switch(connectors.context, pack, "project", V2, switched_by="ops", reason="fixed")
    retired = flow_versions.retire(connectors.context, pack, "project", V1, retired_by="ops", reason="done")
    assert (retired.state, [c.action for c in retired.changes]) == ("retired", ["rollback", "retire"])
    connectors.ingest(pack, items=_items(1243, 2))
    _drain(connectors, pack, runs, [V2])
    # Every input ran live exactly once, in the version live when it was admitted.
    live_runs = Counter(runs.of(V1, build=False) + runs.of(V2, build=False))
    assert live_runs == Counter(range(1, 1245))
    assert _states(connectors, pack) == {V1: "retired", V2: "live"}
    assert [c.action for c in flow_versions.list_versions(connectors.context, pack, "project")[1].changes] == [
        "build",
        "switch",
        "switch",
    ]
    # A third version builds over every identity's inputs, lane-3's included, though V1, whose
    # generations name the inputs' keys, never had one of lane-3.
    flow_versions.build(
        connectors.context,
        pack,
        "project",
        "crm-3.0",
        from_retained=False,
        max_inputs_per_second=0,
        started_by="ops",
        reason="v3",
    )
    _drain(connectors, pack, runs, ["crm-3.0"])
    assert runs.of("crm-3.0", build=True) == list(range(1, 1245))
    assert_invariants(engine)


def test_a_build_yields_to_live_work_waiting_over_a_second_and_to_its_rate_bound(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=_items(1, 40, lanes=4))
    _build(connectors, pack, max_inputs_per_second=10)
    # Live work just admitted does not hold the build back: a pack ingesting steadily would starve it.
    (first,) = connectors.claim("b", pack_install_ids=[pack], flow_versions=[V2])
    assert first.work.build_run and first.work.flow_version == V2
    # One claimed generation holds 10 inputs: the bound of 10 per second is reached for this second.
    assert connectors.claim("b", pack_install_ids=[pack], flow_versions=[V2]) == []
    connectors.complete(first.work.work_id, lease_token=first.lease_token)
    clock.advance(2)  # the live generations have now waited two seconds: the live pool is behind
    assert connectors.claim("b", pack_install_ids=[pack], flow_versions=[V2]) == []
    runs = Runs()
    _drain(connectors, pack, runs)
    (second,) = connectors.claim("b", pack_install_ids=[pack], flow_versions=[V2])
    assert second.work.build_run and second.work.work_id != first.work.work_id
    connectors.complete(second.work.work_id, lease_token=second.lease_token)
    assert_invariants(engine)


def test_the_rate_bound_counts_the_inputs_its_version_claimed_in_the_last_second(
    engine: sa.Engine, connectors: Connectors
) -> None:
    """The bound sums the version's recently claimed inputs, not those times its generations (a missed correlation)."""
    pack = install_pack(engine)
    connectors.ingest(pack, items=_items(1, 150, lanes=30))  # 5 inputs a lane: 30 catch-up generations
    _drain(connectors, pack, Runs())
    _build(connectors, pack, max_inputs_per_second=50)
    first, second = (connectors.claim("b", pack_install_ids=[pack], flow_versions=[V2]) for _ in range(2))
    assert (len(first), len(second)) == (1, 1)  # 5 of the 50 inputs: the first claim holds nothing back
    assert len(connectors.claim("b", pack_install_ids=[pack], flow_versions=[V2], max_items=10)) == 10
    # 60 inputs claimed in the last second: the bound of 50 is reached while 18 generations wait.
    assert connectors.claim("b", pack_install_ids=[pack], flow_versions=[V2]) == []
    assert_invariants(engine)


def test_refused_builds_and_steps_change_nothing(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    other = IngestItem(receipt_key="other", route=route("lane-0", work_type="other"), payload=b"o")
    connectors.ingest(pack, items=[*_items(1, 6), other])
    _build(connectors, pack)
    cases: list[tuple[ErrorKind, str, dict[str, object]]] = [
        (ErrorKind.ALREADY_EXISTS, "already has Flow version", {}),
        (ErrorKind.INVALID_ARGUMENT, "version", {"version": "v" * 65}),
        (ErrorKind.FAILED_PRECONDITION, "already building", {"version": "crm-3.0"}),
        (ErrorKind.ALREADY_EXISTS, "is the version", {"version": V1, "work_type": "other"}),
    ]
    without_protocol = install_pack(engine, legacy_max_ordinal=None)
    before = database_digest(engine)
    for kind, words, options in cases:
        arguments: dict[str, object] = {
            "from_retained": False,
            "max_inputs_per_second": 0,
            "started_by": "ops",
            "reason": "r",
        }
        version = str(options.pop("version", V2))
        work_type = str(options.pop("work_type", "project"))
        with pytest.raises(DomainError) as refused:
            flow_versions.build(connectors.context, pack, work_type, version, **arguments)  # type: ignore[arg-type]
        assert refused.value.kind is kind and words in str(refused.value), (words, str(refused.value))
    with pytest.raises(DomainError) as unknown_work_type:
        flow_versions.build(
            connectors.context,
            pack,
            "nothing",
            V2,
            from_retained=False,
            max_inputs_per_second=0,
            started_by="o",
            reason="r",
        )
    assert unknown_work_type.value.kind is ErrorKind.NOT_FOUND
    with pytest.raises(DomainError) as no_protocol:
        flow_versions.build(
            connectors.context,
            without_protocol,
            "project",
            V2,
            from_retained=False,
            max_inputs_per_second=0,
            started_by="o",
            reason="r",
        )
    assert no_protocol.value.kind is ErrorKind.FAILED_PRECONDITION
    for step in (
        lambda: flow_versions.switch(connectors.context, pack, "project", "crm-9", switched_by="o", reason="r"),
        lambda: flow_versions.retire(connectors.context, pack, "project", V1, retired_by="o", reason="r"),
        lambda: flow_versions.rollback(connectors.context, pack, "project", rolled_back_by="o", reason="r"),
    ):
        with pytest.raises(DomainError):
            step()
    # A delivery that names the version as its companion version is refused: its key is V2's track's.
    (refused_item,) = connectors.ingest(
        pack,
        items=[
            IngestItem(
                receipt_key="v2-direct", route=dataclasses.replace(route("lane-0"), companion_version=V2), payload=b"x"
            )
        ],
    )
    assert refused_item.outcome is Outcome.REJECTED and "is a Flow version" in refused_item.message
    assert database_digest(engine) == before
    assert_invariants(engine)


def test_pruned_history_refuses_a_build_unless_it_starts_from_the_retained_boundary(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    runs = _three_generations(connectors, pack, size=10, lanes=2)  # per lane
    connectors.set_retention_policy(pack, keep_generations=1, keep_seconds=0)
    pruned = connectors.prune(pack)
    assert pruned.generations == 4  # two of each lane's three
    before = database_digest(engine)
    with pytest.raises(DomainError) as refused:
        _build(connectors, pack)
    assert refused.value.kind is ErrorKind.FAILED_PRECONDITION
    assert "through ordinal 20" in str(refused.value) and "start from ordinal 21" in str(refused.value)
    assert database_digest(engine) == before

    view, made = _build(connectors, pack, from_retained=True)
    assert (view.track.cover_from_ordinal, made.inputs) == (21, 10)
    _drain(connectors, pack, runs, [V2])
    assert runs.of(V2, build=True) == list(range(21, 31))
    proof = connectors.get_coverage(pack, Filter(work_type="project"))
    by_version: dict[str, list[str]] = {}
    for identity in proof.identities:
        assert identity.tiled, identity
        by_version.setdefault(identity.route.companion_version, []).extend(r.state.value for r in identity.ranges)
    assert "pruned" in by_version[V1] and "pruned" not in by_version[V2]
    assert_invariants(engine)


def test_a_replay_is_refused_while_another_version_receives_the_inputs(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=_items(1, 4, lanes=1))
    (claim,) = connectors.claim("w", pack_install_ids=[pack])
    connectors.fail(claim.work.work_id, lease_token=claim.lease_token, error="poison", retryable=False)
    _build(connectors, pack)
    before = database_digest(engine)
    with pytest.raises(DomainError) as refused:
        connectors.replay(claim.work.work_id)
    assert refused.value.kind is ErrorKind.FAILED_PRECONDITION
    assert f"Flow version {V2!r} of work type 'project' receives its inputs" in str(refused.value)
    assert database_digest(engine) == before
    assert_invariants(engine)


def _fail_next(connectors: Connectors, pack: str, versions: Sequence[str] = ()) -> str:
    (claim,) = connectors.claim("w", pack_install_ids=[pack], flow_versions=versions, max_items=1)
    connectors.fail(claim.work.work_id, lease_token=claim.lease_token, error="poison", retryable=False)
    return claim.work.work_id


def test_a_replay_runs_in_its_version_live_or_as_a_build_once_no_other_version_receives(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    runs = Runs()
    connectors.ingest(pack, items=_items(1, 4, lanes=1))
    v1_dead = _fail_next(connectors, pack)  # V1's live generation of ordinals 1-4
    _build(connectors, pack)
    catch_up_dead = _fail_next(connectors, pack, [V2])  # V2's catch-up of the same inputs
    before = database_digest(engine)
    with pytest.raises(DomainError) as beside:
        connectors.replay(catch_up_dead)
    assert beside.value.kind is ErrorKind.FAILED_PRECONDITION
    assert f"Flow version {V1!r} of work type 'project' receives its inputs" in str(beside.value)
    assert database_digest(engine) == before

    flow_versions.switch(connectors.context, pack, "project", V2, switched_by="ops", reason="ship", force=True)
    # V1 stopped receiving: V2's catch-up is replayed in V2, as a build, as it ran.
    build_replay = connectors.replay(catch_up_dead)
    assert (build_replay.work.flow_version, build_replay.work.build_run) == (V2, True)
    assert build_replay.replay_event_ordinal == 5
    connectors.ingest(pack, items=_items(5, 2, lanes=1))  # ordinals 6-7: live, never joined to the build replay
    _drain(connectors, pack, runs, [V2])
    assert runs.of(V2, build=True) == [1, 2, 3, 4, 5]  # the failed catch-up's inputs, then the replay's Event
    assert runs.of(V2, build=False) == [6, 7]
    assert_invariants(engine)

    connectors.ingest(pack, items=_items(7, 2, lanes=1))  # ordinals 8-9
    live_dead = _fail_next(connectors, pack, [V2])
    live_replay = connectors.replay(live_dead)
    assert (live_replay.work.flow_version, live_replay.work.build_run) == (V2, False)
    _drain(connectors, pack, runs, [V2])
    assert runs.of(V2, build=False) == [6, 7, 8, 9, 10]  # the failed live inputs once, in order, then its Event
    assert_invariants(engine)

    before = database_digest(engine)
    with pytest.raises(DomainError) as stopped:  # V1's dead letter: V2 receives its inputs now
        connectors.replay(v1_dead)
    assert f"Flow version {V2!r} of work type 'project' receives its inputs" in str(stopped.value)
    flow_versions.retire(connectors.context, pack, "project", V1, retired_by="ops", reason="done")
    before = database_digest(engine)
    with pytest.raises(DomainError) as retired:
        connectors.replay(v1_dead)
    assert retired.value.kind is ErrorKind.FAILED_PRECONDITION
    assert f"Flow version {V1!r}, which is retired" in str(retired.value)
    assert database_digest(engine) == before
    assert_invariants(engine)


def test_the_replay_of_a_rollback_catch_up_runs_as_a_build(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    runs = Runs()
    connectors.ingest(pack, items=_items(1, 2, lanes=1))
    _drain(connectors, pack, runs)
    _build(connectors, pack)
    _drain(connectors, pack, runs, [V2])
    flow_versions.switch(connectors.context, pack, "project", V2, switched_by="ops", reason="ship")
    connectors.ingest(pack, items=_items(3, 2, lanes=1))  # ordinals 3-4: live in V2 only
    _drain(connectors, pack, runs, [V2])
    _, _, missed = flow_versions.rollback(connectors.context, pack, "project", rolled_back_by="ops", reason="bad")
    assert missed.inputs == 2
    catch_up_dead = _fail_next(connectors, pack)  # V1's catch-up of 3-4, a build of V1's own key
    flow_versions.retire(connectors.context, pack, "project", V2, retired_by="ops", reason="gone")
    replay = connectors.replay(catch_up_dead)
    assert (replay.work.flow_version, replay.work.build_run) == (None, True)
    _drain(connectors, pack, runs)
    assert runs.of(V1, build=True) == [3, 4, 5]  # its inputs and the replay's Event, as a build
    assert runs.of(V1, build=False) == [1, 2]  # 3 and 4 ran live once, in V2
    assert runs.of(V2, build=False) == [3, 4]
    assert_invariants(engine)


def test_a_build_waits_for_a_pruning_transaction_in_flight_and_counts_what_it_left(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    runs = _three_generations(connectors, pack, size=4, lanes=1)  # ordinals 1-12
    connectors.set_retention_policy(pack, keep_generations=1, keep_seconds=None)
    with engine.connect() as connection:
        older = list(
            connection.execute(
                sa.select(WorkItem.c.WorkId).where(WorkItem.c.PackInstallId == pack).order_by(WorkItem.c.LaneOrdinal)
            ).scalars()
        )[:2]
    built: dict[str, tuple[flow_versions.VersionView, flow_versions.CatchUp]] = {}
    context = connectors.context
    with engine.connect() as held:
        transaction = held.begin()
        tally, _ = retention._prune_batch(held, context.settings, context.clock, pack, older)  # not committed yet
        assert tally.generations == 2
        thread = threading.Thread(target=lambda: built.update(result=_build(connectors, pack, from_retained=True)))
        thread.start()
        thread.join(timeout=2.0)
        waited = thread.is_alive()  # on the policy row the pruning transaction holds
        transaction.commit()
    thread.join(timeout=60)
    assert waited and "result" in built
    view, made = built["result"]
    assert (made.inputs, view.track.cover_from_ordinal) == (4, 9)  # only what the pruning left
    _drain(connectors, pack, runs, [V2])
    assert runs.of(V2, build=True) == [9, 10, 11, 12]
    assert_invariants(engine)


def test_the_catch_up_cuts_each_identity_into_chained_runs_of_at_most_its_size(
    engine: sa.Engine, connectors: Connectors, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(flow_versions, "CATCH_UP_INPUTS", 4)
    pack = install_pack(engine)
    connectors.ingest(pack, items=_items(1, 19, lanes=2))  # lane-1: 10 inputs, lane-0: 9
    runs = Runs()
    _drain(connectors, pack, runs)
    with engine.connect() as connection:
        lanes = {
            key: [o for k, o in rows]
            for key, rows in itertools.groupby(
                connection.execute(
                    sa.select(Event.c.ProjectionKey, Event.c.EnqueueOrdinal).order_by(
                        Event.c.ProjectionKey, Event.c.EnqueueOrdinal
                    )
                ),
                key=operator.itemgetter(0),
            )
        }
    _, made = _build(connectors, pack)

    assert (made.generations, made.inputs) == (3 + 3, 19)
    with engine.connect() as connection:
        built = connection.execute(
            sa.select(WorkItem)
            .where(WorkItem.c.FlowVersion == V2)
            .order_by(WorkItem.c.InputKey, WorkItem.c.LaneOrdinal)
        ).all()
    for key, ordinals in lanes.items():
        mine = [row for row in built if row.InputKey == key]
        expected = [ordinals[n : n + 4] for n in range(0, len(ordinals), 4)]
        assert [(r.InputStartOrdinal, r.LaneOrdinal, r.AdmittedMemberCount) for r in mine] == [
            (chunk[0], chunk[-1], len(chunk)) for chunk in expected
        ]
        assert [r.Status == "blocked" for r in mine] == [False, True, True]
        assert [r.SuccessorWorkId for r in mine] == [*(r.WorkId for r in mine[1:]), None]
    _drain(connectors, pack, runs, [V2])
    assert runs.of(V2, build=True) == list(range(1, 20))
    assert_invariants(engine)
