"""The native queue of a pack, for Flow authors, harnesses and operators: its state, and a wait for it to drain.

Native work only (generations with a recorded range); old-protocol work is the drain status
of Controlplane's GetDrainStatus. Drained means no generation of the pack is pending,
blocked, retry or processing, and no receipt of it is stored without being admitted (a
fenced pack is not drained: its receipts are still to run). Read-only.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable

from nexuscrm_connectors.context import Context
from nexuscrm_connectors.errors import UnknownPack
from nexuscrm_connectors.queries import operator_reads as operator_reads_sql
from nexuscrm_runtime.causal import causal_read
from workqueue import ReceiptState, WorkStatus
from workqueue.errors import InvalidArgument
from workqueue.values import QueueState

RECEIPTS_WAITING_CAP = 10_000  # stored receipts counted at most: a fenced pack may hold millions


def queue_state(context: Context, pack_install_id: str) -> QueueState:
    """The native queue of an installed pack; raises ``UnknownPack``."""
    engine, clock = context.engine, context.clock
    if not pack_install_id:
        raise InvalidArgument("pack_install_id is required", field="pack_install_id")
    with engine.connect() as connection:
        causal_read(connection)  # a harness acts on it: it sees every acknowledged Ingest and Complete
        if operator_reads_sql.pack_namespace(connection, pack_install_id) is None:
            raise UnknownPack(f"pack_install_id {pack_install_id!r} is not installed", field="pack_install_id")
        counts = operator_reads_sql.work_queue_counts(connection, pack_install_id)
        oldest = operator_reads_sql.work_oldest_waiting(connection, pack_install_id)
        waiting = operator_reads_sql.receipt_count_capped(
            connection, pack_install_id, ReceiptState.STORED, RECEIPTS_WAITING_CAP
        )
        now = clock.read(connection)  # ages on the database's clock, as CreatedAt was
    return QueueState(
        pack_install_id=pack_install_id,
        pending=counts.get(WorkStatus.PENDING, 0),
        blocked=counts.get(WorkStatus.BLOCKED, 0),
        retry=counts.get(WorkStatus.RETRY, 0),
        processing=counts.get(WorkStatus.PROCESSING, 0),
        receipts_waiting=waiting,
        oldest_waiting_work_id=oldest.WorkId if oldest is not None else None,
        oldest_waiting_since=oldest.CreatedAt if oldest is not None else None,
        oldest_waiting_age=max(now - oldest.CreatedAt, dt.timedelta(0)) if oldest is not None else None,
        read_at=now,
    )


def wait_drained(
    context: Context,
    pack_install_id: str,
    wait: dt.timedelta,
    active: Callable[[], bool] = lambda: True,
) -> QueueState:
    """The pack's queue state as soon as it is drained, or the last one read when ``wait`` ends.

    ``wait`` is cut to ``settings.max_claim_wait_ms``: a waiting call holds an RPC handler
    thread, so callers loop until their own deadline. Between reads it waits for a
    completion of this process (``reservations.notify``), else ``settings.claim_poll_ms`` (work of
    other processes); it answers at once when the waiting places of ``reservations`` are taken,
    and when ``active`` says the caller has gone. A negative ``wait`` is refused.
    """
    settings, reservations = context.settings, context.reservations
    if wait < dt.timedelta(0):
        raise InvalidArgument(
            f"wait_ms must not be negative, got {wait // dt.timedelta(milliseconds=1)}", field="wait_ms"
        )
    deadline = time.monotonic() + min(wait, dt.timedelta(milliseconds=settings.max_claim_wait_ms)).total_seconds()
    poll = settings.claim_poll_ms / 1000
    while True:
        seen = reservations.version()
        state = queue_state(context, pack_install_id)
        remaining = deadline - time.monotonic()
        if state.drained or remaining <= 0 or not active():
            return state
        if not reservations.wait(seen, min(poll, remaining)):
            return state
