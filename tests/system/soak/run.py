"""The soak (issue 53 item 3, decision 182): ``make soak``, an hour of load with nothing growing.

``python -m tests.system.soak.run --minutes 60 --backend mariadb|sqlite`` (``make soak
SOAK_MINUTES=5 SOAK_BACKEND=sqlite``). On a fresh database (``bench.environment``: a new
database on NEXUSCRM_TIDB_DSN's server, or a SQLite file), Connectors replicas (two on
MariaDB, one on SQLite: the embedded backend is one process) and:

1. a calibration: for ``CALIBRATION`` seconds the clients ingest as fast as they can while
   the workers drain; the maximum rate is the lower of inputs acknowledged and inputs
   completed per second;
2. the soak at half that rate, with a retention policy on the pack (the newest generation of
   each lane kept, the others pruned after ``keep`` seconds (a twentieth of the run, 15 s at
   least), tombstones expired after four times that, so the tables level off within the warm-up),
   one batch in ten sent again (a duplicate), one attempt in fifty failed (with two attempts
   some generations become dead letters), a dead letter replayed every sample, and
   a rolling restart of one replica every sixth of the run (ten minutes in an hour);
3. a sample per process every ``interval`` (a minute in an hour, ten seconds at least):
   resident memory, open files and database connections of each replica, the rows of every
   table, the oldest waiting input's age (lag) and the backlog. Every input acknowledged since
   the sample before is looked up: it must have its receipt or its tombstone (not lost);
4. the drain, the invariant checker, and the verdict of ``tests.system.soak.growth`` on each
   series: the run fails when a fitted slope exceeds its allowance, when an acknowledged
   input is lost or an input refused, or when an RPC is answered INTERNAL.

The per-sample table and a summary go to stdout; ``--figures PATH`` appends the summary as
one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import functools
import itertools
import json
import os
import random
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import grpc
import sqlalchemy as sa

from bench.environment import Backend, scratch_database
from nexuscrm_runtime.clock import utcnow
from nexuscrm_runtime.database import create_engine, is_sqlite, normalize_dsn
from nexuscrm_schema.tables import IngressReceipt, PrunedReceipt, metadata
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_tools.launcher import CONNECTORS, ServiceProcess, start_service, start_services, stop_services
from tests.support.factories import install_pack, route
from tests.support.invariants import check_invariants
from tests.system.reliability.workload import WORKLOAD_ENV, guarded_thread, loaded_ordinals
from tests.system.soak.growth import Allowance, Growth, verdict
from workqueue import WorkStatus
from workqueue.values import ACKNOWLEDGED_OUTCOMES, IngestItem, Outcome

T = TypeVar("T")

CALIBRATION = 20.0  # seconds at full speed to measure the maximum rate
CLIENTS, WORKERS, LANES, BATCH = 2, 3, 50, 5
DUPLICATE_SHARE = 0.1  # batches sent again once acknowledged
FAILURE_SHARE = 0.02  # attempts a worker fails
LEASE = dt.timedelta(seconds=10)
CALL_TIMEOUT = dt.timedelta(seconds=30)
RETRY_PAUSE = 0.2  # seconds before a refused or cut-off call is tried again
DRAIN = dt.timedelta(minutes=2)
SERVICE_ENV = {**WORKLOAD_ENV, "NEXUSCRM_MAX_ATTEMPTS": "2", "NEXUSCRM_MATERIALIZE_INTERVAL_SECONDS": "2"}
# What each resource may gain per hour and still count as bounded (tests.system.soak.growth).
ALLOWANCES = {
    "rss_mb": Allowance(per_hour=32.0, of_level=0.10),
    "open_files": Allowance(per_hour=16.0),
    "db_connections": Allowance(per_hour=8.0),
    "rows:": Allowance(per_hour=500.0, of_level=0.25),
    "lag_seconds": Allowance(per_hour=60.0),
    "backlog": Allowance(per_hour=200.0, of_level=0.25),
}


@dataclasses.dataclass(frozen=True)
class Plan:
    """The run's durations, scaled from ``minutes``."""

    minutes: float

    @property
    def seconds(self) -> float:
        return self.minutes * 60

    @property
    def interval(self) -> float:
        """Seconds between samples: a minute in an hour, ten seconds at least."""
        return max(10.0, self.seconds / 60)

    @property
    def restart_every(self) -> float:
        """Seconds between rolling restarts: ten minutes in an hour."""
        return self.seconds / 6

    @property
    def keep_seconds(self) -> int:
        """How long retention keeps a terminal generation that is not its lane's newest."""
        return max(15, int(self.seconds / 20))


