"""Per-version gauges (``operating.flow_version_gauges``): a scrape through a build, a switch and a retire."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry, generate_latest

from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.operating import flow_versions
from nexuscrm_connectors.operating.flow_version_gauges import FlowVersionCollector
from nexuscrm_runtime.database import create_engine
from tests.support.factories import install_pack, route
from tests.support.invariants import assert_invariants
from workqueue.values import IngestItem

pytestmark = pytest.mark.database

V1, V2 = "crm-1.0", "crm-2.0"  # the version deliveries carry (tests.support.factories.route), and the new


def _registry(connectors: Connectors) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(FlowVersionCollector(connectors.context))
    return registry


def _scrape(connectors: Connectors) -> dict[tuple[str, ...], float]:
    """Every sample of one scrape, by (name, label values...)."""
    samples = {}
    for family in _registry(connectors).collect():
        for sample in family.samples:
            samples[(sample.name, *sample.labels.values())] = sample.value
    return samples


def _complete_all(connectors: Connectors, pack: str, versions: Sequence[str] = ()) -> int:
    done = 0
    while claims := connectors.claim("w", pack_install_ids=[pack], flow_versions=versions, max_items=10):
        for claim in claims:
            connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
            done += 1
    return done


def test_a_scrape_reports_each_version_as_list_flow_versions_does_until_it_is_retired(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack, other = install_pack(engine), install_pack(engine)  # the other pack has no versions: no samples
    items = [IngestItem(receipt_key=f"r-{n}", route=route(f"lane-{n % 3}"), payload=b"x") for n in range(30)]
    connectors.ingest(pack, items=items)
    connectors.ingest(other, items=items[:5])
    _complete_all(connectors, pack)
    flow_versions.build(
        connectors.context,
        pack,
        "project",
        V2,
        from_retained=False,
        max_inputs_per_second=0,
        started_by="ops",
        reason="v2",
    )

    building = _scrape(connectors)
    labels = (pack, "project", V2)
    assert building[("nexuscrm_flow_version_state", *labels, "building")] == 1
    assert building[("nexuscrm_flow_version_state", *labels, "live")] == 0
    assert building[("nexuscrm_flow_version_state", pack, "project", V1, "live")] == 1
    assert building[("nexuscrm_flow_version_inputs", *labels, "covered")] == 30
    assert building[("nexuscrm_flow_version_inputs", *labels, "done")] == 0
    assert building[("nexuscrm_flow_version_catch_up_behind", *labels)] == 3  # one catch-up per lane
    assert building[("nexuscrm_flow_version_high_water_ordinal", *labels)] == 30
    assert not any(other in key for key in building)

    assert _complete_all(connectors, pack, [V2]) == 3
    caught_up = _scrape(connectors)
    views = {view.track.version: view for view in flow_versions.list_versions(connectors.context, pack)}
    assert caught_up[("nexuscrm_flow_version_state", *labels, "standby")] == 1
    assert caught_up[("nexuscrm_flow_version_inputs", *labels, "done")] == 30
    assert caught_up[("nexuscrm_flow_version_catch_up_behind", *labels)] == 0
    assert caught_up[("nexuscrm_flow_version_inputs_per_second", *labels)] == views[V2].inputs_per_second == 0.5
    assert caught_up[("nexuscrm_flow_version_seconds_left", *labels)] == views[V2].seconds_left == 0

    flow_versions.switch(connectors.context, pack, "project", V2, switched_by="ops", reason="ship")
    flow_versions.retire(connectors.context, pack, "project", V1, retired_by="ops", reason="done")
    retired = _scrape(connectors)
    assert retired[("nexuscrm_flow_version_state", *labels, "live")] == 1
    assert not any(V1 in key for key in retired)  # a retired version's label sets end with its track
    assert b"nexuscrm_flow_version_state" in generate_latest(_registry(connectors))
    assert_invariants(engine)


def test_a_database_error_drops_the_scrape_instead_of_failing_it(
    connectors: Connectors, caplog: pytest.LogCaptureFixture
) -> None:
    broken = create_engine("sqlite:////nonexistent-directory/nexuscrm.db")
    registry = CollectorRegistry()
    registry.register(FlowVersionCollector(dataclasses.replace(connectors.context, engine=broken)))
    with caplog.at_level(logging.WARNING):
        assert list(registry.collect()) == []
    assert "Flow version gauges skipped this scrape: OperationalError" in caplog.text
