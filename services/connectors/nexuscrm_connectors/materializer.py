"""The background materializer: admits receipts that were stored but not admitted.

Each pass also runs the liveness sweep (``Connectors.heal_stranded``): a blocked generation
whose predecessor is terminal becomes claimable within one interval; and the retention pass
(``Connectors.prune_pass``), which prunes what each pack's retention policy lets go, bounded
per pack (decision 123).

The loop is supervised: a pass that raises anything (a domain error when the database is
away, or a bug) is logged once, counted in ``nexuscrm_materializer_failures_total``, and the
next pass comes after a doubling back-off (up to ``MAX_BACKOFF_SECONDS``); the thread never
ends while the service serves. ``nexuscrm_materializer_healthy`` and the health status of
``HEALTH_NAME`` (SERVING / NOT_SERVING, beside the service's own, which stays SERVING: the
RPCs still work) say whether the last pass succeeded
(docs/decisions/109-transport-fails-closed.md).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from nexuscrm_connectors.metrics import MATERIALIZER_FAILURES, MATERIALIZER_HEALTHY
from nexuscrm_connectors.service import Connectors
from workqueue.errors import DomainError

log = logging.getLogger(__name__)

HEALTH_NAME = "nexuscrm.connectors.v1.ConnectorsService/materializer"  # the gRPC health service name
MAX_BACKOFF_SECONDS = 60.0  # seconds: the longest wait after repeated failed passes


class Materializer:
    """Runs ``Connectors.materialize`` and ``heal_stranded`` every ``settings.materialize_interval_seconds``.

    ``interval`` (seconds) overrides the settings' interval (tests). ``report(healthy)`` is
    called after each pass whose outcome differs from the previous one (and once at start):
    ``attach_health`` points it at a server's health servicer.
    """

    def __init__(self, connectors: Connectors, *, interval: float | None = None) -> None:
        self._connectors = connectors
        self._interval = float(connectors.settings.materialize_interval_seconds if interval is None else interval)
        self._stop = threading.Event()
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

    def stop(self) -> None:
        """Stop the loop and wait for the pass in progress."""
        self._stop.set()
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
        while not self._stop.wait(wait):
            materialized = self._step("materializer pass", self._connectors.materialize)
            healed = self._step("stranded-generation sweep", self._connectors.heal_stranded)
            pruned = self._step("retention pass", self._connectors.prune_pass)
            ok = materialized and healed and pruned
            self._set_healthy(ok)
            wait = self._interval if ok else min(max(wait, self._interval) * 2, MAX_BACKOFF_SECONDS)
