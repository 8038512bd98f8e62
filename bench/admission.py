"""Section 1: admission throughput against the database floor.

Floor: plain batched INSERTs of the same Event rows (same batch size, same engine settings,
one transaction per batch, rows built before the clock starts) into the same schema.
Design floor: the writes admission cannot drop (decision 085), the same way: the batch's
confirmed receipts (digest, no payload) and its Events, in one transaction.
In-process: ``Connectors.ingest`` (receipts, pack lock, fences, protocol row, ordinals,
Events, generations); its statement ceiling counts only the time its statements and COMMITs
take, the driver's work included (``StatementClock``): the in-process rate admission would
reach if its own Python cost nothing. gRPC: the same through a Connectors service process and
``ConnectorsClient.ingest``. Half duplicates: in-process batches whose first half re-sends
the previous batch's new deliveries, in deliveries per second. Concurrent clients: 1, 4 and
16 threads sending batches of 50 to one pack through one Connectors process, with group
admission and with a group size of one call (every call its own transaction). Each path
gets its own pack in one scratch database.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import grpc
import sqlalchemy as sa

from bench import seed
from bench.environment import Backend, Report, scratch_database, verdict
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.queries import events as events_sql
from nexuscrm_connectors.queries import receipts as receipts_sql
from nexuscrm_connectors.queue.deliveries import Delivery, payload_hash, receipt_row
from nexuscrm_runtime.database import create_engine
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_tools.launcher import CONNECTORS, SCHEMA_CATALOG, start_services, stop_services
from tests.support.factories import START, install_pack
from workqueue import ReceiptState
from workqueue.values import IngestItem, IngestResult, Outcome

BATCH = 500  # deliveries per batch
IDENTITIES = 400  # projection identities the batches spread over
WARMUP = 2  # untimed batches per path
IN_PROCESS_TARGET = 0.5  # x floor
GRPC_TARGET = 0.35  # x floor
CONCURRENT_CLIENTS = (1, 4, 16)  # ingest clients sending at once (group admission)
CONCURRENT_BATCH = 50  # deliveries per call of a concurrent client


class Ingest(Protocol):
    """``Connectors.ingest`` or ``ConnectorsClient.ingest``."""

    def __call__(self, pack_install_id: str, *, items: Sequence[IngestItem]) -> list[IngestResult]: ...


@contextlib.contextmanager
def connectors_process(dsn: str, env: Mapping[str, str] | None = None) -> Iterator[ConnectorsClient]:
    """A Connectors service process on ``dsn`` (schema catalog first, ``env`` added) and a client of it."""
    with tempfile.TemporaryDirectory(prefix="nxbench-svc-") as workdir:
        services = start_services(
            [SCHEMA_CATALOG, CONNECTORS],
            env={"NEXUSCRM_DSN": dsn, "NEXUSCRM_MATERIALIZE_INTERVAL_SECONDS": "0", **(env or {})},
            workdir=Path(workdir),
        )
        try:
            with grpc.insecure_channel(services[-1].address) as channel:
                yield ConnectorsClient(channel)
        finally:
            stop_services(services)


class StatementClock:
    """Seconds an engine spends in statements and COMMITs while counting (between ``start`` and ``stop``).

    A statement from ``before_cursor_execute`` to ``after_cursor_execute``; a COMMIT from the
    ``commit`` event (SQLAlchemy's, just before the driver's) to the connection's return to the
    pool, which follows it directly (``run_transaction``).
    """

    def __init__(self, engine: sa.Engine) -> None:
        self.seconds = 0.0
        self._began: dict[int, float] = {}  # id of the DBAPI connection -> its statement or COMMIT's start
        self._hooks: list[tuple[sa.Engine, str, Callable[..., None]]] = [
            (engine, "before_cursor_execute", lambda conn, *_: self._begin(conn.connection.dbapi_connection)),
            (engine, "after_cursor_execute", lambda conn, *_: self._end(conn.connection.dbapi_connection)),
            (engine, "commit", lambda conn: self._begin(conn.connection.dbapi_connection)),
            (engine, "checkin", lambda dbapi_connection, _record: self._end(dbapi_connection)),
        ]

    def start(self) -> None:
        self.seconds = 0.0
        for target, name, hook in self._hooks:
            sa.event.listen(target, name, hook)

    def stop(self) -> None:
        for target, name, hook in self._hooks:
            sa.event.remove(target, name, hook)

    def _begin(self, dbapi_connection: object) -> None:
        self._began[id(dbapi_connection)] = time.perf_counter()

    def _end(self, dbapi_connection: object) -> None:
        began = self._began.pop(id(dbapi_connection), None)
        if began is not None:
            self.seconds += time.perf_counter() - began


def _throughput(ingest: Ingest, pack: str, batches: int, prefix: str, *, clock: StatementClock | None = None) -> float:
    """Inputs per second admitted by ``ingest`` over ``batches`` timed batches: of wall time, or of ``clock``'s."""
    items = [seed.batch(f"{prefix}-{n}", BATCH, IDENTITIES) for n in range(WARMUP + batches)]
    for warm in items[:WARMUP]:
        ingest(pack, items=warm)
    if clock is not None:
        clock.start()
    started = time.perf_counter()
    try:
        for timed_batch in items[WARMUP:]:
            results = ingest(pack, items=timed_batch)
            if any(r.outcome is not Outcome.ADMITTED for r in results):
                raise RuntimeError(f"{prefix}: not every delivery was admitted")
        elapsed = time.perf_counter() - started
    finally:
        if clock is not None:
            clock.stop()
    return batches * BATCH / (elapsed if clock is None else clock.seconds)


