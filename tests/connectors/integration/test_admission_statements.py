"""Admission runs a constant number of statements and one commit per Ingest call (docs/performance.md).

The count is independent of the batch's size, of its number of identities and of its number
of duplicates: every per-delivery and per-identity step is one statement for the whole batch.
Counted in round trips on the engine (``tests/support/statements.py``, which sees executemany), never timed.
"""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from nexuscrm_schema.tables import RetentionPolicy
from tests.support.factories import FakeClock, delivery, install_pack
from tests.support.invariants import assert_invariants
from tests.support.statements import Capture, capture
from workqueue.values import IngestItem, Outcome

pytestmark = pytest.mark.database

# The most statements one Ingest call may run: pack lock, fence check with the protocol row
# (decision 140), receipts, Events of the keys with their identities' newest generations
# (decision 132), covering seeks of older inputs, ordinals, Events, their payloads
# (EventPayload, decision 126), newest seek, newest lock, extension, new generations, receipts
# of the new Events, new receipts of duplicates, two receipt verdict updates.
ADMISSION_STATEMENT_BOUND = 16
SIZES = (4, 400)  # deliveries per batch: two per identity


def _batch(prefix: str, size: int, lanes: str) -> list[IngestItem]:
    return [delivery(f"{prefix}-{n}", lane=f"{lanes}-{n // 2}") for n in range(size)]


def _shapes(connectors: Connectors, pack: str, size: int) -> dict[str, tuple[Capture, list[Outcome]]]:
    """Ingest one batch of each shape on lanes of its own; what each call ran and answered."""
    lanes = f"lane-{size}"
    first = _batch(f"first-{size}", size, lanes)
    again = _batch(f"again-{size}", size, lanes)
    shapes = {
        "fresh inputs on new identities": first,
        "fresh inputs extending known generations": again,
        "half duplicates": first[: size // 2] + _batch(f"half-{size}", size // 2, lanes),
        "only duplicates": again,
    }
    seen = {}
    for shape, items in shapes.items():
        with capture(connectors.engine) as captured:
            results = connectors.ingest(pack, items=items)
        seen[shape] = (captured, [r.outcome for r in results])
    return seen


def test_ingest_statements_do_not_grow_with_batch_size_or_duplicates(engine: sa.Engine) -> None:
    connectors = Connectors(engine)
    pack = install_pack(engine)
    small, large = (_shapes(connectors, pack, size) for size in SIZES)
    for shape, (captured, _) in large.items():
        few, many = small[shape][0].round_trips(), captured.round_trips()
        assert many == few, f"{shape}: {len(few)} -> {len(many)}"
        assert len(many) <= ADMISSION_STATEMENT_BOUND, (shape, many)
        assert captured.commits == 1, f"{shape}: one transaction per Ingest call"
    expected = {
        "fresh inputs on new identities": {Outcome.ADMITTED},
        "fresh inputs extending known generations": {Outcome.ADMITTED},
        "half duplicates": {Outcome.ADMITTED, Outcome.DUPLICATE_COVERED},
        "only duplicates": {Outcome.DUPLICATE_COVERED},
    }
    assert {shape: set(outcomes) for shape, (_, outcomes) in large.items()} == expected
    # D: duplicates wrote no Event or WorkItem; M, O, B, X, P on the final database.
    assert_invariants(engine)


def test_duplicates_of_older_generations_cost_one_statement(engine: sa.Engine) -> None:
    """Duplicates of inputs older than their identity's newest generation: one statement more, whatever their number."""
    connectors = Connectors(engine)
    pack = install_pack(engine)
    counts: dict[int, list[str]] = {}
    for size in SIZES:
        first = _batch(f"older-{size}", size, f"older-{size}")
        admitted = connectors.ingest(pack, items=first)
        claimed = 0
        while claims := connectors.claim("w", pack_install_ids=[pack], max_items=100):
            claimed += len(claims)
        assert claimed == size // 2  # every generation of the batch is processing: the next ones succeed them
        assert {r.outcome for r in connectors.ingest(pack, items=_batch(f"newer-{size}", size, f"older-{size}"))} == {
            Outcome.ADMITTED
        }
        with capture(engine) as captured:
            again = connectors.ingest(pack, items=first)
        counts[size] = captured.round_trips()
        assert [(r.outcome, r.work_id) for r in again] == [(Outcome.DUPLICATE_COVERED, r.work_id) for r in admitted]
        assert captured.commits == 1
    small, large = (counts[size] for size in SIZES)
    assert small == large and len(large) <= ADMISSION_STATEMENT_BOUND, large
    assert_invariants(engine)


def test_the_duplicate_window_adds_no_statement(engine: sa.Engine, clock: FakeClock) -> None:
    """A pack with a window and a horizon: expired, admitted and duplicate deliveries cost what they cost before."""
    connectors = Connectors(engine, clock=clock)
    plain, windowed = install_pack(engine), install_pack(engine)
    connectors.set_retention_policy(windowed, keep_generations=1, keep_seconds=None, duplicate_window_seconds=60)
    with engine.connect() as connection:
        now = clock.read(connection)
    horizon = now - dt.timedelta(seconds=120)
    with engine.begin() as connection:  # as an expiry would leave it
        connection.execute(
            sa.update(RetentionPolicy)
            .where(RetentionPolicy.c.PackInstallId == windowed)
            .values(HorizonSourceTime=horizon)
        )
    counts: dict[tuple[str, int], list[str]] = {}
    for pack in (plain, windowed):
        for size in SIZES:
            items = [
                delivery(f"{pack}-{size}-{n}", lane=f"w-{size}-{n // 2}", source_time=horizon if n % 2 else now)
                for n in range(size)
            ]
            with capture(engine) as captured:
                results = connectors.ingest(pack, items=items)
            counts[(pack, size)] = captured.round_trips()
            admitted = {Outcome.ADMITTED} if pack == plain else {Outcome.ADMITTED, Outcome.EXPIRED}
            assert {r.outcome for r in results} == admitted
    assert counts[(windowed, SIZES[0])] == counts[(windowed, SIZES[1])] == counts[(plain, SIZES[1])]
    assert_invariants(engine)
