"""The set-based pruner (decision 181): many generations per transaction, the same decisions as one at a time."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa
from prometheus_client import REGISTRY

from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.operating.order_policy import Policy
from nexuscrm_connectors.operating.retention import Backlog
from nexuscrm_connectors.settings import Settings
from nexuscrm_schema.tables import Event, PrunedReceipt, PrunedWork, WorkItem
from tests.support.factories import FakeClock, delivery, install_pack
from tests.support.invariants import assert_invariants
from tests.support.statements import capture

pytestmark = pytest.mark.database

LONG_AGO = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)  # outside any duplicate window the test sets


@dataclasses.dataclass
class _Keys:
    """The receipt keys given so far, and the source time of the newest (a second apart; the same in every pack)."""

    seen: list[str] = dataclasses.field(default_factory=list)
    start: dt.datetime = dataclasses.field(default_factory=lambda: dt.datetime.now(dt.UTC).replace(microsecond=0))


def _generation(
    connectors: Connectors, pack: str, keys: _Keys, lane: str, *, fail: bool = False, old: bool = False
) -> str:
    """A generation of two inputs of ``lane`` (source times long ago when ``old``), completed or failed."""
    source_time = (LONG_AGO if old else keys.start) + dt.timedelta(seconds=len(keys.seen))
    given = [f"{lane}-{n}" for n in range(len(keys.seen), len(keys.seen) + 2)]
    keys.seen.extend(given)
    connectors.ingest(pack, items=[delivery(key, lane=lane, source_time=source_time) for key in given])
    (claim,) = connectors.claim("w", pack_install_ids=[pack])
    assert claim.work.projection_key.endswith(lane)
    if fail:
        connectors.fail(claim.work.work_id, lease_token=claim.lease_token, error="boom", retryable=False)
    else:
        connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    return claim.work.work_id


def _history(connectors: Connectors, pack: str, keys: _Keys) -> tuple[set[str], set[str], set[str]]:
    """A mixed history; the WorkIds the policy (keep 1 generation, "block") lets go, those it keeps, and lane a's.

    Lanes a-c: three completed generations (lane a's inputs from long ago): the older two go.
    Lane e: a dead letter with a completed successor: kept, "block" holds it (decision 165).
    Lane f: a dead letter replayed and its replay completed, then a newer generation: both go.
    Lane d (last, its replay stays claimable): a completed generation goes; a dead letter whose
    replay is live stays (decision 173), and so does the replay.
    """
    going: set[str] = set()
    kept: set[str] = set()
    old: set[str] = set()
    for lane in ("a", "b", "c"):
        *older, newest = [_generation(connectors, pack, keys, lane, old=lane == "a") for _ in range(3)]
        going.update(older)
        kept.add(newest)
        old |= set(older) if lane == "a" else set()
    kept.add(_generation(connectors, pack, keys, "e", fail=True))
    kept.add(_generation(connectors, pack, keys, "e"))
    failed = _generation(connectors, pack, keys, "f", fail=True)
    replay = connectors.replay(failed)
    (rerun,) = connectors.claim("w", pack_install_ids=[pack])
    assert rerun.work.work_id == replay.work.work_id
    connectors.complete(rerun.work.work_id, lease_token=rerun.lease_token)
    going |= {failed, replay.work.work_id}
    kept.add(_generation(connectors, pack, keys, "f"))
    going.add(_generation(connectors, pack, keys, "d"))
    dead = _generation(connectors, pack, keys, "d", fail=True)
    kept |= {dead, connectors.replay(dead).work.work_id}
    connectors.set_order_policy(pack, Policy.BLOCK, set_by="ops", reason="ledger")
    return going, kept, old


def _tombstones(engine: sa.Engine, pack: str) -> tuple[set[Any], set[Any], set[str]]:
    """The pack's PrunedWork records and PrunedReceipt tombstones by what they say (not when), and its WorkIds left."""
    record: list[sa.ColumnElement[Any]] = [
        PrunedWork.c[name] for name in ("WorkId", "ProjectionKey", "InputStartOrdinal", "LaneOrdinal")
    ]
    # A record without tombstones (the replay's) expires a window after its pruning: that is when, not what.
    source_time = sa.case((PrunedWork.c.SourceTime == PrunedWork.c.PrunedAt, None), else_=PrunedWork.c.SourceTime)
    record += [PrunedWork.c.Status, source_time]
    tombstone = [PrunedReceipt.c[name] for name in ("ReceiptKey", "EnqueueOrdinal", "PayloadHash", "WorkId")]
    tombstone += [PrunedReceipt.c.SourceTime]
    with engine.connect() as connection:
        records = {
            tuple(row) for row in connection.execute(sa.select(*record).where(PrunedWork.c.PackInstallId == pack))
        }
        receipts = {
            tuple(row) for row in connection.execute(sa.select(*tombstone).where(PrunedReceipt.c.PackInstallId == pack))
        }
        left = set(connection.execute(sa.select(WorkItem.c.WorkId).where(WorkItem.c.PackInstallId == pack)).scalars())
    return records, receipts, left


def test_many_generations_per_transaction_decide_and_record_as_one_at_a_time(
    engine: sa.Engine, clock: FakeClock
) -> None:
    # One at a time: two members per transaction, so each generation of two is decided and goes alone.
    one_by_one = Connectors(engine, Settings(prune_batch_events=2), clock=clock)
    batched = Connectors(engine, clock=clock)
    reports = {}
    start = dt.datetime.now(dt.UTC).replace(microsecond=0)
    for name, connectors in (("one by one", one_by_one), ("batched", batched)):
        pack = install_pack(engine)
        keys = _Keys(start=start)
        going, kept, old = _history(connectors, pack, keys)
        connectors.set_retention_policy(pack, keep_generations=1, keep_seconds=None, duplicate_window_seconds=3600)
        report = connectors.prune(pack)
        records, receipts, left = _tombstones(engine, pack)
        assert report.generations == len(going) == 9  # what the rules let go, and nothing else
        assert left == kept
        # Lane a's inputs are older than the window: its tombstones expire at once, and its records with them.
        assert {record[0] for record in records} == going - old
        assert report.expired_receipts == 4
        assert len(receipts) == 2 * len(going) - 2 - 4  # the replay's own Events have no receipt
        records = {(record[0], record[1].replace(pack, "PACK"), *record[2:]) for record in records}
        reports[name] = (report.generations, report.events, report.receipts, report.kept, records, receipts)
        duplicate = connectors.ingest(pack, items=[delivery(keys.seen[6], lane="b", source_time=start)])
        assert [result.outcome.name for result in duplicate] == ["DUPLICATE_PRUNED"]
    # The same records and tombstones (WorkIds aside: each pack has its own); only the batching differs.
    assert _without_work_ids(reports["one by one"]) == _without_work_ids(reports["batched"])
    assert_invariants(engine)


def _without_work_ids(report: tuple[Any, ...]) -> tuple[Any, ...]:
    *counts, records, receipts = report
    return (*counts, {record[1:] for record in records}, {receipt[:3] + receipt[4:] for receipt in receipts})


def test_a_pruning_transaction_stays_within_its_bound(engine: sa.Engine, clock: FakeClock) -> None:
    connectors = Connectors(engine, Settings(prune_batch_events=7), clock=clock)
    pack = install_pack(engine)
    keys = _Keys()
    for lane in ("a", "b", "c", "d"):
        for _ in range(6):
            _generation(connectors, pack, keys, lane)
    connectors.set_retention_policy(pack, keep_generations=1, keep_seconds=None)
    with capture(engine) as captured:
        report = connectors.prune(pack)
    assert (report.generations, report.events) == (20, 40)
    deletes = [s for s in captured.statements if s.verb == "DELETE" and "FROM `Event`" in s.statement.replace('"', "`")]
    # Each transaction deletes at most 7 Events: whole generations of two, three to a transaction.
    assert len(deletes) == captured.commits == 7
    assert all(len(_ordinals(s.parameters)) <= 7 for s in deletes)
    # Set-based: a transaction's statements do not grow with the generations it prunes.
    per_transaction = [b - a for a, b in zip([0, *captured.commit_positions], captured.commit_positions, strict=False)]
    assert max(per_transaction) <= 24
    with engine.connect() as connection:
        assert connection.execute(sa.select(sa.func.count()).select_from(Event)).scalar_one() == 8
    assert_invariants(engine)


def _ordinals(parameters: Any) -> list[Any]:
    values = parameters.values() if isinstance(parameters, dict) else parameters
    return [value for value in values if isinstance(value, int)]


def test_the_backlog_says_what_the_pruner_has_yet_to_do(engine: sa.Engine, clock: FakeClock) -> None:
    # No background interval: a pass is one round of two candidates, so the backlog is seen between rounds.
    connectors = Connectors(engine, Settings(prune_generations_per_pass=2, materialize_interval_seconds=0), clock=clock)
    pack = install_pack(engine)
    keys = _Keys()
    first, *_ = [_generation(connectors, pack, keys, lane) for lane in ("a", "b") for _ in range(3)]
    assert connectors.get_retention_policy(pack).backlog_generations == 0  # no policy, nothing let go
    connectors.set_retention_policy(pack, keep_generations=1, keep_seconds=None)
    policy = connectors.get_retention_policy(pack)
    assert policy.backlog_generations == 4  # the newest of each lane stays
    assert policy.backlog_oldest_finished_at == connectors.get_work(first).work.finished_at
    connectors.prune_pass()  # two candidates a pass: lane a's older two
    assert (
        connectors.pruner.backlog.generations
        == 2
        == REGISTRY.get_sample_value("nexuscrm_retention_backlog_generations")
    )
    assert connectors.pruner.backlog.oldest_seconds > 0
    connectors.prune_pass()  # lane a's newest, kept, and lane b's oldest
    assert connectors.pruner.backlog.generations == 1
    connectors.prune_pass()
    assert connectors.pruner.backlog == Backlog(0, 0.0)
    assert REGISTRY.get_sample_value("nexuscrm_retention_backlog_age_seconds") == 0
    policy = connectors.get_retention_policy(pack)
    assert (policy.backlog_generations, policy.backlog_oldest_finished_at) == (0, None)
    assert_invariants(engine)


def test_a_pass_goes_on_in_rounds_while_candidates_remain_within_the_interval(
    engine: sa.Engine, clock: FakeClock
) -> None:
    connectors = Connectors(engine, Settings(prune_generations_per_pass=2), clock=clock)
    packs = sorted(install_pack(engine) for _ in range(2))  # a round takes the packs in this order
    keys = _Keys()
    for pack in packs:
        for lane in ("a", "b"):
            for _ in range(3):
                _generation(connectors, pack, keys, lane)
        connectors.set_retention_policy(pack, keep_generations=1, keep_seconds=None)

    reports = connectors.prune_pass()

    # Two candidates a round, oldest first: a1 a2, then a3 (kept: lane a's newest) b1, then b2 b3
    # (kept); a full round may have more behind it, so a fourth finds none and ends the pack's walk.
    assert [(r.pack_install_id, r.generations, r.kept) for r in reports] == [
        (packs[0], 2, 0),
        (packs[1], 2, 0),
        (packs[0], 1, 1),
        (packs[1], 1, 1),
        (packs[0], 1, 1),
        (packs[1], 1, 1),
        (packs[0], 0, 0),
        (packs[1], 0, 0),
    ]
    assert connectors.pruner.backlog == Backlog(0, 0.0)
    with engine.connect() as connection:
        assert connection.execute(sa.select(sa.func.count()).select_from(WorkItem)).scalar_one() == 4
    assert_invariants(engine)
