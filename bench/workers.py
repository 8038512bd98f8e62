"""Sections 4 and 5: the walking workload end to end, and claims per second and statements per claim.

Workers are threads running the in-process ``Worker`` with a no-op Flow (it reads every input
and records its ordinals). The workload is the Integration simulator's walking workload
(400 lanes, bursts, 5 % duplicates), sent as fast as it is admitted while the workers run.
Coalescing off means one WorkItem per Event: the same deliveries are sent in sub-batches with
at most one delivery per identity, and admission is not allowed to extend an unclaimed
generation (``admission._extendable`` patched to refuse, for this measurement only), so
every Event starts a generation of its own.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime as dt
import itertools
import os
import threading
import time
import uuid
from collections.abc import Iterator
from unittest import mock

import sqlalchemy as sa

from bench import seed
from bench.environment import Backend, Report, scratch_database
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.queue import admission
from nexuscrm_runtime.database import create_engine
from nexuscrm_schema.tables import Event, WorkItem
from nexuscrm_sdk.flows import Generation
from nexuscrm_sdk.worker import Worker
from nexuscrm_tools.simulator import WorkloadConfig, workload
from tests.support.factories import install_pack
from tests.support.invariants import check_invariants
from tests.support.statements import capture
from workqueue import WorkStatus
from workqueue.values import IngestItem

WORKER_COUNTS = (1, 4, 16)
POLL_INTERVAL = dt.timedelta(milliseconds=100)  # between empty claims of an idle worker
CLAIM_GENERATIONS = 2000  # pending generations the claim benchmark drains
CLAIM_BATCH = 8  # max_items of the batched claim runs


@dataclasses.dataclass
class _Recorder:
    """The no-op Flow: reads every input and counts how often each input was executed."""

    seen: collections.Counter[tuple[str, int]] = dataclasses.field(default_factory=collections.Counter)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def __call__(self, generation: Generation) -> None:
        ordinals = [row.enqueue_ordinal for row in generation.inputs]
        with self.lock:
            self.seen.update((generation.work.pack_install_id, o) for o in ordinals)


def _unbatched(batches: Iterator[list[IngestItem]]) -> Iterator[list[IngestItem]]:
    """Split each batch into sub-batches holding at most one delivery per identity."""
    for items in batches:
        pending = list(items)
        while pending:
            seen: set[str] = set()
            part: list[IngestItem] = []
            rest: list[IngestItem] = []
            for item in pending:
                (rest if item.route.source_lane in seen else part).append(item)
                seen.add(item.route.source_lane)
            yield part
            pending = rest


@contextlib.contextmanager
def _coalescing(enabled: bool) -> Iterator[None]:
    if enabled:
        yield
        return
    with mock.patch.object(admission, "_extendable", lambda _row: False):
        yield


def _all_done(engine: sa.Engine) -> bool:
    with engine.connect() as connection:
        live = connection.execute(
            sa.select(sa.func.count())
            .select_from(WorkItem)
            .where(WorkItem.c.Status.not_in([WorkStatus.COMPLETED, WorkStatus.FAILED]))
        ).scalar_one()
    return int(live) == 0


def _walk(dsn: str, workers: int, inputs: int, *, coalescing: bool) -> dict[str, float]:
    engine = create_engine(dsn, pool_size=workers + 4)
    try:
        pack = install_pack(engine)
        connectors = Connectors(engine)
        recorder = _Recorder()
        pool = [
            Worker(connectors, recorder, worker_id=f"w{n}", pack_install_ids=[pack], poll_interval=POLL_INTERVAL)
            for n in range(workers)
        ]
        config = WorkloadConfig(lanes=400, inputs=inputs, rate=0)
        batches: Iterator[list[IngestItem]] = ([d.item for d in b] for b in workload(config))
        with _coalescing(coalescing):
            started = time.perf_counter()
            for worker in pool:
                worker.start()
            for items in batches if coalescing else _unbatched(batches):
                connectors.ingest(pack, items=items)
            while not _all_done(engine):
                time.sleep(0.05)
            elapsed = time.perf_counter() - started
            for worker in pool:
                worker.run_until_drained(timeout=30)
        with engine.connect() as connection:
            events = int(connection.execute(sa.select(sa.func.count()).select_from(Event)).scalar_one())
        executions = sum(w.stats.executions for w in pool)
        return {
            "inputs/s": events / elapsed,
            "executions per input": executions / events,
            "inputs admitted": events,
            "sum of memberships": sum(recorder.seen.values()),
            "executed twice": sum(1 for n in recorder.seen.values() if n > 1),
            "invariant violations": len(check_invariants(engine)),
        }
    finally:
        engine.dispose()


def run_workload(backend: Backend, report: Report, *, quick: bool) -> None:
    """The walking workload with 1, 4 and 16 workers, coalescing on and off."""
    inputs = 150 if quick else 4000
    section = "4 workload"
    for workers in WORKER_COUNTS:
        figures = {}
        for coalescing in (True, False):
            with scratch_database(backend) as dsn:
                figures[coalescing] = _walk(dsn, workers, inputs, coalescing=coalescing)
        on, off = figures[True], figures[False]
        for name, values in (("coalescing on", on), ("coalescing off (1 WorkItem per Event)", off)):
            report.add(
                section,
                backend.name,
                f"{workers} workers, {name}",
                f"{values['inputs/s']:,.0f} inputs/s, {values['executions per input']:.3f} executions/input; "
                f"admitted {values['inputs admitted']:.0f} = memberships {values['sum of memberships']:.0f}, "
                f"executed twice {values['executed twice']:.0f}, invariant violations (orphans) "
                f"{values['invariant violations']:.0f}",
            )
        report.add(
            section,
            backend.name,
            f"{workers} workers: inputs/s coalescing on / off",
            f"{on['inputs/s'] / off['inputs/s']:.2f}",
        )


@dataclasses.dataclass
class _Claimer:
    """One claiming thread's tally."""

    claimed: list[str] = dataclasses.field(default_factory=list)
    calls: int = 0  # Claim calls, the last (empty) one included


