"""The peer of the "peer" section: the same projection built with procrastinate on PostgreSQL.

Built the way a procrastinate user would build it, with nothing of this project:

- ``events``: one row per input, a unique receipt key; a batch of deliveries is one
  ``INSERT ... ON CONFLICT (receipt_key) DO NOTHING RETURNING lane``, so duplicate deliveries
  are ignored by the database. A partial index on unprocessed events serves the job's read.
- After the batch commits, one ``fold_lane`` job per touched lane is deferred (concurrently,
  ``defer_async`` under ``asyncio.gather``: sequential defers took 1.4 to 2.4 times as long) with
  ``queueing_lock=lane`` (a lane with a job still waiting gets no second one:
  ``AlreadyEnqueued`` is expected and ignored) and ``lock=lane`` (a lane's jobs never run at
  the same time). Deferring after the commit is what makes the queueing lock safe: a waiting
  job that made a defer fail starts later, so it reads the committed events.
- ``fold_lane`` marks the lane's unprocessed events processed and adds their values to
  ``lane_sums`` in one statement (one transaction).
- One worker process (``procrastinate --app=bench.peer.app worker``) runs the async job with
  concurrency 4: procrastinate's documented way to run several I/O-bound jobs at once (four
  processes with concurrency 1, ``PROCESSES = 4``, reached about 1 050 inputs/s where one
  process reached 1 500 to 2 560 in the same minutes).

- Several concurrent clients are as many concurrent requests of one async ingest service: one
  event loop, a connection of its own per client for the batch's INSERT, one procrastinate pool
  of at least as many connections for the defers.

The clock, the workload and the checks are the section's (``bench.lanesum``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterator, Sequence
from pathlib import Path

import procrastinate
import psycopg
from procrastinate.exceptions import AlreadyEnqueued
from procrastinate.job_context import JobContext
from psycopg import sql

from bench.lanesum import WORKERS, Ingest, Outcome, answered, busy_since, deliver, lanes_of, sum_problems, wait_until
from workqueue.values import IngestItem

DEFAULT_PG_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"  # NEXUSCRM_BENCH_PG_DSN overrides
DSN_VARIABLE = "NEXUSCRM_BENCH_PEER_DSN"  # the scratch database the worker process connects to
QUEUE = "lanes"
POLL_SECONDS = 0.2  # seconds between job polls without a notification: our Worker's default poll interval
PROCESSES = 1  # worker processes sharing the 4 concurrent jobs (see the module docstring)
POOL_SIZE = 8  # connections of the worker: LISTEN, fetch and finish, heartbeat, 4 jobs
INGEST_POOL = 8  # connections deferring a batch's jobs concurrently (at least one per client)
WORKER_START_TIMEOUT = 30.0  # seconds
STOP_TIMEOUT = 20.0  # seconds between SIGTERM and SIGKILL of the worker process
SETTINGS = ("fsync", "synchronous_commit", "shared_buffers", "wal_level")

SCHEMA = (
    """
    CREATE TABLE events (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        receipt_key text NOT NULL UNIQUE,
        lane text NOT NULL,
        payload jsonb NOT NULL,
        received_at timestamptz NOT NULL DEFAULT now(),
        processed_at timestamptz
    )
    """,
    "CREATE INDEX events_unprocessed ON events (lane) WHERE processed_at IS NULL",
    "CREATE TABLE lane_sums (lane text PRIMARY KEY, total bigint NOT NULL, inputs integer NOT NULL)",
)
# One batch of deliveries; duplicates (already stored, or repeated in the batch) return nothing.
EVENTS_INSERT = """
    INSERT INTO events (receipt_key, lane, payload)
    SELECT * FROM unnest(%s::text[], %s::text[], %s::jsonb[])
    ON CONFLICT (receipt_key) DO NOTHING
    RETURNING lane
"""
# The job: fold and mark in one statement. An input's value is its receipt number, as in
# ``laneflow.input_value``; clock_timestamp() is the fold's time (now() is the transaction's start).
LANE_FOLD = """
    WITH folded AS (
        UPDATE events SET processed_at = clock_timestamp()
        WHERE lane = %(lane)s AND processed_at IS NULL
        RETURNING substr(receipt_key, 3)::bigint AS value
    )
    INSERT INTO lane_sums (lane, total, inputs)
    SELECT %(lane)s, sum(value), count(*) FROM folded HAVING count(*) > 0
    ON CONFLICT (lane) DO UPDATE
    SET total = lane_sums.total + excluded.total, inputs = lane_sums.inputs + excluded.inputs