def _half_duplicates(ingest: Ingest, pack: str, batches: int, prefix: str) -> float:
    """Deliveries per second of batches whose first half re-sends the previous batch's fresh half."""
    fresh = [seed.batch(f"{prefix}-{n}", BATCH // 2, IDENTITIES, offset=n) for n in range(WARMUP + batches + 1)]
    items = [fresh[n - 1] + fresh[n] for n in range(1, len(fresh))]
    ingest(pack, items=fresh[0])
    for warm in items[:WARMUP]:
        ingest(pack, items=warm)
    started = time.perf_counter()
    for timed_batch in items[WARMUP:]:
        outcomes = [r.outcome for r in ingest(pack, items=timed_batch)]
        if outcomes != [Outcome.DUPLICATE_COVERED] * (BATCH // 2) + [Outcome.ADMITTED] * (BATCH // 2):
            raise RuntimeError(f"{prefix}: duplicates were not covered, or fresh inputs not admitted")
    return batches * BATCH / (time.perf_counter() - started)


def _concurrent(ingest: Ingest, pack: str, clients: int, inputs: int, prefix: str) -> float:
    """Inputs per second admitted by ``clients`` threads sending batches of ``CONCURRENT_BATCH`` at once."""
    calls = inputs // CONCURRENT_BATCH // clients
    work = [
        [seed.batch(f"{prefix}-{client}-{n}", CONCURRENT_BATCH, IDENTITIES) for n in range(calls)]
        for client in range(clients)
    ]
    start = threading.Barrier(clients + 1)
    failures: list[BaseException] = []

    def client(batches: list[list[IngestItem]]) -> None:
        start.wait()
        try:
            for items in batches:
                if any(r.outcome is not Outcome.ADMITTED for r in ingest(pack, items=items)):
                    raise RuntimeError(f"{prefix}: not every delivery was admitted")
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=client, args=(batches,)) for batches in work]
    for thread in threads:
        thread.start()
    start.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return clients * calls * CONCURRENT_BATCH / (time.perf_counter() - started)


def _floor(engine: sa.Engine, pack: str, batches: int) -> float:
    """Inputs per second of plain batched Event INSERTs."""
    rows = [seed.event_rows(pack, 1 + n * BATCH, seed.batch(f"floor-{n}", BATCH, IDENTITIES)) for n in range(batches)]
    with engine.begin() as connection:
        events_sql.events_insert(connection, seed.event_rows(pack, 10**9, seed.batch("floor-warm", BATCH, IDENTITIES)))
    started = time.perf_counter()
    for batch_rows in rows:
        with engine.begin() as connection:
            events_sql.events_insert(connection, batch_rows)
    return batches * BATCH / (time.perf_counter() - started)


def _design_floor(engine: sa.Engine, pack: str, batches: int) -> float:
    """Inputs per second of each batch's confirmed receipts and Events in one transaction, by plain statements."""
    work = []
    for n in range(batches):
        items = seed.batch(f"design-{n}", BATCH, IDENTITIES)
        deliveries = [
            Delivery(item=item, projection_key=item.route.identity(pack).key, payload_hash=payload_hash(item.payload))
            for item in items
        ]
        receipts = [receipt_row(pack, delivery, START, state=ReceiptState.CONFIRMED) for delivery in deliveries]
        work.append((receipts, seed.event_rows(pack, 1 + n * BATCH, items)))
    started = time.perf_counter()
    for receipts, events in work:
        with engine.begin() as connection:
            receipts_sql.receipts_insert(connection, receipts)
            events_sql.events_insert(connection, events)
    return batches * BATCH / (time.perf_counter() - started)


def run(backend: Backend, report: Report, *, quick: bool) -> None:
    """Measure floor, in-process and gRPC admission in one database, side by side."""
    batches = 10 if quick else 40
    concurrent_inputs = 3_200 if quick else 16_000
    with scratch_database(backend) as dsn:
        engine = create_engine(dsn)
        try:
            floor = _floor(engine, install_pack(engine), batches)
            design = _design_floor(engine, install_pack(engine), batches)
            in_process = _throughput(Connectors(engine).ingest, install_pack(engine), batches, "inproc")
            ceiling = _throughput(
                Connectors(engine).ingest, install_pack(engine), batches, "ceiling", clock=StatementClock(engine)
            )
            duplicates = _half_duplicates(Connectors(engine).ingest, install_pack(engine), batches, "half")
            with connectors_process(dsn) as client:
                remote = _throughput(client.ingest, install_pack(engine), batches, "grpc")
                grouped = {
                    n: _concurrent(client.ingest, install_pack(engine), n, concurrent_inputs, f"group-{n}")
                    for n in CONCURRENT_CLIENTS
                }
            # The same with every call in a transaction of its own: a group holds one call.
            with connectors_process(dsn, {"NEXUSCRM_ADMISSION_GROUP_ITEMS": "1"}) as client:
                alone = {
                    n: _concurrent(client.ingest, install_pack(engine), n, concurrent_inputs, f"alone-{n}")
                    for n in CONCURRENT_CLIENTS
                }
        finally:
            engine.dispose()
    section = "1 admission"
    shape = f"batch {BATCH}, {IDENTITIES} identities, {batches} batches"
    report.add(section, backend.name, f"floor: plain Event INSERTs ({shape})", f"{floor:,.0f} inputs/s")
    report.add(
        section,
        backend.name,
        "design floor (confirmed receipts + Events) / floor",
        f"{design / floor:.2f} ({design:,.0f} inputs/s)",
    )
    report.add(
        section,
        backend.name,
        "in-process Ingest / floor",
        f"{in_process / floor:.2f} ({in_process:,.0f} inputs/s)",
        f">= {IN_PROCESS_TARGET} {verdict(in_process / floor >= IN_PROCESS_TARGET)}",
    )
    report.add(
        section,
        backend.name,
        "gRPC Ingest / floor",
        f"{remote / floor:.2f} ({remote:,.0f} inputs/s)",
        f">= {GRPC_TARGET} {verdict(remote / floor >= GRPC_TARGET)}",
    )
    report.add(section, backend.name, "in-process Ingest / design floor", f"{in_process / design:.2f}")
    report.add(
        section,
        backend.name,
        "in-process Ingest's statements and COMMITs alone / design floor (its ceiling if its own Python cost nothing)",
        f"{ceiling / design:.2f}",
    )
    report.add(
        section,
        backend.name,
        "in-process, half duplicates / fresh, per delivery",
        f"{duplicates / in_process:.2f} ({duplicates:,.0f} deliveries/s)",
        f">= 1 {verdict(duplicates >= in_process)}",
    )
    for n in CONCURRENT_CLIENTS:
        report.add(
            section,
            backend.name,
            f"gRPC, {n} concurrent clients (batches of {CONCURRENT_BATCH}): grouped / one transaction per call",
            f"{grouped[n] / alone[n]:.2f} ({grouped[n]:,.0f} / {alone[n]:,.0f} inputs/s)",
        )
