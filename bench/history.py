"""Section 2: history scaling. Does the cost follow the new generation or the retained history?

One pack accumulates retained history (completed one-input generations with their Events,
bulk-loaded) over the same 400 identities the measured operations use: 10^3, then 10^5, then
(full mode) 10^6 generations. At each size the same operations are timed: admission of a
batch, duplicate verification of a batch, one claim, and LoadInputs of a fixed-size
generation of an identity that has retained history. Between sizes every live generation is
completed, so each size starts from the same live state.
"""

from __future__ import annotations

import datetime as dt
import functools

from rich.progress import Progress, TaskID

from bench import seed
from bench.environment import Backend, Report, Timings, scratch_database, timed, verdict
from nexuscrm_connectors.facade import Connectors
from nexuscrm_runtime.database import create_engine
from tests.support.factories import install_pack, route
from workqueue.values import Claim, IngestItem, Outcome

BATCH = 500  # deliveries per admission batch
IDENTITIES = 400  # identities of the history and of the batches
GENERATION = 1000  # inputs of the generation LoadInputs reads
CLAIMS = 100  # timed single claims per size
LOADS = 10  # timed LoadInputs per size
TARGET = 1.3  # p50 at the largest size / p50 at 10^3
LEASE_SECONDS = 3600  # the claims outlive the measurements


def _fixed_generation(prefix: str) -> list[list[IngestItem]]:
    """``GENERATION`` deliveries of lane 0 in batches (one generation once admitted unclaimed)."""
    items = [
        IngestItem(receipt_key=f"{prefix}-{n}", route=route(seed.lane(0)), payload=seed.payload(f"{prefix}-{n}"))
        for n in range(GENERATION)
    ]
    return [items[n : n + BATCH] for n in range(0, GENERATION, BATCH)]


def _advance(progress: Progress, task: TaskID, base: int, loaded: int) -> None:
    progress.update(task, completed=base + loaded)


def _settle(connectors: Connectors, pack: str, held: list[Claim]) -> None:
    """Complete the held claims and then every other live generation of the pack (untimed)."""
    for claim in held:
        connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    while claims := connectors.claim("settle", pack_install_ids=[pack], max_items=100):
        for claim in claims:
            connectors.complete(claim.work.work_id, lease_token=claim.lease_token)


def _measure(connectors: Connectors, pack: str, size: int, batches: int) -> dict[str, Timings]:
    prefix = f"s{size}"
    admitted = [seed.batch(f"{prefix}-{n}", BATCH, IDENTITIES) for n in range(batches)]

    def ingest(items: list[IngestItem], expected: set[Outcome]) -> None:
        outcomes = {r.outcome for r in connectors.ingest(pack, items=items)}
        if not outcomes <= expected:
            raise RuntimeError(f"unexpected outcomes {outcomes - expected}")

    ingest(seed.batch(f"{prefix}-warm", BATCH, IDENTITIES), {Outcome.ADMITTED})  # untimed: warms caches
    admission = timed(functools.partial(ingest, b, {Outcome.ADMITTED}) for b in admitted)
    duplicates = timed(functools.partial(ingest, b, {Outcome.DUPLICATE_COVERED}) for b in admitted)
    held: list[Claim] = []
    claims = timed(
        lambda: held.extend(
            connectors.claim("bench", pack_install_ids=[pack], lease=dt.timedelta(seconds=LEASE_SECONDS))
        )
        for _ in range(CLAIMS)
    )
    _settle(connectors, pack, held)
    for part in _fixed_generation(f"{prefix}-fixed"):
        ingest(part, {Outcome.ADMITTED})
    (claim,) = connectors.claim("bench", pack_install_ids=[pack], lease=dt.timedelta(seconds=LEASE_SECONDS))
    if claim.work.lane_ordinal - (claim.work.input_start_ordinal or 0) + 1 != GENERATION:
        raise RuntimeError("the fixed-size generation did not coalesce as expected")

    def load() -> None:
        count = sum(
            len(page.inputs) for page in connectors.load_inputs(claim.work.work_id, lease_token=claim.lease_token)
        )
        if count != GENERATION:
            raise RuntimeError(f"LoadInputs streamed {count} inputs, expected {GENERATION}")

    loads = timed(load for _ in range(LOADS))
    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    return {
        "admission per batch": admission,
        "duplicate verification per batch": duplicates,
        "claim": claims,
        f"LoadInputs of {GENERATION} inputs": loads,
    }


def run(backend: Backend, report: Report, *, quick: bool) -> None:
    """Load history in steps and time the hot operations at each size."""
    sizes = (10**3, 10**5) if quick else (10**3, 10**5, 10**6)
    batches = 8 if quick else 20
    results: dict[int, dict[str, Timings]] = {}
    with scratch_database(backend) as dsn:
        engine = create_engine(dsn)
        try:
            pack = install_pack(engine)
            connectors = Connectors(engine)
            loaded = 0
            with Progress(transient=True) as progress:
                task = progress.add_task(f"history on {backend.name}", total=sizes[-1])
                for size in sizes:
                    seed.load_history(
                        engine,
                        pack,
                        size - loaded,
                        IDENTITIES,
                        progress=functools.partial(_advance, progress, task, loaded),
                    )
                    loaded = size
                    results[size] = _measure(connectors, pack, size, batches)
        finally:
            engine.dispose()
    section = "2 history"
    smallest, largest = sizes[0], sizes[-1]
    for operation in results[smallest]:
        for size in sizes:
            report.add(
                section, backend.name, f"{operation} at {size:.0e} generations", results[size][operation].describe()
            )
        ratio = results[largest][operation].p50 / results[smallest][operation].p50
        report.add(
            section,
            backend.name,
            f"{operation}: p50 at {largest:.0e} / p50 at {smallest:.0e}",
            f"{ratio:.2f}",
            f"<= {TARGET} {verdict(ratio <= TARGET)}",
        )
