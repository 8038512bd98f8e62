"""The duplicate window on every backend: tombstones expire, and a duplicate never creates work (decision 127)."""

from __future__ import annotations

import dataclasses
import datetime as dt

import grpc
import pytest
import sqlalchemy as sa

from nexuscrm_connectors.errors import WorkNotFound
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.settings import Settings
from nexuscrm_schema.tables import Event, PrunedReceipt, PrunedWork, RetentionPolicy, WorkItem
from nexuscrm_sdk.client import ConnectorsClient
from tests.connectors.integration.test_queue_and_generation_reads import channel, client, server
from tests.support.checksums import database_digest
from tests.support.factories import FakeClock, delivery, install_pack
from tests.support.invariants import assert_invariants, check_invariants, window_violations
from workqueue.errors import InvalidArgument
from workqueue.values import IngestItem, Outcome, PruneReport

pytestmark = pytest.mark.database
__all__ = ["channel", "client", "server"]  # the gRPC fixtures, shared

WINDOW = 60


def _now(engine: sa.Engine, clock: FakeClock) -> dt.datetime:
    with engine.connect() as connection:
        return clock.read(connection)


def _completed(connectors: Connectors, pack: str, items: list[IngestItem]) -> str:
    """Admit ``items`` (one identity) as one generation and complete it; its WorkId."""
    assert {r.outcome for r in connectors.ingest(pack, items=items)} == {Outcome.ADMITTED}
    claim = connectors.claim("w", pack_install_ids=[pack])[0]
    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    return claim.work.work_id


