"""Concurrent Ingest calls of one pack share admission transactions, on every backend."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from nexuscrm_connectors.facade import Connectors
from nexuscrm_schema.tables import Event, IngressReceipt, WorkItem
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants
from tests.support.waiting import wait_until
from workqueue.values import IngestResult, Outcome

pytestmark = pytest.mark.database

CALLERS = 6


def test_calls_waiting_behind_an_admission_are_admitted_together(
    engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    connectors = Connectors(engine)
    pack = install_pack(engine)
    entered, release = threading.Event(), threading.Event()
    admit = connectors.admission.admit_batch

    def first_admission_waits(*args: Any) -> dict[str, IngestResult]:
        if not entered.is_set():
            entered.set()
            release.wait(30)
        return admit(*args)

    monkeypatch.setattr(connectors.admission, "admit_batch", first_admission_waits)
    commits: list[None] = []
    event.listen(engine, "commit", lambda _conn: commits.append(None))
    answers: dict[int, list[IngestResult]] = {}

    def call(n: int) -> None:
        # Every caller sends two inputs of its own lane and one of a lane they all share; the
        # last two callers also repeat caller 1's first key (same payload).
        items = [delivery(f"c{n}-{i}", lane=f"lane-{n}") for i in range(2)] + [delivery(f"c{n}-s", lane="shared")]
        if n >= CALLERS - 2:
            items.append(delivery("c1-0", lane="lane-1"))
        answers[n] = connectors.ingest(pack, items=items)

    threads = [threading.Thread(target=call, args=(n,)) for n in range(CALLERS)]
    threads[0].start()
    assert entered.wait(30)
    for thread in threads[1:]:
        thread.start()
    groups = connectors.admission.groups
    wait_until(lambda: len(groups._waiting.get(pack, [])) == CALLERS - 1, "the other callers to queue")
    release.set()
    for thread in threads:
        thread.join(30)

    assert len(commits) == 2  # the first caller's transaction, then one for the five that waited
    for n in set(range(CALLERS)) - {1}:  # caller 1's first key may lose to a repeat that queued first
        assert [r.outcome for r in answers[n][:3]] == [Outcome.ADMITTED] * 3
    repeats = [answers[1][0]] + [answers[n][3] for n in range(CALLERS - 2, CALLERS)]
    assert sorted(r.outcome for r in repeats).count(Outcome.ADMITTED) == 1
    assert len({r.enqueue_ordinal for r in repeats}) == 1  # one input, one ordinal
    with engine.connect() as connection:
        events = connection.execute(sa.select(sa.func.count()).select_from(Event)).scalar_one()
        receipts = connection.execute(sa.select(sa.func.count()).select_from(IngressReceipt)).scalar_one()
        shared = connection.execute(
            sa.select(sa.func.count()).select_from(WorkItem).where(WorkItem.c.ProjectionKey.like("%shared%"))
        ).scalar_one()
    assert events == receipts == 3 * CALLERS  # D: the repeated key wrote nothing twice
    assert shared == 1  # the group extended the first caller's unclaimed generation of the shared lane
    assert_invariants(engine)