"""

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ.get(DSN_VARIABLE, ""), max_size=POOL_SIZE),
    worker_defaults={"concurrency": WORKERS, "queues": [QUEUE], "fetch_job_polling_interval": POLL_SECONDS},
)


@app.task(name="fold_lane", queue=QUEUE, pass_context=True)
async def fold_lane(context: JobContext, lane: str) -> None:
    """Fold the lane's unprocessed events into its sum and mark them processed (one statement)."""
    connector = context.app.connector
    assert isinstance(connector, procrastinate.PsycopgConnector)
    async with connector.pool.connection() as connection:
        await connection.execute(LANE_FOLD, {"lane": lane})


def server_settings(server_dsn: str) -> str:
    """The PostgreSQL version and durability settings, for the report."""
    with psycopg.connect(server_dsn, autocommit=True) as connection:
        rows = connection.execute(
            "SELECT name, current_setting(name) FROM unnest(%s::text[]) AS name", (["server_version", *SETTINGS],)
        ).fetchall()
    return ", ".join(f"{name}={value}" for name, value in rows)


@contextlib.contextmanager
def scratch_database(server_dsn: str) -> Iterator[str]:
    """A fresh PostgreSQL database with the events, lane_sums and procrastinate tables; dropped afterwards."""
    name = f"nxpeer_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = psycopg.conninfo.make_conninfo(server_dsn, dbname=name)
    try:
        with psycopg.connect(dsn, autocommit=True) as connection:
            for statement in SCHEMA:
                connection.execute(statement)
        with app.replace_connector(procrastinate.SyncPsycopgConnector(conninfo=dsn)) as bound, bound.open():
            bound.schema_manager.apply_schema()
        yield dsn
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@contextlib.contextmanager
def worker_processes(dsn: str, workdir: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``PROCESSES`` x ``procrastinate worker`` on ``dsn`` (4 concurrent jobs in all), registered before this yields."""
    processes = PROCESSES
    root = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        DSN_VARIABLE: dsn,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, "-m", "procrastinate", "--app=bench.peer.app", "worker"]
    command.append(f"--concurrency={WORKERS // processes}")
    started: list[subprocess.Popen[bytes]] = []
    log_path = workdir / "procrastinate-worker.log"
    try:
        with log_path.open("ab") as log:
            for _ in range(processes):
                started.append(
                    subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                )
        with psycopg.connect(dsn, autocommit=True) as connection:
            registered = wait_until(
                lambda: (
                    all(process.poll() is None for process in started)
                    and connection.execute("SELECT count(*) FROM procrastinate_workers").fetchone() == (processes,)
                ),
                timeout=WORKER_START_TIMEOUT,
            )
        if not registered:
            raise RuntimeError(f"the procrastinate workers did not start: {log_path.read_text()[-2000:]}")
        yield started
    finally:
        for process in started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in started:
            try:
                process.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def ingest(connection: psycopg.AsyncConnection[tuple[object, ...]], items: Sequence[IngestItem]) -> int:
    """Store a batch (duplicates ignored), commit, defer a job for each touched lane; return the new inputs.

    ``app`` must be open (``run`` binds an async connector with a pool of ``INGEST_POOL``
    connections); the lanes' defers run concurrently, as an async ingest handler would do.
    """
    async with connection.transaction():
        cursor = await connection.execute(
            EVENTS_INSERT,
            (
                [item.receipt_key for item in items],
                [item.route.source_lane for item in items],
                [item.payload.decode() for item in items],
            ),
        )
        rows = await cursor.fetchall()
    await asyncio.gather(*(_defer(lane) for lane in sorted({str(lane) for (lane,) in rows})))
    return len(rows)


async def _defer(lane: str) -> None:
    with contextlib.suppress(AlreadyEnqueued):  # the lane's waiting job will read the new events
        await fold_lane.configure(queueing_lock=lane, lock=lane).defer_async(lane=lane)


async def _open(bound: procrastinate.App) -> None:
    await bound.open_async()


@contextlib.contextmanager
def event_loop() -> Iterator[Callable[[Coroutine[object, object, object]], object]]:
    """An event loop on a thread of its own, and a function that runs a coroutine on it and waits for it."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="peer-ingest-loop", daemon=True)
    thread.start()
    try:
        yield lambda coroutine: asyncio.run_coroutine_threadsafe(coroutine, loop).result()
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def _client(
    on_loop: Callable[[Coroutine[object, object, object]], object],
    connection: psycopg.AsyncConnection[tuple[object, ...]],
) -> Ingest:
    def send(items: Sequence[IngestItem]) -> Callable[[], int]:
        admitted = on_loop(ingest(connection, items))
        assert isinstance(admitted, int)
        return answered(admitted)

    return send


def _settled(connection: psycopg.Connection[tuple[object, ...]]) -> bool:
    row = connection.execute(
        "SELECT (SELECT count(*) FROM events WHERE processed_at IS NULL),"
        " (SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing'))"
    ).fetchone()
    return row == (0, 0)


def run(server_dsn: str, *, inputs: int, rate: float = 0.0, clients: int = 1) -> Outcome:
    """One run of the peer in a scratch database: deliver through ``clients`` concurrent clients, wait, check."""
    with (
        scratch_database(server_dsn) as dsn,
        tempfile.TemporaryDirectory(prefix="nxbench-peer-") as workdir,
        worker_processes(dsn, Path(workdir)) as workers,
    ):
        pool = max(INGEST_POOL, clients)
        connector = procrastinate.PsycopgConnector(conninfo=dsn, min_size=pool, max_size=pool)
        with event_loop() as on_loop, app.replace_connector(connector) as bound:
            on_loop(_open(bound))
            connections: list[psycopg.AsyncConnection[tuple[object, ...]]] = []
            try:
                for _ in range(clients):
                    connection = on_loop(psycopg.AsyncConnection.connect(dsn))
                    assert isinstance(connection, psycopg.AsyncConnection)
                    connections.append(connection)
                sent = deliver([_client(on_loop, connection) for connection in connections], inputs, rate)
            finally:
                for connection in connections:
                    on_loop(connection.close())
                on_loop(bound.close_async())
        with psycopg.connect(dsn, autocommit=True) as connection:
            wait_until(lambda: _settled(connection) or any(w.poll() is not None for w in workers))
            cpu_seconds = busy_since(sent)
            problems = [] if _settled(connection) else ["not every input was folded in time (or a worker died)"]
            problems += _check(connection, sent.distinct, sent.admitted)
            projected = lanes_of(connection.execute("SELECT lane, total, inputs FROM lane_sums").fetchall())
            problems += sum_problems(sent, projected)
            finished = connection.execute("SELECT extract(epoch FROM max(processed_at))::float8 FROM events").fetchone()
            jobs = connection.execute("SELECT count(*) FROM procrastinate_jobs").fetchone()
            lags = [
                float(lag)
                for (lag,) in connection.execute(
                    "SELECT extract(epoch FROM processed_at)::float8 - (payload->>'sent_at')::float8"
                    " FROM events WHERE processed_at IS NOT NULL"
                )
            ]
    last = float(finished[0]) if finished and finished[0] is not None else sent.started
    return Outcome(
        side="peer",
        inputs=sent.distinct,
        deliveries=sent.deliveries,
        duplicates=sent.duplicates,
        seconds=last - sent.started,
        ingest_seconds=sent.ingested - sent.started,
        executions=int(jobs[0]) if jobs else 0,
        cpu_seconds=cpu_seconds,
        problems=tuple(problems),
        lags=tuple(lags),
        transactions=sent.batches,  # one INSERT transaction per batch
    )


def _check(connection: psycopg.Connection[tuple[object, ...]], distinct: int, admitted: int) -> list[str]:
    """Every delivery stored once, every job succeeded."""
    problems = []
    if admitted != distinct:
        problems.append(f"{admitted} deliveries stored as new events, {distinct} distinct delivered")
    stored = connection.execute("SELECT count(*) FROM events").fetchone()
    if stored != (distinct,):
        problems.append(f"{stored} events stored, {distinct} distinct delivered")
    failed = connection.execute("SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'").fetchone()
    if failed != (0,):
        problems.append(f"{failed} jobs did not succeed")
    return problems
