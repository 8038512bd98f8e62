"""The background loop: admits stored receipts, heals stranded generations, prunes (decisions 106, 123).

A failed pass is logged, counted and retried after a doubling back-off, cut short when the
database becomes usable again (``wake``, decision 187); the loop's health is reported beside
the service's own (decision 109).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from nexuscrm_connectors.errors import ProtocolMissing
from nexuscrm_connectors.metrics import MATERIALIZER_FAILURES, MATERIALIZER_HEALTHY
from nexuscrm_connectors.queries import receipts as receipts_sql
from nexuscrm_connectors.queue.admission import Admission
from nexuscrm_connectors.queue.deliveries import Delivery
from nexuscrm_connectors.settings import Settings
from nexuscrm_runtime.budgets import within_bytes
from workqueue import decode_projection_key
from workqueue.errors import DomainError
from workqueue.values import ACKNOWLEDGED_OUTCOMES, IngestItem, Route

log = logging.getLogger(__name__)

HEALTH_NAME = "nexuscrm.connectors.v1.ConnectorsService/materializer"  # the gRPC health service name
MAX_BACKOFF_SECONDS = 60.0  # seconds: the longest wait after repeated failed passes


class Passes(Protocol):
    """What the loop runs each pass (``service.Connectors``)."""

    @property
    def settings(self) -> Settings: ...

    def materialize(self, limit: int = 500) -> int: ...

    def heal_stranded(self) -> int: ...

    def prune_pass(self) -> object: ...


def materialize(admission: Admission, limit: int = 500) -> int:
    """Admit stored, unconfirmed receipts (left by a fence or a crash); return how many were acknowledged.

    Each pack with such receipts gets its oldest ``limit`` admitted in one batch, cut to the
    oldest that fit in ``settings.max_transaction_bytes`` of payload (at least one), so a pack
    that stays fenced never starves the others and no batch exceeds TiDB's transaction size.
    Packs are found one index seek each (``receipt_pack_stored_after``). Packs without a
    protocol row are skipped, and so is a pack whose admission fails (a conflict that outlasted
    its retries, the database away): it is logged and retried by the next pass, and the packs
    admitted already are still counted.
    """
    engine, settings = admission.engine, admission.settings
    acknowledged = 0
    pack_install_id = ""
    while True:
        with engine.connect() as connection:
            next_pack = receipts_sql.receipt_pack_stored_after(connection, pack_install_id)
            if next_pack is None:
                break
            pack_install_id = next_pack
            sizes = receipts_sql.receipts_stored_sizes(connection, pack_install_id, limit)
            keys = within_bytes([(row.ReceiptKey, row.PayloadBytes) for row in sizes], settings.max_transaction_bytes)
            stored = receipts_sql.receipts_stored_list(connection, pack_install_id, keys)
        deliveries = [
            Delivery(
                item=IngestItem(
                    receipt_key=row.ReceiptKey,
                    route=Route.of(decode_projection_key(row.ProjectionKey)),
                    payload=row.Payload,
                    source_time=row.SourceTime,
                ),
                projection_key=row.ProjectionKey,
                payload_hash=row.PayloadHash,
            )
            for row in stored
        ]
        try:
            results = admission.admit_batch(pack_install_id, deliveries)
        except ProtocolMissing as error:
            log.warning("materializer skipped pack %s: %s", pack_install_id, error)
            continue
        except DomainError as error:  # nothing of this pack committed; the next pass tries again
            log.warning("materializer could not admit pack %s this pass: %s", pack_install_id, error)
            continue
        acknowledged += sum(1 for r in results.values() if r.outcome in ACKNOWLEDGED_OUTCOMES)
    return acknowledged


class Materializer:
    """Runs ``Connectors.materialize`` and ``heal_stranded`` every ``settings.materialize_interval_seconds``.

    ``interval`` (seconds) overrides the settings' interval (tests). ``report(healthy)`` is
    called after each pass whose outcome differs from the previous one (and once at start):
    ``attach_health`` points it at a server's health servicer.
    """

    def __init__(self, connectors: Passes, *, interval: float | None = None) -> None:
        self._connectors = connectors
        self._interval = float(connectors.settings.materialize_interval_seconds if interval is None else interval)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="materializer", daemon=True)
        self._lock = threading.Lock()
        self._healthy = True
        self._report: Callable[[bool], None] | None = None
        self.failures = 0  # passes that raised, since start

    @property
    def healthy(self) -> bool:
        """Whether the last pass succeeded (True before the first)."""
        return self._healthy

    def attach_health(self, report: Callable[[bool], None]) -> None:
        """Report the current health now and every change from here on through ``report``."""
        with self._lock:
            self._report = report
            report(self._healthy)

    def start(self) -> None:
        """Start the loop (a no-op when the interval is 0)."""
        MATERIALIZER_HEALTHY.set(1)
        if self._interval:
            self._thread.start()

    def wake(self) -> None:
        """Run the next pass now, whatever the back-off (the database became usable again: ``readiness``)."""
        self._wake.set()

    def stop(self) -> None:
        """Stop the loop and wait for the pass in progress."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()

    def is_running(self) -> bool:
        """Whether the loop's thread is alive."""
        return self._thread.is_alive()

    def _set_healthy(self, healthy: bool) -> None:
        MATERIALIZER_HEALTHY.set(1 if healthy else 0)
        with self._lock:
            changed, self._healthy = healthy != self._healthy, healthy
            if changed and self._report is not None:
                self._report(healthy)

    def _step(self, name: str, run: Callable[[], object]) -> bool:
        try:
            result = run()
        except DomainError as error:  # the database may be away; try again after the back-off
            log.warning("%s failed: %s", name, error)
        except Exception:
            log.exception("%s failed unexpectedly; retrying after a back-off", name)
        else:
            if name == "materializer pass" and result:
                log.info("materializer acknowledged %d stored receipts", result)
            return True
        self.failures += 1
        MATERIALIZER_FAILURES.labels(name.split()[0]).inc()
        return False

    def _run(self) -> None:
        wait = self._interval
        while True:
            self._wake.wait(wait)
            self._wake.clear()
            if self._stop.is_set():
                return
            materialized = self._step("materializer pass", self._connectors.materialize)
            healed = self._step("stranded-generation sweep", self._connectors.heal_stranded)
            pruned = self._step("retention pass", self._connectors.prune_pass)
            ok = materialized and healed and pruned
            self._set_healthy(ok)
            wait = self._interval if ok else min(max(wait, self._interval) * 2, MAX_BACKOFF_SECONDS)
