"""Retention on every backend: what a policy lets go, what it never does, and what still works after."""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.errors import ProtocolMissing, UnknownPack, WorkNotFound, WorkPruned
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.queries import events as events_sql
from nexuscrm_connectors.settings import Settings
from nexuscrm_runtime.clock import iso_utc
from nexuscrm_runtime.database import is_sqlite
from nexuscrm_runtime.sqlite_writer import SerializedWriterDialect
from nexuscrm_schema.tables import (
    Event,
    PackInstall,
    PrunedReceipt,
    PrunedWork,
    RetentionPolicy,
    WorkItem,
)
from tests.support.checksums import database_digest
from tests.support.factories import FakeClock, delivery, install_pack
from tests.support.invariants import assert_invariants, check_invariants
from tests.support.waiting import wait_until
from workqueue import WorkStatus
from workqueue.errors import ErrorKind, InvalidArgument
from workqueue.values import Outcome

pytestmark = pytest.mark.database

HANG_GUARD = 60.0  # seconds: a pruning still running after this never ended


@contextlib.contextmanager
def counting_commits(engine: sa.Engine) -> Iterator[list[None]]:
    """A list that grows by one per transaction committed on ``engine`` inside the block."""
    commits: list[None] = []

    def committed(connection: sa.Connection) -> None:
        commits.append(None)

    sa.event.listen(engine, "commit", committed)
    try:
        yield commits
    finally:
        sa.event.remove(engine, "commit", committed)