def _count(engine: sa.Engine, table: sa.Table) -> int:
    with engine.connect() as connection:
        return int(connection.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def test_a_window_is_validated_and_then_every_delivery_needs_a_source_time(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock
) -> None:
    pack = install_pack(engine)
    with pytest.raises(InvalidArgument, match="duplicate_window_seconds must be at least 1") as refused:
        connectors.set_retention_policy(pack, keep_generations=1, keep_seconds=None, duplicate_window_seconds=0)
    assert refused.value.field == "duplicate_window_seconds"
    assert _count(engine, RetentionPolicy) == 0
    policy = connectors.set_retention_policy(
        pack, keep_generations=1, keep_seconds=None, duplicate_window_seconds=WINDOW
    )
    assert policy.duplicate_window_seconds == WINDOW and policy.horizon_source_time is None
    with engine.connect() as connection:
        before = database_digest(connection)

    results = connectors.ingest(pack, items=[delivery(lane="a"), delivery(lane="a", source_time=_now(engine, clock))])

    assert results[0].outcome is Outcome.REJECTED
    assert "source_time is required" in results[0].message and f"duplicate window of {WINDOW} s" in results[0].message
    assert results[1].outcome is Outcome.ADMITTED
    with engine.connect() as connection:  # the refused delivery wrote nothing
        after = database_digest(connection)
        keys = set(connection.execute(sa.select(Event.c.ReceiptKey)).scalars())
    assert keys == {results[1].receipt_key} and after != before
    assert_invariants(engine)


def test_expired_tombstones_leave_a_horizon_that_answers_every_old_delivery_expired(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock
) -> None:
    pack = install_pack(engine)
    now = _now(engine, clock)
    old = [delivery(lane="a", source_time=now - dt.timedelta(seconds=2 * WINDOW + n)) for n in range(2)]
    recent = [delivery(lane="a", source_time=now - dt.timedelta(seconds=WINDOW // 2))]
    old_work = _completed(connectors, pack, old)
    recent_work = _completed(connectors, pack, recent)
    _completed(connectors, pack, [delivery(lane="a", source_time=now)])  # the newest generation stays
    connectors.set_retention_policy(pack, keep_generations=1, keep_seconds=None, duplicate_window_seconds=WINDOW)

    dry = connectors.prune(pack, dry_run=True)
    assert (dry.generations, dry.expired_receipts) == (2, 0)  # nothing is a tombstone yet
    report = connectors.prune(pack)

    assert (report.generations, report.receipts) == (2, 3)
    assert (report.expired_receipts, report.expired_generations) == (2, 1)  # the old inputs, and their record
    horizon = max(item.source_time for item in old if item.source_time is not None)
    assert report.horizon_source_time == horizon
    assert connectors.get_retention_policy(pack).horizon_source_time == horizon
    with engine.connect() as connection:
        assert set(connection.execute(sa.select(PrunedWork.c.WorkId)).scalars()) == {recent_work}
        assert set(connection.execute(sa.select(PrunedReceipt.c.ReceiptKey)).scalars()) == {recent[0].receipt_key}
        before = database_digest(connection)
    late = delivery(lane="a", source_time=horizon)  # a key never seen, at the horizon

    again = connectors.ingest(pack, items=[*old, recent[0], late])

    assert [r.outcome for r in again] == [Outcome.EXPIRED, Outcome.EXPIRED, Outcome.DUPLICATE_PRUNED, Outcome.EXPIRED]
    assert "duplicate-window horizon" in again[0].message
    with engine.connect() as connection:  # no Event, no work, no receipt for any of them
        assert database_digest(connection) == before
    fresh = connectors.ingest(pack, items=[delivery(lane="a", source_time=horizon + dt.timedelta(microseconds=1))])
    assert fresh[0].outcome is Outcome.ADMITTED
    with pytest.raises(WorkNotFound, match="expired with its pack's duplicate window"):
        connectors.replay(old_work)
    with pytest.raises(WorkNotFound, match="duplicate window has expired the records"):
        connectors.explain_receipt(pack, receipt_key=old[0].receipt_key)
    acknowledged = {(pack, item.receipt_key): item.source_time for item in [*old, *recent] if item.source_time}
    assert window_violations(engine, acknowledged) == []
    assert_invariants(engine)

    # The horizon never moves back: turning the window off keeps it, and it still answers.
    connectors.set_retention_policy(pack, keep_generations=1, keep_seconds=None, duplicate_window_seconds=None)
    assert connectors.get_retention_policy(pack).horizon_source_time == horizon
    assert connectors.ingest(pack, items=[old[0]])[0].outcome is Outcome.EXPIRED


def test_the_checker_names_an_input_lost_above_the_horizon(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock
) -> None:
    pack = install_pack(engine)
    now = _now(engine, clock)
    items = [delivery(lane="a", source_time=now - dt.timedelta(seconds=2 * WINDOW + n)) for n in range(2)]
    _completed(connectors, pack, items[:1])
    _completed(connectors, pack, items[1:])
    connectors.set_retention_policy(pack, keep_generations=1, keep_seconds=None, duplicate_window_seconds=WINDOW)
    connectors.prune(pack)
    acknowledged = {(pack, item.receipt_key): item.source_time for item in items if item.source_time}
    assert window_violations(engine, acknowledged) == []
    with engine.begin() as connection:  # damage on purpose: a horizon that fell below an expired input
        connection.execute(sa.update(RetentionPolicy).values(HorizonSourceTime=now - dt.timedelta(seconds=3 * WINDOW)))
    problems = window_violations(engine, acknowledged)
    assert len(problems) == 1 and problems[0].startswith(f"W: input {pack}/{items[0].receipt_key}"), problems


def test_a_tombstone_outliving_its_generation_record_still_answers_its_duplicates(
    engine: sa.Engine, clock: FakeClock
) -> None:
    """A generation pruned in chunks: an early member newer than the last chunk's keeps its tombstone."""
    connectors = Connectors(engine, Settings(prune_batch_events=2), clock=clock)
    pack = install_pack(engine)
    now = _now(engine, clock)
    ages = [WINDOW // 2, 3 * WINDOW, 3 * WINDOW]  # ordinal 1 is recent, ordinals 2 and 3 (the last chunk) are old
    items = [delivery(lane="a", source_time=now - dt.timedelta(seconds=age)) for age in ages]
    work_id = _completed(connectors, pack, items)
    _completed(connectors, pack, [delivery(lane="a", source_time=now)])
    connectors.set_retention_policy(pack, keep_generations=1, keep_seconds=None, duplicate_window_seconds=WINDOW)

    report = connectors.prune(pack)

    assert (report.generations, report.expired_receipts, report.expired_generations) == (1, 2, 1)
    with engine.connect() as connection:
        assert connection.execute(sa.select(sa.func.count()).select_from(PrunedWork)).scalar_one() == 0
        assert list(connection.execute(sa.select(PrunedReceipt.c.WorkId)).scalars()) == [work_id]
    other_payload = delivery(items[0].receipt_key, lane="a", payload=b"other", source_time=items[0].source_time)
    again = connectors.ingest(pack, items=[items[0], other_payload])
    assert [r.outcome for r in again] == [Outcome.DUPLICATE_PRUNED, Outcome.REJECTED]
    assert _count(engine, WorkItem) == 1
    assert not check_invariants(engine)
    clock.advance(WINDOW)  # now the recent member is old too: its tombstone goes
    assert connectors.prune(pack).expired_receipts == 1
    assert connectors.ingest(pack, items=[items[0]])[0].outcome is Outcome.EXPIRED
    assert_invariants(engine)


def test_the_sdk_client_sets_shows_and_runs_retention_like_the_facade(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock, client: ConnectorsClient
) -> None:
    pack = install_pack(engine)
    now = _now(engine, clock)
    _completed(connectors, pack, [delivery(lane="a", source_time=now - dt.timedelta(seconds=2 * WINDOW))])
    _completed(connectors, pack, [delivery(lane="a", source_time=now)])
    with pytest.raises(grpc.RpcError) as refused:
        client.set_retention_policy(pack, keep_generations=1, keep_seconds=None, duplicate_window_seconds=-5)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "duplicate_window_seconds must be at least 1" in str(refused.value.details())

    policy = client.set_retention_policy(pack, keep_generations=1, keep_seconds=None, duplicate_window_seconds=WINDOW)

    assert (policy.keep_generations, policy.keep_seconds, policy.duplicate_window_seconds) == (1, None, WINDOW)
    # GetRetentionPolicy adds the pruner's backlog (decision 181): the older generation, let go, not yet pruned.
    shown = client.get_retention_policy(pack)
    backlog = connectors.get_retention_policy(pack).backlog_oldest_finished_at
    assert backlog is not None and shown.backlog_oldest_finished_at == backlog.replace(tzinfo=dt.UTC)
    assert shown == dataclasses.replace(
        policy, backlog_generations=1, backlog_oldest_finished_at=shown.backlog_oldest_finished_at
    )
    dry = client.prune(pack, dry_run=True)
    assert dry == PruneReport(pack_install_id=pack, dry_run=True, generations=1, events=1, receipts=1, kept=1)
    done = client.prune(pack)
    assert (done.generations, done.expired_receipts, done.expired_generations) == (1, 1, 1)
    shown = client.get_retention_policy(pack)
    assert shown.expired_receipts == 1 and shown.horizon_source_time is not None
    assert shown.horizon_source_time.tzinfo is not None  # aware UTC, as the SDK returns every datetime
    assert shown.horizon_source_time.replace(tzinfo=None) == now - dt.timedelta(seconds=2 * WINDOW)
    assert_invariants(engine)


def test_the_record_of_a_generation_without_receipts_expires_a_window_after_its_pruning(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock
) -> None:
    pack = install_pack(engine)
    assert {
        r.outcome for r in connectors.ingest(pack, items=[delivery(lane="a", source_time=_now(engine, clock))])
    } == {Outcome.ADMITTED}
    (claim,) = connectors.claim("w", pack_install_ids=[pack])
    connectors.fail(claim.work.work_id, lease_token=claim.lease_token, error="poison", retryable=False)
    replay = connectors.replay(claim.work.work_id).work.work_id  # its only member is the replay Event: no receipt
    (again,) = connectors.claim("w", pack_install_ids=[pack])
    assert again.work.work_id == replay
    connectors.complete(replay, lease_token=again.lease_token)
    _completed(connectors, pack, [delivery(lane="a", source_time=_now(engine, clock))])  # the newest stays
    connectors.set_retention_policy(pack, keep_generations=1, keep_seconds=None, duplicate_window_seconds=WINDOW)

    assert connectors.prune(pack).generations == 2
    with engine.connect() as connection:
        record = connection.execute(sa.select(PrunedWork).where(PrunedWork.c.WorkId == replay)).one()
    assert record.SourceTime == record.PrunedAt  # not NULL, which no window ever expires
    clock.advance(WINDOW + 1)
    report = connectors.prune(pack)

    assert (report.expired_receipts, report.expired_generations) == (1, 2)  # the dead letter's input, both records
    assert _count(engine, PrunedWork) == 0
    assert_invariants(engine)


def test_records_expire_in_step_with_their_tombstones_while_tombstones_are_still_due(
    engine: sa.Engine, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under steady ingest every expiring batch is full: its records must not wait for the tombstones to run dry."""
    monkeypatch.setattr("nexuscrm_connectors.operating.retention.EXPIRE_BATCHES_PER_PASS", 1)
    connectors = Connectors(engine, Settings(prune_batch_events=2), clock=clock)
    pack = install_pack(engine)
    now = _now(engine, clock)
    works = [
        _completed(connectors, pack, [delivery(lane="a", source_time=now - dt.timedelta(seconds=(6 - n) * WINDOW))])
        for n in range(3)
    ]
    _completed(connectors, pack, [delivery(lane="a", source_time=now)])
    connectors.set_retention_policy(pack, keep_generations=1, keep_seconds=None, duplicate_window_seconds=WINDOW)
    connectors.prune(pack)  # pruned, and the first batch: the two oldest tombstones
    with engine.connect() as connection:
        left = set(connection.execute(sa.select(PrunedWork.c.WorkId)).scalars())
    # The oldest record went with the batch that held its tombstone and a newer one; the second
    # record waits for a batch past its own SourceTime, the third for its tombstone.
    assert left == set(works[1:])
    assert _count(engine, PrunedReceipt) == 1
    connectors.prune(pack)
    assert _count(engine, PrunedWork) == 0 and _count(engine, PrunedReceipt) == 0
    assert_invariants(engine)
