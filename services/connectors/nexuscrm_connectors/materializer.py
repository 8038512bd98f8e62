"""The background materializer: admits receipts that were stored but not admitted.

Each pass also runs the liveness sweep (``Connectors.heal_stranded``): a blocked generation
whose predecessor is terminal becomes claimable within one interval.
"""

from __future__ import annotations

import logging
import threading

from nexuscrm_connectors.service import Connectors
from workqueue.errors import DomainError

log = logging.getLogger(__name__)


class Materializer:
    """Runs ``Connectors.materialize`` and ``heal_stranded`` every ``settings.materialize_interval_seconds``."""

    def __init__(self, connectors: Connectors) -> None:
        self._connectors = connectors
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="materializer", daemon=True)

    def start(self) -> None:
        """Start the loop (a no-op when the interval is 0)."""
        if self._connectors.settings.materialize_interval_seconds:
            self._thread.start()

    def stop(self) -> None:
        """Stop the loop and wait for the pass in progress."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        interval = self._connectors.settings.materialize_interval_seconds
        while not self._stop.wait(interval):
            try:
                admitted = self._connectors.materialize()
            except DomainError as error:  # the database may be away; try again next pass
                log.warning("materializer pass failed: %s", error)
            else:
                if admitted:
                    log.info("materializer acknowledged %d stored receipts", admitted)
            try:  # the sweep runs even when admission failed: it is the liveness backstop
                self._connectors.heal_stranded()
            except DomainError as error:
                log.warning("stranded-generation sweep failed: %s", error)
