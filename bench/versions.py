"""Section ``versions``: the live version's lag without a Flow version build and during one (issue 52, decision 185).

Each phase has a pack of its own with ``RETAINED`` completed inputs bulk-loaded on
``IDENTITIES`` lanes (``bench.seed.load_history``). Live work arrives at a fixed rate
(``RATE`` inputs a second on ``LIVE_LANES`` of them, a batch every ``TICK``, through
``Connectors.ingest``) and a live
worker thread claims (without versions), loads and completes it; an input's lag is from its
ingest call's answer to its generation's completion. A phase with a build first builds V2
over the retained inputs (the catch-up) and runs a build worker in a process of its own (a
pool of V2: ``claim(..., flow_versions=[V2])``, loads, completes) with the build's rate bound
``BUILD_RATE``: its claims yield to due live work (decision 185). Phases alternate without,
with, without, with, on one scratch database per backend; the ratio is with/without of the
summed phases. Also the build's inputs per second during the phase and how long the catch-up's
creation took (it holds the pack lock).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import statistics
import threading
import time
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event as ProcessEvent

import sqlalchemy as sa

from bench import seed
from bench.environment import Backend, Report, scratch_database
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.operating import flow_versions
from nexuscrm_runtime.database import create_engine
from tests.support.factories import install_pack

RETAINED = 100_000  # quick: 20 000
IDENTITIES = 200  # 500 retained inputs each: one catch-up generation per identity
RATE = 10  # live inputs per second
LIVE_LANES = 20  # the live inputs' lanes (of the retained identities)
TICK = 0.1  # seconds between live batches
PHASE_SECONDS = 30.0  # quick: 20; shorter than the bounded build takes, so a whole phase is during it
BUILD_RATE = 2000  # the build's bound, inputs per second
V2 = "crm-2.0"
SECTION = "versions"


@dataclasses.dataclass
class _Phase:
    lags: list[float] = dataclasses.field(default_factory=list)
    build_inputs: int = 0
    catch_up_seconds: float = 0.0


def _percentile(samples: list[float], share: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def _build_worker(dsn: str, pack: str, stop: ProcessEvent, done: Synchronized[int]) -> None:
    """A V2 pool in a process of its own: claim, load, complete until ``stop``; count the inputs run."""
    engine = create_engine(dsn)
    connectors = Connectors(engine)
    while not stop.is_set():
        claims = connectors.claim("build", pack_install_ids=[pack], flow_versions=[V2], max_items=1)
        if not claims:
            time.sleep(0.01)
            continue
        for claim in claims:
            ran = sum(
                len(page.inputs) for page in connectors.load_inputs(claim.work.work_id, lease_token=claim.lease_token)
            )
            connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
            with done.get_lock():
                done.value += ran
    engine.dispose()


def _live(connectors: Connectors, pack: str, admitted: dict[str, float], phase: _Phase, stop: threading.Event) -> None:
    """The live pool: claim without versions, load, complete; each member's lag from its admission."""
    while not stop.is_set():
        claims = connectors.claim("live", pack_install_ids=[pack], max_items=10)
        if not claims:
            time.sleep(0.005)
            continue
        for claim in claims:
            keys = [
                member.receipt_key
                for page in connectors.load_inputs(claim.work.work_id, lease_token=claim.lease_token)
                for member in page.inputs
            ]
            connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
            finished = time.monotonic()
            phase.lags.extend(finished - admitted[key] for key in keys if key is not None)


def _phase(dsn: str, engine: sa.Engine, retained: int, seconds: float, *, build: bool) -> _Phase:
    connectors = Connectors(engine)
    pack = install_pack(engine)
    seed.load_history(engine, pack, retained, IDENTITIES)
    phase = _Phase()
    stop_build = multiprocessing.get_context("spawn").Event()
    built = multiprocessing.get_context("spawn").Value("q", 0)
    worker = None
    if build:
        started = time.perf_counter()
        flow_versions.build(
            connectors.context,
            pack,
            "project",
            V2,
            from_retained=False,
            max_inputs_per_second=BUILD_RATE,
            started_by="bench",
            reason="bench",
        )
        phase.catch_up_seconds = time.perf_counter() - started
        worker = multiprocessing.get_context("spawn").Process(target=_build_worker, args=(dsn, pack, stop_build, built))
        worker.start()
    admitted: dict[str, float] = {}
    stop_live = threading.Event()
    live = threading.Thread(target=_live, args=(connectors, pack, admitted, phase, stop_live))
    live.start()
    per_tick = max(1, round(RATE * TICK))
    begun = time.monotonic()
    n = 0
    while time.monotonic() - begun < seconds:
        items = seed.batch(f"live-{n}", per_tick, LIVE_LANES, offset=n * per_tick)
        connectors.ingest(pack, items=items)
        answered = time.monotonic()
        admitted.update(dict.fromkeys((item.receipt_key for item in items), answered))
        n += 1
        time.sleep(max(0.0, begun + n * TICK - time.monotonic()))
    elapsed = time.monotonic() - begun
    while len(phase.lags) < n * per_tick and time.monotonic() - begun < seconds + 30:
        time.sleep(0.05)  # the last live inputs complete
    stop_live.set()
    live.join()
    if worker is not None:
        stop_build.set()
        worker.join()
        phase.build_inputs = int(built.value)
    phase.build_inputs = round(phase.build_inputs / elapsed)  # per second
    return phase


def run(backend: Backend, report: Report, *, quick: bool) -> None:
    """Alternate without/with a build twice; report each lag and the ratios."""
    retained = 20_000 if quick else RETAINED
    seconds = 20.0 if quick else PHASE_SECONDS
    phases: dict[bool, list[_Phase]] = {False: [], True: []}
    with scratch_database(backend) as dsn:
        engine = create_engine(dsn)
        try:
            for build in (False, True, False, True):
                phase = _phase(dsn, engine, retained, seconds, build=build)
                phases[build].append(phase)
                name = f"with a build of {retained} retained inputs" if build else "without a build"
                extra = (
                    f"; build {phase.build_inputs} inputs/s, catch-up created in {phase.catch_up_seconds:.1f} s"
                    if build
                    else ""
                )
                report.add(
                    SECTION,
                    backend.name,
                    f"live lag at {RATE} inputs/s, {name}",
                    f"p50 {statistics.median(phase.lags) * 1000:.0f} ms, "
                    f"p99 {_percentile(phase.lags, 0.99) * 1000:.0f} ms (n={len(phase.lags)}){extra}",
                )
        finally:
            engine.dispose()
    without = [lag for phase in phases[False] for lag in phase.lags]
    with_build = [lag for phase in phases[True] for lag in phase.lags]
    rate = statistics.mean(phase.build_inputs for phase in phases[True])
    report.add(
        SECTION,
        backend.name,
        f"live lag with/without a build of {retained} (bound {BUILD_RATE}/s)",
        f"p99 x{_percentile(with_build, 0.99) / _percentile(without, 0.99):.2f}, "
        f"p50 x{statistics.median(with_build) / statistics.median(without):.2f}; build {rate:.0f} inputs/s",
    )
