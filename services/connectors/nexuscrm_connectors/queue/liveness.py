"""The liveness backstop: blocked generations whose predecessor is terminal become claimable (decision 106).

Nothing should be left blocked (the transaction that ends a predecessor unblocks its
successor); the sweep is the bounded backstop docs/design.md asks for, "Multi-primary engines".
"""

from __future__ import annotations

import functools
import logging
import threading

from sqlalchemy.engine import Connection, Engine

from nexuscrm_connectors.queries import operator_reads as operator_reads_sql
from nexuscrm_connectors.queries import work_items as work_items_sql
from nexuscrm_runtime.clock import DatabaseClock
from nexuscrm_runtime.database import run_transaction
from workqueue.statuses import TERMINAL_WORK_STATUSES

log = logging.getLogger(__name__)

SWEEP_LIMIT = 500  # blocked generations read per pack per pass


class StrandedSweep:
    """Heals stranded generations a bounded page per pack at a time; remembers where each pack's page ended."""

    def __init__(self, limit: int = SWEEP_LIMIT) -> None:
        self._limit = limit
        self._after: dict[str, str] = {}  # pack -> last WorkId read
        self._lock = threading.Lock()  # one pass at a time

    def run(self, engine: Engine, clock: DatabaseClock) -> int:
        """One pass over every pack; returns how many generations it made claimable."""
        with self._lock:
            with engine.connect() as connection:
                pack_ids = operator_reads_sql.packs_list(connection)
            healed = 0
            for pack_install_id in pack_ids:
                after = self._after.get(pack_install_id, "")
                page = functools.partial(self._page, clock=clock, pack_install_id=pack_install_id, after=after)
                count, last = run_transaction(engine, page, name="stranded sweep")
                self._after[pack_install_id] = last
                healed += count
            return healed

    def _page(
        self, connection: Connection, *, clock: DatabaseClock, pack_install_id: str, after: str
    ) -> tuple[int, str]:
        page = work_items_sql.work_items_blocked_page(connection, pack_install_id, after, self._limit)
        stranded = [
            row.WorkId
            for row in page
            if row.PredecessorStatus is None or row.PredecessorStatus in TERMINAL_WORK_STATUSES
        ]
        healed = work_items_sql.work_items_unblock(connection, stranded, clock.read(connection)) if stranded else 0
        if healed:
            log.warning(
                "made %d blocked generations of pack %s claimable: their predecessor is terminal or missing: %s",
                healed,
                pack_install_id,
                stranded[:10],
            )
        last = page[-1].WorkId if len(page) == self._limit else ""  # a short page: start over next pass
        return healed, last
