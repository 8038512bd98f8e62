"""The Integration host's gauges, read from its workers at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from nexuscrm_integration.host import HostStatus


class WorkerClockCollector(Collector):
    """``nexuscrm_worker_clock_skew_seconds`` per worker: this host's wall clock minus the database's.

    Leases, retries and fences are judged on the database's clock, so a skewed
    host breaks nothing; the gauge shows the skew so that operators fix the host's time sync
    before its own logs and Flows' timestamps mislead. One sample per worker
    that has measured it; the label set is bounded by the configured pool sizes.
    """

    def __init__(self, status: HostStatus) -> None:
        self._status = status

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """One sample per worker with a measured skew."""
        skew = GaugeMetricFamily(
            "nexuscrm_worker_clock_skew_seconds",
            "This host's wall clock minus the database's, measured from the worker's last lease grant.",
            labels=["worker"],
        )
        for worker in self._status.workers():
            if worker.clock_skew_seconds is not None:
                skew.add_metric([worker.worker_id], worker.clock_skew_seconds)
        yield skew