def _claim_all(connectors: Connectors, pack: str, worker_id: str, max_items: int, tally: _Claimer) -> None:
    while True:
        claims = connectors.claim(worker_id, pack_install_ids=[pack], max_items=max_items)
        tally.calls += 1
        if not claims:
            return
        tally.claimed.extend(c.work.work_id for c in claims)


def _claimer_counts() -> tuple[int, ...]:
    """1 / 4 / 16 claimers, and as many as the machine has cores."""
    return tuple(sorted({*WORKER_COUNTS, os.cpu_count() or 1}))


def _claims_run(backend: Backend, claimers: int, max_items: int, generations: int) -> dict[str, float]:
    """Claim ``generations`` pending generations with ``claimers`` threads; count claims, calls and statements."""
    with scratch_database(backend) as dsn:
        engine = create_engine(dsn, pool_size=claimers + 2)
        try:
            pack = install_pack(engine)
            connectors = Connectors(engine)
            items = seed.batch(f"c-{uuid.uuid4().hex[:6]}", generations, generations)
            for start in range(0, generations, 500):
                connectors.ingest(pack, items=items[start : start + 500])
            tallies = [_Claimer() for _ in range(claimers)]
            threads = [
                threading.Thread(target=_claim_all, args=(connectors, pack, f"w{n}", max_items, tallies[n]))
                for n in range(claimers)
            ]
            with capture(engine) as captured:
                started = time.perf_counter()
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                elapsed = time.perf_counter() - started
        finally:
            engine.dispose()
    every = list(itertools.chain.from_iterable(t.claimed for t in tallies))
    executed = len(captured.round_trips())
    return {
        "claims/s": len(set(every)) / elapsed,
        "claimed": len(set(every)),
        "double claims": len(every) - len(set(every)),
        "statements per call": executed / sum(t.calls for t in tallies),
        "statements per claim": executed / max(1, len(every)),
    }


def run_claims(backend: Backend, report: Report, *, quick: bool) -> None:
    """Claims per second with 1, 4, 16 (and core-count) concurrent claimers, statements per claim, double claims.

    Claimers run ``max_items`` 1 (a claim per call) and ``CLAIM_BATCH`` (a worker's batch).
    """
    generations = CLAIM_GENERATIONS // (8 if quick else 1)
    section = "5 claims"
    for max_items in (1, CLAIM_BATCH):
        rates = {}
        for claimers in _claimer_counts():
            figures = _claims_run(backend, claimers, max_items, generations)
            rates[claimers] = figures["claims/s"]
            complete = figures["double claims"] == 0 and figures["claimed"] == generations
            report.add(
                section,
                backend.name,
                f"{claimers} claimers, max_items {max_items}, over {generations} pending generations",
                f"{figures['claims/s']:,.0f} claims/s, {figures['statements per call']:.1f} statements per Claim "
                f"call, {figures['statements per claim']:.2f} per claimed generation; claimed "
                f"{figures['claimed']:.0f}, double claims {figures['double claims']:.0f}",
                "0 double claims " + ("met" if complete else "MISSED"),
            )
        for claimers in _claimer_counts()[1:]:
            report.add(
                section,
                backend.name,
                f"claims/s {claimers} / 1 claimers, max_items {max_items}",
                f"{rates[claimers] / rates[1]:.2f}",
            )
