"""Retention's decisions against their conflicting writers on two Galera nodes (decisions 123, 127).

Same method as ``test_control_decisions.py``: both transactions are held at their commit
after writing everything, the first commits, then the second, which must be made to decide
again (certification failure, retried by ``run_transaction``) instead of committing on a
stale read.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Sequence
from typing import Any

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.context import Context
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.operating import retention
from nexuscrm_connectors.queries import events as events_sql
from nexuscrm_runtime.clock import DATABASE_CLOCK
from nexuscrm_schema.tables import Event, PrunedWork, WorkItem
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants
from tests.support.waiting import DEADLINE
from tests.system.galera.test_control_decisions import Gate, engines, synced
from workqueue.values import IngestResult, Outcome

__all__ = ["engines"]  # the fixture, shared with the control decisions


def _two_generations(engine: sa.Engine) -> str:
    """A pack whose lane "a" has two completed generations, and a keep-1 policy."""
    connectors = Connectors(engine)
    pack = install_pack(engine)
    for _ in range(2):
        connectors.ingest(pack, items=[delivery(lane="a"), delivery(lane="a")])
        [claim] = connectors.claim("w", pack_install_ids=[pack])
        connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    retention.set_policy(Context.of(engine), pack, keep_generations=1, keep_seconds=None)
    return pack


def _count(engine: sa.Engine, table: sa.Table) -> int:
    with engine.connect() as connection:
        return int(connection.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def test_pruning_cannot_commit_after_the_policy_was_turned_off_on_another_node(
    engines: list[sa.Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pruning vs a policy change: both write the RetentionPolicy row, so the pruning decides again."""
    pack = _two_generations(engines[0])
    synced(engines[1])
    gate = Gate(monkeypatch)
    gate.hold("retention prune")
    gate.hold("retention policy")
    pruning = gate.run("retention prune", lambda: retention.prune(Context.of(engines[0]), pack)[0])
    turned_off = gate.run(
        "retention policy",
        lambda: retention.set_policy(Context.of(engines[1]), pack, keep_generations=None, keep_seconds=None),
    )
    assert not turned_off().active  # the policy change commits first ...
    report = pruning()  # ... then the pruning, which read the policy before it
    assert gate.attempts["retention prune"] >= 2, "the pruning was not made to decide again"
    assert report.generations == 0 and _count(engines[0], PrunedWork) == 0
    assert _count(engines[0], WorkItem) == 2
    assert_invariants(engines[0])


def test_an_admission_that_read_the_old_horizon_cannot_commit_after_its_tombstone_expired(
    engines: list[sa.Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Expiry vs a redelivery on another node (decision 127): the expiry bumps the pack row admission writes.

    The admission reads the horizon (with the protocol row), then waits while node 1 expires
    the tombstone of the key it redelivers, then reads no tombstone: without the bump it would
    admit a duplicate; with it, it is aborted, decides again, and answers expired.
    """
    connectors = Connectors(engines[0])
    pack = install_pack(engines[0])
    with engines[0].connect() as connection:
        now = DATABASE_CLOCK.read(connection)
    old = delivery(lane="a", source_time=now - dt.timedelta(seconds=120))
    for item in (old, delivery(lane="a", source_time=now)):
        connectors.ingest(pack, items=[item])
        [claim] = connectors.claim("w", pack_install_ids=[pack])
        connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    retention.set_policy(Context.of(engines[0]), pack, keep_generations=1, keep_seconds=None)
    assert retention.prune(Context.of(engines[0]), pack)[0].receipts == 1  # the tombstone
    retention.set_policy(
        Context.of(engines[0]), pack, keep_generations=1, keep_seconds=None, duplicate_window_seconds=60
    )
    synced(engines[1])
    read_horizon, expired = threading.Event(), threading.Event()
    reads: list[None] = []
    real = events_sql.events_by_receipt

    def after_the_horizon(connection: sa.Connection, pack_install_id: str, keys: Sequence[str]) -> Any:
        reads.append(None)
        if len(reads) == 1:  # the first attempt waits between its horizon read and its tombstone read
            read_horizon.set()
            assert expired.wait(DEADLINE)
        return real(connection, pack_install_id, keys)

    monkeypatch.setattr(events_sql, "events_by_receipt", after_the_horizon)
    answers: list[list[IngestResult]] = []
    redelivery = threading.Thread(target=lambda: answers.append(Connectors(engines[1]).ingest(pack, items=[old])))
    redelivery.start()
    assert read_horizon.wait(DEADLINE)
    report = retention.prune(Context.of(engines[0]), pack)[0]
    assert report.expired_receipts == 1 and report.horizon_source_time == old.source_time
    expired.set()
    redelivery.join(DEADLINE)
    assert len(reads) >= 2, "the admission was not made to decide again"
    assert [r.outcome for r in answers[0]] == [Outcome.EXPIRED]
    assert _count(engines[0], Event) == 1  # only the newest input: the duplicate was not admitted again
    assert_invariants(engines[0])
