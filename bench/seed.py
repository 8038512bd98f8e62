"""Benchmark data: packs, delivery batches, and retained history bulk-loaded with multi-row INSERTs.

History is written directly (not through admission) so that 10^6 generations load in minutes:
completed one-input native generations, or old-protocol (legacy) history for the cutover
audit. Row shapes come from the runtime's own builders (``generation_row``) and statements
(``events_insert``, ``work_items_insert``).
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa

from nexuscrm_connectors.queries import events as events_sql
from nexuscrm_connectors.queries import work_items as work_items_sql
from nexuscrm_connectors.queries.rows import EventRow
from nexuscrm_connectors.queue.deliveries import event_row, generation_row, payload_hash
from nexuscrm_schema.tables import PackInstall
from tests.support.factories import START, route
from workqueue import EventStatus, WorkStatus
from workqueue.values import IngestItem

PAYLOAD_BYTES = 200  # bytes per delivery payload
CHUNK = 5000  # rows per bulk INSERT transaction
SETTLE_SECONDS = 30  # longest wait for InnoDB to flush a bulk load before timing
SETTLED_DIRTY_SHARE = 0.05  # of the buffer pool's pages

Progress = Callable[[int], None]  # rows loaded so far


def payload(key: str) -> bytes:
    """A deterministic payload of ``PAYLOAD_BYTES`` for a receipt key."""
    return (f'{{"key":"{key}","fields":"' + "x" * PAYLOAD_BYTES)[: PAYLOAD_BYTES - 2].encode() + b'"}'


def lane(index: int) -> str:
    """The source lane of identity ``index``."""
    return f"lane-{index:04d}"


def batch(prefix: str, size: int, identities: int, offset: int = 0) -> list[IngestItem]:
    """``size`` fresh deliveries spread round-robin over ``identities`` lanes."""
    return [
        IngestItem(
            receipt_key=f"{prefix}-{n}",
            route=route(lane((offset + n) % identities)),
            payload=payload(f"{prefix}-{n}"),
        )
        for n in range(size)
    ]


def event_rows(pack_install_id: str, first_ordinal: int, items: Sequence[IngestItem]) -> list[EventRow]:
    """The Event rows admission would write for ``items`` (the floor inserts exactly these)."""
    return [
        event_row(
            pack_install_id,
            ordinal=first_ordinal + n,
            projection_key=item.route.identity(pack_install_id).key,
            receipt_key=item.receipt_key,
            payload=item.payload,
            digest=payload_hash(item.payload),
            source_time=None,
            is_replay=False,
            now=START,
        )
        for n, item in enumerate(items)
    ]


def load_history(
    engine: sa.Engine,
    pack_install_id: str,
    generations: int,
    identities: int,
    *,
    legacy: bool = False,
    progress: Progress | None = None,
) -> None:
    """Append ``generations`` completed one-input generations (and their Events) to a pack.

    Identities take turns (ordinal n belongs to lane n mod ``identities``). ``legacy`` writes
    old-protocol history instead: no InputStartOrdinal, and every other input coalesced into
    the next one's WorkItem (no direct task), as the old runtime left it.
    """
    keys = [route(lane(i)).identity(pack_install_id).key for i in range(identities)]
    with engine.connect() as connection:
        first = connection.execute(
            sa.select(PackInstall.c.LastOrdinal).where(PackInstall.c.PackInstallId == pack_install_id)
        ).scalar_one()
    ordinals = iter(range(first + 1, first + generations + 1))
    loaded = 0
    while chunk := list(itertools.islice(ordinals, CHUNK)):
        events, work = _history_rows(pack_install_id, keys, chunk, legacy=legacy)
        with engine.begin() as connection:
            events_sql.events_insert(connection, events)
            work_items_sql.work_items_insert(connection, work)
            connection.execute(
                sa.update(PackInstall)
                .where(PackInstall.c.PackInstallId == pack_install_id)
                .values(LastOrdinal=chunk[-1])
            )
        loaded += len(chunk)
        if progress is not None:
            progress(loaded)
    analyze(engine)


def load_generation(engine: sa.Engine, pack_install_id: str, inputs: int) -> None:
    """Append one pending generation of ``inputs`` Events (``PAYLOAD_BYTES`` each) on lane 0.

    What admission would leave after ``inputs`` deliveries to one idle lane, written directly.
    """
    key = route(lane(0)).identity(pack_install_id).key
    with engine.connect() as connection:
        last = connection.execute(
            sa.select(PackInstall.c.LastOrdinal).where(PackInstall.c.PackInstallId == pack_install_id)
        ).scalar_one()
    first = last + 1
    for start in range(first, first + inputs, CHUNK):
        ordinals = range(start, min(start + CHUNK, first + inputs))
        rows = [
            {
                "PackInstallId": pack_install_id,
                "EnqueueOrdinal": ordinal,
                "ProjectionKey": key,
                "ReceiptKey": f"g-{ordinal}",
                "PayloadHash": "0" * 64,
                "Payload": payload(f"g-{ordinal}"),
                "SourceTime": None,
                "Status": EventStatus.PENDING,
                "IsReplay": False,
                "CreatedAt": START,
            }
            for ordinal in ordinals
        ]
        with engine.begin() as connection:
            events_sql.events_insert(connection, rows)
    generation = generation_row(
        work_id=str(uuid.uuid4()),
        pack_install_id=pack_install_id,
        projection_key=key,
        start=first,
        end=first + inputs - 1,
        members=inputs,
        blocked=False,
        now=START,
        max_attempts=5,
    )
    with engine.begin() as connection:
        work_items_sql.work_items_insert(connection, [generation])
        connection.execute(
            sa.update(PackInstall)
            .where(PackInstall.c.PackInstallId == pack_install_id)
            .values(LastOrdinal=first + inputs - 1)
        )
    analyze(engine)


def analyze(engine: sa.Engine) -> None:
    """Refresh optimizer statistics and let the server write back the load before timing.

    Right after a bulk load MariaDB's persistent statistics are stale and it may pick
    ix_workitem_claim for a correlated probe (docs/performance-log.md, "What was slow"), and
    InnoDB is still flushing the loaded pages: measured operations would compete with that I/O.
    Waits until dirty pages are under ``SETTLED_DIRTY_SHARE`` of the buffer pool, at most
    ``SETTLE_SECONDS`` (TiDB reports no InnoDB pages: statistics only).
    """
    with engine.begin() as connection:
        if connection.dialect.name == "sqlite":
            connection.exec_driver_sql("ANALYZE")
            return
        connection.exec_driver_sql("ANALYZE TABLE Event, WorkItem, IngressReceipt")
    deadline = time.monotonic() + SETTLE_SECONDS
    while time.monotonic() < deadline:
        with engine.connect() as connection:
            status: dict[str, str] = dict(
                connection.exec_driver_sql(
                    "SHOW GLOBAL STATUS WHERE Variable_name IN "
                    "('Innodb_buffer_pool_pages_dirty', 'Innodb_buffer_pool_pages_total')"
                )
                .tuples()
                .all()
            )
        if len(status) < 2:  # TiDB: no InnoDB buffer pool to wait for
            return
        if int(status["Innodb_buffer_pool_pages_dirty"]) < SETTLED_DIRTY_SHARE * int(
            status["Innodb_buffer_pool_pages_total"]
        ):
            return
        time.sleep(1)


def _history_rows(
    pack_install_id: str, keys: Sequence[str], ordinals: Sequence[int], *, legacy: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    events, work = [], []
    small = b'{"history":true}'
    for ordinal in ordinals:
        key = keys[ordinal % len(keys)]
        events.append(
            {
                "PackInstallId": pack_install_id,
                "EnqueueOrdinal": ordinal,
                "ProjectionKey": key,
                "ReceiptKey": f"h-{ordinal}",
                "PayloadHash": "0" * 64,
                "Payload": small,
                "SourceTime": None,
                "Status": EventStatus.PROCESSED,
                "IsReplay": False,
                "CreatedAt": START,
            }
        )
        if legacy and (ordinal // len(keys)) % 2 == 0:
            continue  # coalesced into this identity's next WorkItem: no direct task
        row = generation_row(
            work_id=str(uuid.uuid4()),
            pack_install_id=pack_install_id,
            projection_key=key,
            start=ordinal,
            end=ordinal,
            members=1,
            blocked=False,
            now=START,
            max_attempts=5,
        )
        seeded: dict[str, Any] = {
            **row,
            "InputStartOrdinal": None if legacy else ordinal,
            "Status": WorkStatus.COMPLETED,
            "ClaimableAt": None,
            "FinishedAt": START,
        }
        work.append(seeded)
    return events, work
