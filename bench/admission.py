"""Section 1: admission throughput against the database floor.

Floor: plain batched INSERTs of the same Event rows (same batch size, same engine settings,
one transaction per batch, rows built before the clock starts) into the same schema.
Design floor: the writes admission cannot drop (decision 003), the same way: the batch's
receipts and Events in one transaction, then the receipt confirmation in a second.
In-process: ``Connectors.ingest`` (receipts, pack lock, fences, protocol row, ordinals,
Events, generations, confirmation). gRPC: the same through a Connectors service process and
``ConnectorsClient.ingest``. Each path gets its own pack in one scratch database.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import grpc
import sqlalchemy as sa

from bench import seed
from bench.environment import Backend, Report, scratch_database, verdict
from nexuscrm_connectors import queries
from nexuscrm_connectors.admission import Delivery, payload_hash, receipt_row
from nexuscrm_connectors.client import ConnectorsClient
from nexuscrm_connectors.models import IngestItem, IngestResult, Outcome
from nexuscrm_connectors.service import Connectors
from nexuscrm_integration.launcher import CONNECTORS, SCHEMA_CATALOG, start_services, stop_services
from nexuscrm_runtime.database import create_engine
from tests.support.factories import START, install_pack
from workqueue import ReceiptState

BATCH = 500  # deliveries per batch
IDENTITIES = 400  # projection identities the batches spread over
WARMUP = 2  # untimed batches per path
IN_PROCESS_TARGET = 0.5  # x floor
GRPC_TARGET = 0.35  # x floor

Ingest = Callable[[str, Sequence[IngestItem]], list[IngestResult]]


@contextlib.contextmanager
def connectors_process(dsn: str) -> Iterator[ConnectorsClient]:
    """A Connectors service process on ``dsn`` (schema catalog first) and a client of it."""
    with tempfile.TemporaryDirectory(prefix="nxbench-svc-") as workdir:
        services = start_services(
            [SCHEMA_CATALOG, CONNECTORS],
            env={"NEXUSCRM_DSN": dsn, "NEXUSCRM_MATERIALIZE_INTERVAL_SECONDS": "0"},
            workdir=Path(workdir),
        )
        try:
            with grpc.insecure_channel(services[-1].address) as channel:
                yield ConnectorsClient(channel)
        finally:
            stop_services(services)


def _throughput(ingest: Ingest, pack: str, batches: int, prefix: str) -> float:
    """Inputs per second admitted by ``ingest`` over ``batches`` timed batches."""
    items = [seed.batch(f"{prefix}-{n}", BATCH, IDENTITIES) for n in range(WARMUP + batches)]
    for warm in items[:WARMUP]:
        ingest(pack, warm)
    started = time.perf_counter()
    for timed_batch in items[WARMUP:]:
        results = ingest(pack, timed_batch)
        if any(r.outcome is not Outcome.ADMITTED for r in results):
            raise RuntimeError(f"{prefix}: not every delivery was admitted")
    return batches * BATCH / (time.perf_counter() - started)


def _floor(engine: sa.Engine, pack: str, batches: int) -> float:
    """Inputs per second of plain batched Event INSERTs."""
    rows = [seed.event_rows(pack, 1 + n * BATCH, seed.batch(f"floor-{n}", BATCH, IDENTITIES)) for n in range(batches)]
    with engine.begin() as connection:
        queries.events_insert(connection, seed.event_rows(pack, 10**9, seed.batch("floor-warm", BATCH, IDENTITIES)))
    started = time.perf_counter()
    for batch_rows in rows:
        with engine.begin() as connection:
            queries.events_insert(connection, batch_rows)
    return batches * BATCH / (time.perf_counter() - started)


def _design_floor(engine: sa.Engine, pack: str, batches: int) -> float:
    """Inputs per second of the receipt + Event double write and the separate confirmation, by plain statements."""
    work = []
    for n in range(batches):
        items = seed.batch(f"design-{n}", BATCH, IDENTITIES)
        deliveries = [
            Delivery(item=item, projection_key=item.route.identity(pack).key, payload_hash=payload_hash(item.payload))
            for item in items
        ]
        receipts = [receipt_row(pack, delivery, START) for delivery in deliveries]
        work.append((receipts, seed.event_rows(pack, 1 + n * BATCH, items), [item.receipt_key for item in items]))
    started = time.perf_counter()
    for receipts, events, keys in work:
        with engine.begin() as connection:
            queries.receipts_insert(connection, receipts)
            queries.events_insert(connection, events)
        with engine.begin() as connection:
            queries.receipts_set_state(connection, pack, keys, ReceiptState.CONFIRMED, START)
    return batches * BATCH / (time.perf_counter() - started)


def run(backend: Backend, report: Report, *, quick: bool) -> None:
    """Measure floor, in-process and gRPC admission in one database, side by side."""
    batches = 10 if quick else 40
    with scratch_database(backend) as dsn:
        engine = create_engine(dsn)
        try:
            floor = _floor(engine, install_pack(engine), batches)
            design = _design_floor(engine, install_pack(engine), batches)
            in_process = _throughput(Connectors(engine).ingest, install_pack(engine), batches, "inproc")
            with connectors_process(dsn) as client:
                remote = _throughput(client.ingest, install_pack(engine), batches, "grpc")
        finally:
            engine.dispose()
    section = "1 admission"
    shape = f"batch {BATCH}, {IDENTITIES} identities, {batches} batches"
    report.add(section, backend.name, f"floor: plain Event INSERTs ({shape})", f"{floor:,.0f} inputs/s")
    report.add(
        section,
        backend.name,
        "design floor (receipts + Events, then confirmation) / floor",
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
