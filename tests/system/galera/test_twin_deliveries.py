"""Twin deliveries across primaries: the same batch through two Galera nodes at once (issue 34).

Two source clients send the same batch at the same instant, each through a Connectors writing
through its own node. Admission reads a receipt's absence and then inserts it; the other
node's twin may commit in between, and the insert then meets a duplicate key (1062). That is
a conflict like any other: the transaction runs again and answers the duplicate. Neither call
may fail; each receipt is admitted exactly once, and the other delivery is acknowledged as
its duplicate.
"""

from __future__ import annotations

import random
import threading
from collections import Counter

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.settings import Settings
from nexuscrm_controlplane import fences
from nexuscrm_runtime.database import CONFLICTS, create_engine
from nexuscrm_schema.tables import AdmissionFence, Event, IngressReceipt
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants
from tests.support.waiting import wait_until
from workqueue.values import IngestItem, IngestResult, Outcome

pytestmark = pytest.mark.slow

ROUNDS = 300  # batches sent twice at once
# Seconds one twin starts after the other, drawn per round: at once, the two conflict at
# certification (1213); a few milliseconds apart, the second reads before the first commits
# and inserts after it (1062). Both must run again and answer duplicate.
STAGGER = (0.0, 0.02)
BATCH = 8  # deliveries per batch, over a few lanes
LANES = 3


def _conflicts_retried() -> float:
    return float(CONFLICTS.labels("admission", "retried")._value.get())


def _fences_seen(engine: sa.Engine, count: int) -> None:
    """Wait until ``engine``'s node applied the fences armed or disarmed through the other node."""

    def fences_now() -> bool:
        with engine.connect() as connection:  # a fresh snapshot per look
            return connection.execute(sa.select(sa.func.count()).select_from(AdmissionFence)).scalar_one() == count

    wait_until(fences_now, f"{count} fences on node 2")


def _send_twins(
    replicas: list[Connectors], pack: str, rounds: range, answers: list[IngestResult]
) -> list[BaseException]:
    """Send each round's batch through both replicas at once (the second up to STAGGER later)."""
    rng = random.Random(34 + rounds.start)
    errors: list[BaseException] = []
    for round_ in rounds:
        batch = [delivery(f"twin-{round_}-{n}", lane=f"lane-{n % LANES}") for n in range(BATCH)]
        start = threading.Barrier(2)
        delays = (0.0, rng.uniform(*STAGGER))

        def send(
            side: int,
            batch: list[IngestItem] = batch,
            start: threading.Barrier = start,
            delays: tuple[float, float] = delays,
        ) -> None:
            start.wait()
            threading.Event().wait(delays[side])
            try:
                answers.extend(replicas[side].ingest(pack, items=batch))
            except BaseException as error:  # counted and asserted: no call may fail
                errors.append(error)

        threads = [threading.Thread(target=send, args=(side,)) for side in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return errors


def _outcomes(answers: list[IngestResult]) -> dict[str, Counter[Outcome]]:
    outcomes: dict[str, Counter[Outcome]] = {}
    for result in answers:
        outcomes.setdefault(result.receipt_key, Counter())[result.outcome] += 1
    return outcomes


def test_twin_batches_through_two_nodes_are_stored_and_admitted_once(node_dsns: list[str]) -> None:
    """Half the rounds under an admission fence (receipts stored only), half admitted at once."""
    engines = [create_engine(dsn) for dsn in node_dsns[:2]]
    try:
        pack = install_pack(engines[0])
        settings = Settings()
        replicas = [Connectors(engine, settings) for engine in engines]
        retried_before = _conflicts_retried()

        fence = fences.arm_fence(engines[0], "acme", pack, reason="twin deliveries")
        _fences_seen(engines[1], 1)
        fenced: list[IngestResult] = []
        errors = _send_twins(replicas, pack, range(ROUNDS // 2), fenced)
        fences.disarm_fence(engines[0], fence.fence_id)
        _fences_seen(engines[1], 0)
        admitted: list[IngestResult] = []
        errors += _send_twins(replicas, pack, range(ROUNDS // 2, ROUNDS), admitted)
        while replicas[0].materialize():  # the receipts the fence held
            pass

        retried = _conflicts_retried() - retried_before
        stored, fresh = _outcomes(fenced), _outcomes(admitted)
        shapes = Counter(tuple(sorted((o.value, n) for o, n in c.items())) for c in (stored | fresh).values())
        print(f"galera twin deliveries: {ROUNDS} rounds x {BATCH}, admission retries {retried:g}, {dict(shapes)}")

        assert not errors, f"{len(errors)} twin calls failed: {errors[:3]!r}"
        assert len(stored) == len(fresh) == ROUNDS // 2 * BATCH
        for key, counted in stored.items():  # stored once; both answers say the fence holds it
            assert counted == Counter({Outcome.FENCED: 2}), (key, counted)
        for key, counted in fresh.items():  # D: admitted once, the twin acknowledged as its duplicate
            assert counted == Counter({Outcome.ADMITTED: 1, Outcome.DUPLICATE_COVERED: 1}), (key, counted)
        with engines[0].connect() as connection:
            connection.exec_driver_sql("SET SESSION wsrep_sync_wait = 1")  # read everything committed anywhere
            events = connection.execute(sa.select(sa.func.count()).select_from(Event)).scalar_one()
            receipts = connection.execute(sa.select(sa.func.count()).select_from(IngressReceipt)).scalar_one()
        assert events == receipts == ROUNDS * BATCH
        assert_invariants(engines[0])
    finally:
        for engine in engines:
            engine.dispose()
