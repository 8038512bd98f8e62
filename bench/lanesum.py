"""The workload both sides of the "peer" section run, and what its result must be.

Deliveries are the Integration simulator's walking workload (``simulator.workload``: 400 lanes,
bursts on single lanes, about 5 % duplicate deliveries), sent in its batches of 200 as fast as
they are admitted, or the same batches paced to a rate (the lag runs). With several concurrent
clients each runs a walking workload of its own over its share of the 400 lanes and of the
inputs (its own seed, receipt numbers and lanes), so each client re-sends only its own
deliveries. Both sides fold, per lane,
the sum of the inputs' values (``laneflow.input_value``: the receipt number) and their count.
The expected sums come from the distinct deliveries actually sent, so a lost, doubled or
misrouted input shows up as a wrong lane.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from bench.laneflow import input_value
from nexuscrm_tools import demo
from nexuscrm_tools.run import percentile
from nexuscrm_tools.simulator import Delivery, WorkloadConfig, lane_name, workload
from workqueue.values import IngestItem

LANES = 400  # source lanes of the simulator's walking workload
WORKERS = 4  # Flow workers (ours) and concurrent jobs (the peer)
SETTLE_TIMEOUT = 300.0  # seconds to wait for the last input to be projected
POLL_SECONDS = 0.05  # seconds between checks for the end of a run (the clock comes from the projection's times)

CLIENT_KEYS = 10**8  # receipt numbers per concurrent client: client c numbers from c x CLIENT_KEYS

# One batch to the side under test; returns a function that waits for the batch's answer and
# gives the number of its deliveries admitted as new inputs (a pipelined client answers later).
Ingest = Callable[[Sequence[IngestItem]], Callable[[], int]]


def answered(admitted: int) -> Callable[[], int]:
    """The answer of a batch already answered (a client that waits for each answer)."""
    return lambda: admitted


@dataclasses.dataclass(kw_only=True)
class Sent:
    """What was delivered: every distinct input's lane and value, and the delivery counts."""

    lane_sums: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)  # lane -> (sum, count)
    keys: set[str] = dataclasses.field(default_factory=set)
    deliveries: int = 0
    duplicates: int = 0
    batches: int = 0
    admitted: int = 0  # as the side under test answered
    started: float = 0.0  # epoch seconds: the first batch was made
    ingested: float = 0.0  # epoch seconds: the last batch was answered
    busy_at_start: float | None = None  # the machine's busy CPU-seconds when the first batch was made

    def add(self, batch: Iterable[Delivery]) -> None:
        """Count a batch; a receipt key seen before is a duplicate delivery."""
        self.batches += 1
        for delivery in batch:
            self.deliveries += 1
            key = delivery.item.receipt_key
            if key in self.keys:
                self.duplicates += 1
                continue
            self.keys.add(key)
            lane = delivery.item.route.source_lane
            total, count = self.lane_sums.get(lane, (0, 0))
            self.lane_sums[lane] = (total + input_value(key), count + 1)

    @property
    def distinct(self) -> int:
        """Distinct inputs delivered."""
        return len(self.keys)


def deliver(clients: Sequence[Ingest], inputs: int, rate: float) -> Sent:
    """Send the walking workload of ``inputs`` fresh deliveries through ``clients`` at once; return what was sent.

    Each client sends its own share (``client_batches``). ``rate`` 0 sends each batch as soon
    as the client's ingest returns; otherwise the same batches go out paced to ``rate``
    deliveries per second in all (only the gaps between batches change, so the lag runs do the
    same work per batch as the maximum-rate runs). Times are epoch seconds, the clock the
    projection's times are compared with; ``ingested`` is when the last batch was answered.
    """
    sent = Sent(started=time.time(), busy_at_start=machine_busy_seconds())
    counting = threading.Lock()

    def send(client: int) -> None:
        answers = []
        # Clients start a batch period apart, so that paced clients do not send in step.
        deliveries = client * WorkloadConfig(rate=0).batch_size / len(clients)

        def when_due() -> float:
            """The workload's clock: waits for the next batch's due time (paced runs), then reads the time."""
            if rate:
                # Due times from the start: a late batch is followed at once, so the mean rate holds.
                time.sleep(max(0.0, sent.started + deliveries * len(clients) / rate - time.time()))
            return time.time()

        for batch in client_batches(inputs, client, len(clients), clock=when_due):
            with counting:
                sent.add(batch)
            answers.append(clients[client]([d.item for d in batch]))
            deliveries += len(batch)
        admitted = sum(answer() for answer in answers)
        with counting:
            sent.admitted += admitted

    with ThreadPoolExecutor(max_workers=len(clients), thread_name_prefix="bench-client") as pool:
        for done in [pool.submit(send, client) for client in range(len(clients))]:
            done.result()
    sent.ingested = time.time()
    return sent