class Soak:
    """Replicas on one database, the load beside them, and the samples."""

    def __init__(self, dsn: str, workdir: Path, plan: Plan) -> None:
        self.dsn = dsn
        self.plan = plan
        self.workdir = workdir
        self.engine = create_engine(dsn)
        self.pack = install_pack(self.engine)
        self.replicas: list[ServiceProcess] = []
        for n in range(1 if is_sqlite(self.engine) else 2):
            self.replicas += start_services(
                [CONNECTORS], env={"NEXUSCRM_DSN": dsn, **SERVICE_ENV}, workdir=workdir / f"replica{n + 1}"
            )
        self.stop = threading.Event()
        self.rate: float | None = None  # inputs per second of all clients; None: as fast as they can
        self.phase = "calibration"  # in every receipt key: the soak's keys are new, not the calibration's
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.acknowledged: list[str] = []  # since the last sample
        self.errors: list[BaseException] = []

    @contextlib.contextmanager
    def client(self, n: int) -> Iterator[ConnectorsClient]:
        """A client of replica ``n`` (modulo the replicas); its port survives the replica's restarts."""
        with grpc.insecure_channel(self.replicas[n % len(self.replicas)].address) as channel:
            yield ConnectorsClient(channel, timeout=CALL_TIMEOUT)

    def call(self, f: Callable[[], T]) -> T | None:
        """``f()``, its status counted; None when it was refused or cut off."""
        try:
            result = f()
        except grpc.RpcError as error:
            self.count(f"rpc:{error.code().name}")
            return None
        self.count("rpc:OK")
        return result

    def count(self, name: str, n: int = 1) -> None:
        with self.lock:
            self.counts[name] += n

    def ingester(self, client: int) -> None:
        """Deliver batches at ``rate / CLIENTS`` inputs a second; one in ten again once acknowledged."""
        rng = random.Random(f"soak-client-{client}")
        due = time.monotonic()
        with self.client(client) as connectors:
            for n in itertools.count():
                if self.stop.is_set():
                    return
                batch = [
                    IngestItem(
                        receipt_key=f"{self.phase}-c{client}-{n}-{i}",
                        route=route(f"lane-{rng.randrange(LANES)}"),
                        payload=f"soak client {client} batch {n} input {i}".encode(),
                        source_time=utcnow(),  # the duplicate window needs it (decision 127)
                    )
                    for i in range(BATCH)
                ]
                self.deliver(connectors, batch, again=rng.random() < DUPLICATE_SHARE)
                if self.rate is not None:
                    due += BATCH * CLIENTS / self.rate
                    self.stop.wait(max(0.0, due - time.monotonic()))

    def deliver(self, connectors: ConnectorsClient, batch: list[IngestItem], *, again: bool) -> None:
        """Send ``batch`` until every input is acknowledged; then once more if ``again`` (all duplicates)."""
        waiting = {item.receipt_key: item for item in batch}
        while waiting and not self.stop.is_set():
            results = self.call(lambda: connectors.ingest(self.pack, items=list(waiting.values())))
            for result in results or ():
                if result.outcome in ACKNOWLEDGED_OUTCOMES:
                    del waiting[result.receipt_key]
                    with self.lock:
                        self.counts["inputs_acknowledged"] += 1
                        self.counts[f"first_answer:{result.outcome.value}"] += 1
                        if result.outcome is not Outcome.EXPIRED:  # acknowledged, never stored (decision 127)
                            self.acknowledged.append(result.receipt_key)
                elif result.outcome is not Outcome.FENCED:  # refused for good: the soak's own mistake
                    del waiting[result.receipt_key]
                    self.count(f"inputs_refused:{result.outcome.value}")
            if waiting:
                self.stop.wait(RETRY_PAUSE)
        if again and not waiting:
            results = self.call(lambda: connectors.ingest(self.pack, items=batch))
            self.count("duplicates_sent", len(batch))
            for result in results or ():
                self.count(f"duplicate_answer:{result.outcome.value}")

    def worker(self, n: int) -> None:
        """Claim, load, complete (or fail one attempt in fifty) until stopped."""
        rng = random.Random(f"soak-worker-{n}")
        name = f"soak-worker-{n}"
        with self.client(n) as connectors:
            while not self.stop.is_set():
                claims = self.call(
                    lambda: connectors.claim(name, pack_install_ids=[self.pack], max_items=4, lease=LEASE)
                )
                if not claims:
                    self.stop.wait(RETRY_PAUSE)
                    continue
                for claim in claims:
                    work_id, token = claim.work.work_id, claim.lease_token
                    ordinals = self.call(functools.partial(loaded_ordinals, connectors, (work_id, token)))
                    if ordinals is None or rng.random() < FAILURE_SHARE:
                        self.call(functools.partial(connectors.fail, work_id, lease_token=token, error="soak"))
                        self.count("attempts_failed")
                    elif self.call(functools.partial(connectors.complete, work_id, lease_token=token)) is not None:
                        self.count("inputs_completed", len(ordinals))

    def replay_a_dead_letter(self) -> None:
        """Replay the oldest dead letter of the pack, if there is one."""
        with self.client(0) as connectors:
            page = self.call(lambda: connectors.list_generations(self.pack, route=None, status=WorkStatus.FAILED))
            for generation in page.generations if page else ():
                if self.call(functools.partial(connectors.replay, generation.work_id)) is not None:
                    self.count("replays")
                    return

    def restart(self, n: int) -> None:
        """Stop replica ``n`` (SIGTERM, drained) and start it again on its port."""
        old = self.replicas[n]
        stop_services([old])
        self.replicas[n] = start_service(
            CONNECTORS, env={"NEXUSCRM_DSN": self.dsn, **SERVICE_ENV}, workdir=old.log_path.parent, port=old.port
        )
        self.count("restarts")

    def calibrate(self) -> float:
        """The maximum rate: the lower of inputs acknowledged and completed per second at full speed."""
        threads = self.load()
        self.stop.wait(CALIBRATION)
        with self.lock:
            acknowledged, completed = self.counts["inputs_acknowledged"], self.counts["inputs_completed"]
        self.halt(threads)
        return min(acknowledged, completed) / CALIBRATION

    def load(self) -> list[threading.Thread]:
        threads = [guarded_thread(self.ingester, self.errors, self.stop, n) for n in range(CLIENTS)]
        threads += [guarded_thread(self.worker, self.errors, self.stop, n) for n in range(WORKERS)]
        for thread in threads:
            thread.start()
        return threads

    def halt(self, threads: list[threading.Thread]) -> None:
        self.stop.set()
        for thread in threads:
            thread.join()
        self.stop.clear()
        if self.errors:
            raise self.errors[0]

    def soak(self) -> tuple[dict[str, list[tuple[float, float]]], list[dict[str, float]]]:
        """The load at ``rate`` for the plan's duration; each series and the table of samples."""
        with self.client(0) as connectors:
            connectors.set_retention_policy(
                self.pack,
                keep_generations=1,
                keep_seconds=self.plan.keep_seconds,
                duplicate_window_seconds=4 * self.plan.keep_seconds,
            )
        series: dict[str, list[tuple[float, float]]] = defaultdict(list)
        table: list[dict[str, float]] = []
        threads = self.load()
        begun = time.monotonic()
        restarts = itertools.count()
        try:
            while (elapsed := time.monotonic() - begun) < self.plan.seconds and not self.stop.is_set():
                self.stop.wait(self.plan.interval)
                elapsed = time.monotonic() - begun
                sample = self.sample()
                for name, value in sample.items():
                    series[name].append((elapsed, value))
                table.append({"minute": round(elapsed / 60, 2), **sample})
                print(json.dumps(table[-1], sort_keys=True), flush=True)
                self.replay_a_dead_letter()
                if elapsed < self.plan.seconds and elapsed // self.plan.restart_every > self.counts["restarts"]:
                    self.restart(next(restarts) % len(self.replicas))
        finally:
            self.halt(threads)
        return series, table

    def sample(self) -> dict[str, float]:
        """One sample of every series; also counts acknowledged inputs found neither received nor pruned."""
        values: dict[str, float] = {}
        for n, replica in enumerate(self.replicas):
            values |= {f"{name}:replica{n + 1}": value for name, value in process_sample(replica, self.dsn).items()}
        with self.engine.connect() as connection:
            for table in metadata.sorted_tables:
                values[f"rows:{table.name}"] = connection.execute(
                    sa.select(sa.func.count()).select_from(table)
                ).scalar_one()
        with self.client(0) as connectors:
            state = self.call(lambda: connectors.queue_state(self.pack))
        if state is not None:
            values["lag_seconds"] = state.oldest_waiting_age.total_seconds() if state.oldest_waiting_age else 0.0
            values["backlog"] = state.pending + state.blocked + state.retry + state.processing
        with self.lock:
            keys, self.acknowledged = self.acknowledged, []
        self.count("inputs_lost", len(keys) - self.found(keys))
        return values

    def found(self, keys: list[str]) -> int:
        """How many of ``keys`` have a receipt or a tombstone in the pack."""
        found = 0
        with self.engine.connect() as connection:
            for chunk in (keys[at : at + 500] for at in range(0, len(keys), 500)):
                for table in (IngressReceipt, PrunedReceipt):
                    query = sa.select(sa.func.count()).where(
                        table.c.PackInstallId == self.pack, table.c.ReceiptKey.in_(chunk)
                    )
                    found += connection.execute(query).scalar_one()
        return found

    def drain(self) -> bool:
        """Workers only, until the pack's queue is drained; True when it drained within ``DRAIN``."""
        threads = [guarded_thread(self.worker, self.errors, self.stop, n) for n in range(WORKERS)]
        for thread in threads:
            thread.start()
        with self.client(0) as connectors:
            drained = connectors.wait_queue_drained(self.pack, timeout=DRAIN).drained
        self.halt(threads)
        return drained

    def close(self) -> None:
        stop_services(self.replicas)
        self.engine.dispose()


