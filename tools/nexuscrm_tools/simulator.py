"""A source simulator: many source lanes delivering contact updates to Connectors.

The workload *walks*: a window of active lanes moves one lane per tick around all lanes, so
every lane goes quiet and busy again; now and then a *burst* sends many updates to one lane
(which admission coalesces into few generations); and about ``duplicate_ratio`` of deliveries
re-send an earlier delivery unchanged (same receipt key and payload), as at-least-once
sources do. Batches are paced to ``rate`` deliveries per second and sent through the SDK's
``PipelinedIngest`` (several in flight, answered in order, retried as it documents).
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import functools
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future

from nexuscrm_sdk.pipeline import Ingestor, PipelinedIngest
from nexuscrm_tools import demo
from workqueue.values import IngestItem, IngestResult, Outcome

HISTORY = 2000  # recent deliveries a duplicate may repeat
NAMES = ("Ada", "Grace", "Linus", "Barbara", "Ken", "Margaret", "Dennis", "Frances", "Edsger", "Radia")
COMPANIES = ("Initech", "Globex", "Umbrella", "Hooli", "Stark", "Wayne", "Acme", "Tyrell")
STAGES = ("lead", "qualified", "customer", "churned")


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkloadConfig:
    """The simulated sources.

    ``lanes``: source lanes (one projection identity each). ``inputs``: fresh deliveries in
    total (duplicates come on top). ``rate``: deliveries per second (0: as fast as admitted).
    ``duplicate_ratio``: share of deliveries that repeat an earlier one. ``window``: lanes
    active at once. ``burst_chance``: chance per tick of a burst of ``burst_size`` updates to
    one lane. ``contacts_per_lane``: distinct contacts per lane. ``tick_seconds``: batch period.
    """

    lanes: int = 400
    inputs: int = 6000
    rate: float = 200.0
    duplicate_ratio: float = 0.05
    window: int = 40
    burst_chance: float = 0.04
    burst_size: int = 40
    contacts_per_lane: int = 4
    tick_seconds: float = 0.1
    seed: int = 20260301

    def __post_init__(self) -> None:
        if self.lanes < 1 or self.inputs < 0 or self.rate < 0 or self.window < 1 or self.contacts_per_lane < 1:
            raise ValueError("lanes, window and contacts_per_lane must be positive; inputs and rate not negative")
        if not 0 <= self.duplicate_ratio < 1 or not 0 <= self.burst_chance <= 1:
            raise ValueError("duplicate_ratio must be in [0, 1) and burst_chance in [0, 1]")

    @property
    def batch_size(self) -> int:
        """Deliveries per tick."""
        return max(1, round(self.rate * self.tick_seconds)) if self.rate else 200


@dataclasses.dataclass(frozen=True, kw_only=True)
class Delivery:
    """One delivery and whether it repeats an earlier one."""

    item: IngestItem
    duplicate: bool


def lane_name(index: int) -> str:
    """The source lane of index ``index``."""
    return f"lane-{index:04d}"


def workload(config: WorkloadConfig, clock: Callable[[], float] = time.time) -> Iterator[list[Delivery]]:
    """Batches of deliveries, one per tick, until ``config.inputs`` fresh ones were produced.

    Deterministic for a seed, except ``sent_at`` (read from ``clock`` as each batch is made,
    so lag is measured from just before sending).
    """
    rng = random.Random(config.seed)
    history: collections.deque[IngestItem] = collections.deque(maxlen=HISTORY)
    fresh = 0
    tick = 0
    while fresh < config.inputs:
        now = clock()
        position = tick % config.lanes
        lanes = [(position + rng.randrange(config.window)) % config.lanes for _ in range(config.batch_size)]
        if rng.random() < config.burst_chance:
            lanes += [(position + rng.randrange(config.window)) % config.lanes] * config.burst_size
        batch: list[Delivery] = []
        for lane in lanes:
            if history and rng.random() < config.duplicate_ratio:
                batch.append(Delivery(item=rng.choice(history), duplicate=True))
                continue
            if fresh == config.inputs:
                break
            fresh += 1
            update = demo.ContactUpdate(
                contact_id=f"{lane_name(lane)}/c-{rng.randrange(config.contacts_per_lane)}",
                fields=_fields(rng),
                sent_at=now,
            )
            item = IngestItem(
                receipt_key=f"r-{fresh:08d}",
                route=demo.route(lane_name(lane)),
                payload=update.encode(),
                source_time=dt.datetime.fromtimestamp(now, dt.UTC),  # the ledger's lag starts here
            )
            batch.append(Delivery(item=item, duplicate=False))
        history.extend(d.item for d in batch if not d.duplicate)
        tick += 1
        yield batch


def _fields(rng: random.Random) -> dict[str, str]:
    """A partial update: one to all fields, so the projection must merge them."""
    values = {
        "name": f"{rng.choice(NAMES)} {rng.randrange(1000)}",
        "email": f"user{rng.randrange(100000)}@example.com",
        "company": rng.choice(COMPANIES),
        "stage": rng.choice(STAGES),
    }
    chosen = rng.sample(sorted(values), rng.randint(1, len(values)))
    return {name: values[name] for name in chosen}


@dataclasses.dataclass(kw_only=True)
class SimulatorStats:
    """What the simulator sent and what Connectors answered, per outcome."""

    fresh_sent: int = 0
    duplicates_sent: int = 0
    outcomes: collections.Counter[Outcome] = dataclasses.field(default_factory=collections.Counter)
    done: bool = False

    @property
    def admitted(self) -> int:
        """Deliveries admitted as new Events."""
        return self.outcomes[Outcome.ADMITTED]

    @property
    def duplicates_acknowledged(self) -> int:
        """Duplicates acknowledged without new work (covered, below the legacy cutoff, pruned or expired)."""
        return sum(
            self.outcomes[o]
            for o in (Outcome.DUPLICATE_COVERED, Outcome.DUPLICATE_LEGACY, Outcome.DUPLICATE_PRUNED, Outcome.EXPIRED)
        )


class Simulator:
    """Sends ``workload(config)`` to one pack through an ``Ingestor`` until done or ``stop`` is set.

    Up to ``in_flight`` batches are unanswered at once (``PipelinedIngest``). The default is 1,
    one after the other: the demo's projection folds each lane in the order it was sent, and
    batches in flight together may be admitted in either order. A batch that
    still fails after the pipeline's retries ends the run with its error.
    """

    def __init__(
        self,
        ingestor: Ingestor,
        pack_install_id: str,
        config: WorkloadConfig,
        stop: threading.Event,
        *,
        in_flight: int = 1,
    ) -> None:
        self._ingestor = ingestor
        self._pack = pack_install_id
        self._config = config
        self._stop = stop
        self._in_flight = in_flight
        self._failed = threading.Event()  # a batch failed for good: send no more
        self.stats = SimulatorStats()

    def run(self) -> SimulatorStats:
        """Send every batch on schedule; ``stats`` is updated as each batch is answered, in order."""
        start = time.monotonic()
        futures: list[Future[list[IngestResult]]] = []
        try:
            with PipelinedIngest(
                self._ingestor, self._pack, max_in_flight=self._in_flight, wait=self._stop.wait
            ) as pipeline:
                for index, batch in enumerate(workload(self._config)):
                    if self._stop.is_set() or self._failed.is_set():
                        break
                    future = pipeline.submit([d.item for d in batch])
                    future.add_done_callback(functools.partial(self._count, batch))
                    futures.append(future)
                    if self._config.rate:
                        due = start + (index + 1) * self._config.tick_seconds
                        self._stop.wait(max(0.0, due - time.monotonic()))
            for future in futures:
                future.result()  # the first failed batch's error
        finally:
            self.stats.done = True
        return self.stats

    def _count(self, batch: list[Delivery], answered: Future[list[IngestResult]]) -> None:
        if answered.exception() is not None:
            self._failed.set()
            return
        for result in answered.result():
            self.stats.outcomes[result.outcome] += 1
        self.stats.fresh_sent += sum(not d.duplicate for d in batch)
        self.stats.duplicates_sent += sum(d.duplicate for d in batch)
