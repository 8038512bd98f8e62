"""A pool with ``flow_version`` claims only that Flow version's generations; one without, the inputs' own."""

from __future__ import annotations

import dataclasses

import pytest
import sqlalchemy as sa

from nexuscrm_integration.activation import check_activation
from nexuscrm_integration.config import HostConfig, PoolConfig
from nexuscrm_integration.errors import HostConfigError
from nexuscrm_integration.host import WorkerHost
from nexuscrm_sdk.flows import Flow, FlowContext, Generation
from nexuscrm_sdk.testing import InMemoryWorkSource
from tests.integration_service.fakes import FakeProtocols, FakeSchema
from tests.support.waiting import wait_until
from workqueue import ProjectionIdentity, WorkStatus

INVARIANTS_NOT_CHECKED = "the host runs over an in-memory work source: no canonical database"

IDENTITY = ProjectionIdentity(
    pack_install_id="pk-a",
    event_kind="contact.upsert",
    route_version="1",
    companion_version="1",
    work_type="t",
    source_lane="a",
)
# What each pool's Flow saw: (the context's version, the generation's version, live, ordinals).
SEEN: list[tuple[str, str, bool, tuple[int, ...]]] = []


def recording(context: FlowContext) -> Flow:
    def project(generation: Generation) -> None:
        ordinals = tuple(row.enqueue_ordinal for row in generation.inputs)
        SEEN.append((context.flow_version, generation.flow_version, generation.live, ordinals))

    return project


def test_pools_of_one_work_type_differ_by_flow_version_and_a_bad_version_is_refused() -> None:
    live = PoolConfig(pack_install_id="pk-a", work_type="t", flow="m:f")
    built = dataclasses.replace(live, flow_version="2")
    config = HostConfig(pools=(live, built))
    assert [pool.name for pool in config.pools] == ["pk-a/t", "pk-a/t@2"]
    with pytest.raises(HostConfigError, match="more than one pool"):
        HostConfig(pools=(built, built))
    for bad in (" 2", 2):
        with pytest.raises(HostConfigError) as refused:
            PoolConfig.from_mapping(
                {"pack_install_id": "pk-a", "work_type": "t", "flow": "m:f", "flow_version": bad}, "t"
            )
        assert refused.value.field == "flow_version"


def test_a_version_pool_runs_the_build_and_the_live_pool_the_inputs_own_version() -> None:
    SEEN.clear()
    source = InMemoryWorkSource()
    source.add_inputs(IDENTITY, payloads=[b"x", b"y"])
    (built,) = source.build_version("pk-a", work_type="t", version="2")
    assert (built.flow_version, built.build_run) == ("2", True)
    flow = f"{__name__}:recording"
    pools = [
        PoolConfig(pack_install_id="pk-a", work_type="t", flow=flow, claim_wait_seconds=0, poll_interval_seconds=0.01),
        PoolConfig(
            pack_install_id="pk-a",
            work_type="t",
            flow=flow,
            flow_version="2",
            claim_wait_seconds=0,
            poll_interval_seconds=0.01,
        ),
    ]
    grant = check_activation(FakeSchema([]), FakeProtocols({"pk-a"}), ["pk-a"])
    host = WorkerHost(grant, pools, source, sa.create_engine("sqlite://"), host_id="h")
    assert sorted(info.worker_id for info in host.workers()) == ["h/t/1", "h/t@2/1"]
    host.start()
    wait_until(
        lambda: all(w.status is WorkStatus.COMPLETED for w in source.generations()),
        "both pools to complete their generations",
    )
    assert host.run_until_drained(timeout=10)
    assert sorted(SEEN) == [("", "1", True, (1, 2)), ("2", "2", False, (1, 2))]