def process_sample(service: ServiceProcess, dsn: str) -> dict[str, float]:
    """A process's resident memory (MB), open files and database connections (server sockets, or SQLite files)."""
    pid = service.process.pid
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    links = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(FileNotFoundError):
            links.append(os.readlink(fd))
    url = normalize_dsn(dsn)
    if url.get_backend_name() == "sqlite":
        connections = sum(1 for link in links if link == str(Path(url.database or "").resolve()))
    else:
        sockets = {link[len("socket:[") : -1] for link in links if link.startswith("socket:[")}
        connections = len(sockets & server_sockets(pid, url.port or 3306))
    return {"rss_mb": rss_kb / 1024, "open_files": len(links), "db_connections": connections}


def server_sockets(pid: int, port: int) -> set[str]:
    """Inodes of the process's TCP sockets whose remote end is ``port``."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        for line in path.read_text().splitlines()[1:] if path.exists() else ():
            fields = line.split()
            if int(fields[2].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def summary(table: list[dict[str, float]], fits: list[Growth]) -> list[str]:
    """One line per series: start, end, fitted slope per hour, allowance, verdict."""
    lines = [f"{'series':40} {'start':>10} {'end':>10} {'slope/h':>10} {'error/h':>10} {'allowed/h':>10}"]
    for fit in fits:
        figures = f"{fit.start:10.1f} {fit.end:10.1f} {fit.slope_per_hour:10.1f} {fit.error_per_hour:10.1f}"
        figures += f" {fit.allowed_per_hour:10.1f}"
        lines.append(f"{fit.name:40} {figures}{'  GROWS' if fit.unbounded else ''}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--minutes", type=float, default=60.0, help="length of the soak (default 60)")
    parser.add_argument("--backend", choices=("mariadb", "sqlite"), default="mariadb")
    parser.add_argument("--figures", type=Path, help="append the summary as one JSON line to this file")
    parser.add_argument("--workdir", type=Path, default=Path("var/soak"), help="the replicas' logs (default var/soak)")
    args = parser.parse_args(argv)
    plan = Plan(args.minutes)
    server = os.environ.get("NEXUSCRM_TIDB_DSN", "")
    if args.backend == "mariadb" and not server:
        parser.error("--backend mariadb needs NEXUSCRM_TIDB_DSN, the server's DSN (mysql://root@127.0.0.1:3306/)")
    backend = Backend(name="sqlite") if args.backend == "sqlite" else Backend(name="mysql", server_dsn=server)
    begun = time.monotonic()
    with contextlib.ExitStack() as stack:
        dsn = stack.enter_context(scratch_database(backend))
        soak = Soak(dsn, args.workdir / args.backend, plan)
        stack.callback(soak.close)
        maximum = soak.calibrate()
        soak.rate, soak.phase = maximum / 2, "soak"
        soak.counts.clear()
        print(
            f"maximum {maximum:.1f} inputs/s; soaking at {soak.rate:.1f} inputs/s for {plan.minutes:g} min", flush=True
        )
        series, table = soak.soak()
        drained = soak.drain()
        problems = check_invariants(soak.engine)
        fits = verdict(series, ALLOWANCES)
    print("\n".join(summary(table, fits)))
    counts = dict(soak.counts)
    internal = counts.get("rpc:INTERNAL", 0)
    figures = {
        "backend": args.backend,
        "minutes": plan.minutes,
        "wall_seconds": round(time.monotonic() - begun),
        "maximum_rate": round(maximum, 1),
        "rate": round(maximum / 2, 1),
        "samples": len(table),
        "counts": counts,
        "drained": drained,
        "invariant_violations": len(problems),
        "growing": [fit.name for fit in fits if fit.unbounded],
        "series": {
            fit.name: [
                round(fit.start, 1),
                round(fit.end, 1),
                round(fit.slope_per_hour, 1),
                round(fit.error_per_hour, 1),
            ]
            for fit in fits
        },
    }
    print(json.dumps(figures, sort_keys=True))
    if args.figures:
        args.figures.parent.mkdir(parents=True, exist_ok=True)
        with args.figures.open("a", encoding="utf-8") as sink:
            sink.write(json.dumps(figures, sort_keys=True) + "\n")
    refused = {name: n for name, n in counts.items() if name.startswith("inputs_refused:")}
    failed = figures["growing"] or counts.get("inputs_lost", 0) or internal or problems or not drained or refused
    if failed:
        print(
            f"soak failed: growing {figures['growing']}, lost {counts.get('inputs_lost', 0)}, refused {refused}, "
            f"INTERNAL {internal}, invariants {problems[:5]}, drained {drained}",
            file=sys.stderr,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
