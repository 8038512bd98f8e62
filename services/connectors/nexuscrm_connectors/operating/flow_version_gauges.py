"""Per-version gauges for Prometheus: each Flow version's state and progress, read at scrape time.

Registered by Connectors when its metrics endpoint serves. A scrape lists the versions of up
to ``PACK_LIMIT`` packs that have one not retired, as ListFlowVersions answers them (retired
versions are left out, so a label set ends with its track). Every replica reports the same
values: aggregate with ``max by (pack, work_type, version)``. A database error drops the
gauges of that scrape (logged) instead of failing the endpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric, StateSetMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy.exc import SQLAlchemyError

from nexuscrm_connectors.context import Context
from nexuscrm_connectors.operating.flow_versions import STATES, list_versions
from nexuscrm_connectors.queries import flow_versions as flow_versions_sql

log = logging.getLogger(__name__)
PACK_LIMIT = 100
LABELS = ["pack", "work_type", "version"]


class FlowVersionCollector(Collector):
    """State, inputs covered and done, the pack's high-water mark, rate, time left and failures per version."""

    def __init__(self, context: Context) -> None:
        self._context = context

    def collect(self) -> Iterator[Metric]:
        """One family per gauge, one sample per version not retired."""
        state = StateSetMetricFamily("nexuscrm_flow_version_state", "The version's state.", labels=LABELS)
        inputs = GaugeMetricFamily(
            "nexuscrm_flow_version_inputs",
            "Inputs of the version's generations (covered) and of its completed ones (done).",
            labels=[*LABELS, "progress"],
        )
        high_water = GaugeMetricFamily(
            "nexuscrm_flow_version_high_water_ordinal",
            "The pack's ordinal counter: the inputs a caught-up version covers.",
            labels=LABELS,
        )
        rate = GaugeMetricFamily(
            "nexuscrm_flow_version_inputs_per_second",
            "Inputs completed per second over the last minute.",
            labels=LABELS,
        )
        left = GaugeMetricFamily(
            "nexuscrm_flow_version_seconds_left",
            "Seconds until the inputs not done yet are done at that rate (0 with nothing left or no rate).",
            labels=LABELS,
        )
        behind = GaugeMetricFamily(
            "nexuscrm_flow_version_catch_up_behind",
            "Catch-up generations not completed (nonterminal or failed): a switch to the version is refused while "
            "this is above 0.",
            labels=LABELS,
        )
        failed = GaugeMetricFamily(
            "nexuscrm_flow_version_generations_failed", "The version's generations that failed for good.", labels=LABELS
        )
        try:
            with self._context.engine.connect() as connection:
                packs = flow_versions_sql.packs_with_versions(connection, PACK_LIMIT)
            views = [view for pack in packs for view in list_versions(self._context, pack)]
        except SQLAlchemyError as error:
            log.warning("Flow version gauges skipped this scrape: %s", type(error).__name__)
            return
        for view in views:
            if view.state == "retired":
                continue
            track, progress = view.track, view.progress
            labels = [track.pack_install_id, track.work_type, track.version]
            state.add_metric(labels, {name: name == view.state for name in STATES})
            inputs.add_metric([*labels, "covered"], progress.inputs_total)
            inputs.add_metric([*labels, "done"], progress.inputs_done)
            high_water.add_metric(labels, view.high_water_ordinal)
            rate.add_metric(labels, view.inputs_per_second)
            left.add_metric(labels, view.seconds_left)
            behind.add_metric(labels, progress.behind)
            failed.add_metric(labels, progress.generations_failed)
        yield from (state, inputs, high_water, rate, left, behind, failed)

    def describe(self) -> Iterator[Metric]:
        """Nothing: describing would query the database at registration."""
        return iter(())