def _count(engine: sa.Engine, table: sa.Table) -> int:
    with engine.connect() as connection:
        return int(connection.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def _generations(connectors: Connectors, pack: str, lane: str, count: int) -> list[str]:
    """``count`` generations of one identity, each of two inputs and completed, oldest first."""
    work_ids = []
    for _ in range(count):
        connectors.ingest(pack, items=[delivery(lane=lane), delivery(lane=lane)])
        claim = connectors.claim("w", pack_install_ids=[pack])[0]
        connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
        work_ids.append(claim.work.work_id)
    return work_ids


def test_retention_is_refused_for_a_pack_without_a_protocol_row(engine: sa.Engine, connectors: Connectors) -> None:
    legacy = install_pack(engine, legacy_max_ordinal=None)
    with pytest.raises(ProtocolMissing, match="cutover audit") as refused:
        connectors.set_retention_policy(legacy, keep_generations=1, keep_seconds=None)
    assert refused.value.kind is ErrorKind.FAILED_PRECONDITION
    with pytest.raises(UnknownPack):
        connectors.set_retention_policy("pk-nobody", keep_generations=1, keep_seconds=None)
    native = install_pack(engine)
    with pytest.raises(InvalidArgument, match="keep_generations must be at least 1"):
        connectors.set_retention_policy(native, keep_generations=0, keep_seconds=None)
    with pytest.raises(InvalidArgument, match="keep_seconds must not be negative"):
        connectors.set_retention_policy(native, keep_generations=None, keep_seconds=-1)
    assert _count(engine, RetentionPolicy) == 0  # nothing written by a refusal
    assert not connectors.get_retention_policy(native).active


def test_pruning_keeps_the_newest_and_nonterminal_generations_and_a_dry_run_changes_nothing(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    old = _generations(connectors, pack, "busy", 3)
    quiet = _generations(connectors, pack, "quiet", 1)  # the newest of its identity, terminal
    connectors.ingest(pack, items=[delivery(lane="busy")])
    running = connectors.claim("w", pack_install_ids=[pack])[0]  # nonterminal, newest of "busy"
    connectors.set_retention_policy(pack, keep_generations=1, keep_seconds=None)
    with engine.connect() as connection:
        before = database_digest(connection)

    dry = connectors.prune(pack, dry_run=True)

    with engine.connect() as connection:
        assert database_digest(connection) == before
    assert (dry.generations, dry.events, dry.receipts, dry.kept) == (3, 6, 6, 1)
    assert dry.horizon_ordinal == 0

    with counting_commits(engine) as commits:
        done = connectors.prune(pack)

    assert len(commits) == 1  # small generations share a transaction (up to prune_batch_events members)

    assert (done.generations, done.events, done.receipts, done.kept) == (3, 6, 6, 1)
    with engine.connect() as connection:  # the pruned generations are gone, the others stay
        remaining = set(connection.execute(sa.select(WorkItem.c.WorkId)).scalars())
    assert remaining == {*quiet, running.work.work_id}
    assert connectors.get_work(running.work.work_id).work.status is WorkStatus.PROCESSING
    assert done.horizon_ordinal == 6  # the third busy generation ended at ordinal 6
    assert connectors.get_retention_policy(pack).pruned_generations == 3
    assert connectors.prune(pack).generations == 0  # nothing more to let go
    connectors.complete(running.work.work_id, lease_token=running.lease_token)
    assert set(old).isdisjoint(remaining)
    assert_invariants(engine)


def test_after_pruning_duplicates_are_acknowledged_ordinals_go_on_and_pruned_work_says_when(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock
) -> None:
    pack = install_pack(engine)
    first = delivery(lane="a")
    connectors.ingest(pack, items=[first])
    claim = connectors.claim("w", pack_install_ids=[pack])[0]
    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    _generations(connectors, pack, "a", 1)
    connectors.set_retention_policy(pack, keep_generations=1, keep_seconds=None)
    clock.advance(5)
    assert connectors.prune(pack).generations == 1
    with engine.connect() as connection:
        before = database_digest(connection)
        pruned = connection.execute(sa.select(PrunedWork.c.PrunedAt)).scalar_one()  # the database's time
    pruned_at = f"pruned at {iso_utc(pruned)}"

    again = connectors.ingest(pack, items=[first, delivery(first.receipt_key, lane="a", payload=b"other")])

    assert [r.outcome for r in again] == [Outcome.DUPLICATE_PRUNED, Outcome.REJECTED]
    assert again[0].enqueue_ordinal == 1 and again[0].work_id == claim.work.work_id
    assert pruned_at in again[0].message
    with engine.connect() as connection:
        assert database_digest(connection) == before  # no Event, no work, no receipt
    fresh = connectors.ingest(pack, items=[delivery(lane="a")])
    assert fresh[0].outcome is Outcome.ADMITTED and fresh[0].enqueue_ordinal == 4  # the counter never moved back
    with engine.connect() as connection:
        assert connection.execute(sa.select(PackInstall.c.LastOrdinal)).scalar_one() == 4

    explained = connectors.explain_receipt(pack, receipt_key=first.receipt_key)
    assert explained.receipt_state == "pruned" and explained.enqueue_ordinal == 1
    assert explained.explanation.startswith(pruned_at)
    for refused_call in (
        lambda: connectors.replay(claim.work.work_id),
        lambda: connectors.get_work(claim.work.work_id),
    ):
        with pytest.raises(WorkPruned, match=re.escape(pruned_at)) as refused:
            refused_call()
        assert refused.value.kind is ErrorKind.FAILED_PRECONDITION
    with pytest.raises(WorkNotFound):
        connectors.replay("never-existed")
    assert_invariants(engine)


def test_an_age_limit_keeps_recently_finished_generations(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock
) -> None:
    pack = install_pack(engine)
    _generations(connectors, pack, "a", 3)
    connectors.set_retention_policy(pack, keep_generations=None, keep_seconds=3600)
    assert connectors.prune(pack).generations == 0
    clock.advance(3600)
    assert connectors.prune(pack).generations == 2  # the newest generation always stays
    assert_invariants(engine)


def test_a_large_generation_goes_in_bounded_transactions(engine: sa.Engine, clock: FakeClock) -> None:
    connectors = Connectors(engine, Settings(prune_batch_events=2), clock=clock)
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane="a") for _ in range(5)])
    claim = connectors.claim("w", pack_install_ids=[pack])[0]
    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    _generations(connectors, pack, "a", 1)
    connectors.set_retention_policy(pack, keep_generations=1, keep_seconds=None)
    with counting_commits(engine) as commits:
        report = connectors.prune(pack)
    assert (report.generations, report.events, report.receipts) == (1, 5, 5)
    # 5 members at 2 per transaction, the WorkItem with the last, which also re-checked the
    # identity's newest generation under its row lock and kept it.
    assert len(commits) == 3
    assert _count(engine, PrunedReceipt) == 5
    assert_invariants(engine)


