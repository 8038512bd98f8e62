"""Per-pack gauges for Prometheus, read from the database at scrape time.

Registered by Controlplane when its metrics endpoint serves. Each scrape runs the bounded,
indexed reads of ``overview.pack_queue`` for the newest ``overview.PACK_LIMIT`` packs; a
database error drops the gauges of that scrape (logged) instead of failing the endpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from nexuscrm_controlplane.dashboard import overview, queries
from nexuscrm_runtime.clock import DATABASE_CLOCK, DatabaseClock

log = logging.getLogger(__name__)


class QueueCollector(Collector):
    """Queue depth per pack and state, oldest unclaimed generation age, end-to-end lag, stranded work and more."""

    def __init__(self, engine: Engine, clock: DatabaseClock = DATABASE_CLOCK) -> None:
        self._engine = engine
        self._clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """One family per gauge, one sample per pack (and state)."""
        depth = GaugeMetricFamily(
            "nexuscrm_queue_depth", "Nonterminal generations per pack and state.", labels=["pack", "state"]
        )
        oldest = GaugeMetricFamily(
            "nexuscrm_oldest_unclaimed_generation_age_seconds",
            "Seconds since the oldest pending generation became claimable (0 when none waits).",
            labels=["pack"],
        )
        lag = GaugeMetricFamily(
            "nexuscrm_end_to_end_lag_seconds",
            "Age of the oldest admitted input no finished generation has executed yet (0 when none).",
            labels=["pack"],
        )
        expired = GaugeMetricFamily(
            "nexuscrm_leases_expired", "Processing generations whose lease expired, not reclaimed yet.", labels=["pack"]
        )
        stranded = GaugeMetricFamily(
            "nexuscrm_generations_stranded",
            f"Blocked generations per pack whose predecessor is terminal or missing, waiting for the "
            f"Connectors liveness sweep; counted up to {overview.COUNT_CAP}.",
            labels=["pack"],
        )
        failed = GaugeMetricFamily(
            "nexuscrm_generations_failed",
            f"Generations per pack that failed for good; counted up to {overview.COUNT_CAP}.",
            labels=["pack"],
        )
        dead_letters = GaugeMetricFamily(
            "nexuscrm_dead_letters",
            f"Generations per pack that failed for good and were neither replayed nor skipped, among its "
            f"{overview.COUNT_CAP} newest failures.",
            labels=["pack"],
        )
        receipts = GaugeMetricFamily(
            "nexuscrm_receipts",
            f"Receipts per pack waiting (stored: fenced or not materialized) or missing coverage; "
            f"counted up to {overview.COUNT_CAP}.",
            labels=["pack", "state"],
        )
        try:
            with self._engine.connect() as connection:
                now = self._clock.read(connection)  # ages and lag on the database's clock
                for row in queries.packs_list(connection, overview.PACK_LIMIT):
                    pack = row.PackInstallId
                    stats = overview.pack_queue(connection, pack, now)
                    for state, count in stats.depth.items():
                        depth.add_metric([pack, state], count)
                    oldest.add_metric([pack], stats.oldest_unclaimed_age_seconds or 0.0)
                    lag.add_metric([pack], stats.end_to_end_lag_seconds or 0.0)
                    expired.add_metric([pack], stats.leases_expired)
                    stranded.add_metric([pack], stats.stranded)
                    failed.add_metric([pack], stats.failed)
                    dead_letters.add_metric([pack], stats.dead_letters)
                    receipts.add_metric([pack, "stored"], stats.receipts_waiting)
                    receipts.add_metric([pack, "coverage_missing"], stats.receipts_coverage_missing)
        except SQLAlchemyError as error:
            log.warning("queue gauges skipped this scrape: %s", type(error).__name__)
            return
        yield from (depth, oldest, lag, expired, stranded, failed, dead_letters, receipts)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """Nothing: describing would query the database at registration."""
        return iter(())