def client_batches(
    inputs: int, client: int, clients: int, *, clock: Callable[[], float] = time.time
) -> Iterator[list[Delivery]]:
    """Client ``client``'s batches of the walking workload shared by ``clients`` concurrent clients.

    One client sends the simulator's workload unchanged. Of several, client c gets a workload
    of its own seed over LANES / clients lanes and its share of the inputs, moved to lanes c,
    c + clients, c + 2 x clients ... and to receipt numbers from c x ``CLIENT_KEYS``. ``clock``
    is read as each batch is made (its deliveries' ``sent_at``).
    """
    share = inputs // clients + (client < inputs % clients)
    config = WorkloadConfig(lanes=LANES // clients, inputs=share, rate=0, seed=WorkloadConfig().seed + client)
    for batch in workload(config, clock):
        yield batch if clients == 1 else [_moved(delivery, client, clients) for delivery in batch]


def _moved(delivery: Delivery, client: int, clients: int) -> Delivery:
    lane = int(delivery.item.route.source_lane.removeprefix("lane-")) * clients + client
    item = dataclasses.replace(
        delivery.item,
        receipt_key=f"r-{client * CLIENT_KEYS + input_value(delivery.item.receipt_key):08d}",
        route=demo.route(lane_name(lane)),
    )
    return dataclasses.replace(delivery, item=item)


def machine_busy_seconds() -> float | None:
    """CPU-seconds every core of this machine has spent busy since boot (Linux's /proc/stat); None elsewhere.

    Busy is user, nice, system, irq and softirq: not idle, iowait, or steal (time the
    hypervisor gave another guest, which no process here spent). Machine-wide on purpose: each
    side's work is spread over processes the bench does not own (the database server, the
    services, the peer's workers), and on a machine with few cores the sum of them is what
    bounds the rate.
    """
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in stat.readline().split()[1:8])
    except OSError:
        return None
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def busy_since(sent: Sent) -> float | None:
    """The machine's busy CPU-seconds since ``sent``'s first batch (None without /proc/stat)."""
    now = machine_busy_seconds()
    return None if now is None or sent.busy_at_start is None else now - sent.busy_at_start


def wait_until(settled: Callable[[], bool], timeout: float = SETTLE_TIMEOUT) -> bool:
    """Poll ``settled`` until it is true or ``timeout`` seconds passed; return its last answer."""
    deadline = time.monotonic() + timeout
    while not settled():
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_SECONDS)
    return True


def sum_problems(sent: Sent, projected: Mapping[str, tuple[int, int]]) -> list[str]:
    """Every lane whose projected (sum, count) differs from the distinct deliveries' (empty: exact)."""
    problems = []
    for lane in sorted(set(sent.lane_sums) | set(projected)):
        want, got = sent.lane_sums.get(lane), projected.get(lane)
        if want != got:
            problems.append(f"lane {lane}: projected (sum, count) {got}, delivered {want}")
    return problems


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outcome:
    """One run of one side: throughput, executions, correctness and lag.

    ``seconds`` runs from the first delivery sent to the last input projected (the newest
    projection time the side recorded); ``ingest_seconds`` to the last batch answered.
    ``executions``: Flow executions (ours) or jobs run (the peer). ``cpu_seconds``: the
    machine's busy CPU-seconds from the first batch until the side had projected every input
    (``busy_since``; None where it cannot be read). ``problems`` is empty when the projection
    is exact and every delivery was admitted once; ``lags`` holds every input's delivery-sent
    to projected time, seconds.
    """

    side: str
    inputs: int
    deliveries: int
    duplicates: int
    seconds: float
    ingest_seconds: float
    executions: int
    cpu_seconds: float | None
    problems: tuple[str, ...]
    lags: tuple[float, ...]
    transactions: int  # ingest transactions: ours, admission transactions (groups); the peer's, its batches

    @property
    def rate(self) -> float:
        """Inputs projected per second."""
        return self.inputs / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_ms_per_input(self) -> float | None:
        """The machine's busy CPU-milliseconds per input projected (None where unmeasured)."""
        return 1000 * self.cpu_seconds / self.inputs if self.cpu_seconds is not None and self.inputs else None

    @property
    def transactions_per_second(self) -> float:
        """Ingest transactions per second of the ingest window."""
        return self.transactions / self.ingest_seconds if self.ingest_seconds > 0 else 0.0

    @property
    def deliveries_per_transaction(self) -> float:
        """Mean deliveries per ingest transaction."""
        return self.deliveries / self.transactions if self.transactions else 0.0

    @property
    def executions_per_input(self) -> float:
        """Flow executions (jobs) per input."""
        return self.executions / self.inputs if self.inputs else 0.0

    def correctness(self) -> str:
        """``exact`` or the first problems found."""
        if not self.problems:
            return (
                f"exact ({self.inputs} inputs from {self.deliveries} deliveries, "
                f"{self.duplicates} duplicates ignored, each admitted once)"
            )
        return f"{len(self.problems)} PROBLEMS: " + "; ".join(self.problems[:3])

    def lag(self) -> str:
        """``p50 x ms, p99 y ms``."""
        return (
            f"p50 {percentile(self.lags, 0.50) * 1000:,.0f} ms, p99 {percentile(self.lags, 0.99) * 1000:,.0f} ms "
            f"(n={len(self.lags)})"
        )


def median(values: Iterable[float]) -> float:
    """Median of ``values``."""
    return statistics.median(list(values))


def lanes_of(rows: Iterable[tuple[str, int, int]]) -> dict[str, tuple[int, int]]:
    """(lane, sum, count) rows as a mapping."""
    return {lane: (int(total), int(count)) for lane, total, count in rows}