def test_the_background_pass_prunes_every_pack_with_a_policy(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock
) -> None:
    packs = [install_pack(engine) for _ in range(3)]
    for pack in packs:
        _generations(connectors, pack, "a", 3)
    for pack in packs[:2]:
        connectors.set_retention_policy(pack, keep_generations=2, keep_seconds=None)

    reports = connectors.prune_pass()

    assert sorted((r.pack_install_id, r.generations) for r in reports) == sorted((p, 1) for p in packs[:2])
    assert _count(engine, WorkItem) == 2 + 2 + 3
    assert not check_invariants(engine)


def test_the_checker_finds_a_reused_ordinal_and_a_resurrected_receipt(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    _generations(connectors, pack, "a", 2)
    connectors.set_retention_policy(pack, keep_generations=1, keep_seconds=None)
    connectors.prune(pack)
    assert not check_invariants(engine)
    with engine.begin() as connection:  # damage on purpose: what a wrong pruner or admission would leave
        tombstone = connection.execute(sa.select(PrunedReceipt).order_by(PrunedReceipt.c.EnqueueOrdinal)).first()
        assert tombstone is not None
        connection.execute(
            sa.insert(Event).values(
                PackInstallId=pack,
                EnqueueOrdinal=tombstone.EnqueueOrdinal,
                ProjectionKey=connection.execute(sa.select(PrunedWork.c.ProjectionKey)).scalar_one(),
                ReceiptKey="reused",
                PayloadHash="h" * 64,
                Payload=b"x",
                Status="pending",
                CreatedAt=tombstone.PrunedAt,
            )
        )
    problems = check_invariants(engine)
    assert any(p.startswith("R: Events [1] remain (or were reused)") for p in problems), problems
    assert any(p.startswith("R: tombstone") and "still (or again)" in p for p in problems), problems


def test_a_duplicate_whose_generation_is_pruned_during_its_verification_is_acknowledged_as_pruned(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Admission reads a duplicate's Event, then (another statement) its covering generation.

    A pruning that commits between the two took the generation away: the verdict must read
    the tombstone, not call the input's coverage missing. MySQL-protocol servers let the
    pruning commit there (each statement reads its own snapshot); on SQLite it waits for the
    admission's writer, and the duplicate is covered.
    """
    pack = install_pack(engine)
    first = delivery(lane="a")
    connectors.ingest(pack, items=[first])
    claim = connectors.claim("w", pack_install_ids=[pack])[0]
    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    _generations(connectors, pack, "a", 1)  # a newer generation: the first one is older, prunable
    connectors.set_retention_policy(pack, keep_generations=1, keep_seconds=None)
    clock.advance(5)
    covering = events_sql.work_items_covering
    pruning: list[threading.Thread] = []
    order: list[str] = []  # "pruned" and "verified", in the order they happened

    def prune() -> None:
        connectors.prune(pack)
        order.append("pruned")

    def prune_meanwhile(*args: Any) -> Any:
        thread = threading.Thread(target=prune)
        thread.start()
        pruning.append(thread)
        if is_sqlite(engine):  # the pruning cannot commit before this transaction: wait until it queues for it
            dialect = engine.dialect
            assert isinstance(dialect, SerializedWriterDialect)
            wait_until(lambda: dialect.writer.waiting == 1, "the pruning to queue for the admission's writer")
        else:  # each statement reads its own snapshot: the pruning commits before the next one
            thread.join(HANG_GUARD)
        order.append("verified")
        return covering(*args)

    monkeypatch.setattr(events_sql, "work_items_covering", prune_meanwhile)
    events_before = _count(engine, Event)
    (again,) = connectors.ingest(pack, items=[first])
    pruning[0].join(HANG_GUARD)

    assert not pruning[0].is_alive(), "the pruning never ended"
    assert connectors.get_retention_policy(pack).pruned_generations == 1
    if is_sqlite(engine):
        assert order == ["verified", "pruned"]
        assert again.outcome is Outcome.DUPLICATE_COVERED
    else:
        assert order == ["pruned", "verified"]  # the pruning committed during the verification
        assert again.outcome is Outcome.DUPLICATE_PRUNED, again.message
        assert again.work_id == claim.work.work_id
    assert again.enqueue_ordinal == 1
    assert _count(engine, Event) == events_before - 1  # the pruned input went; the duplicate wrote none
    assert_invariants(engine)
