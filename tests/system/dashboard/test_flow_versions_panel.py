"""The dashboard's Flow-versions panel (decision 185), on every backend, over a stand-in Connectors.

Per listed pack, each work type's versions as ListFlowVersions answers them: state, inputs
done of the total, rate, time left, the verification and the recorded steps; a pack
Connectors does not know has none. The endpoint answers what ``operations.flow_versions``
returns, and the page has the panel it fills.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from nexuscrm.connectors.v1 import connectors_pb2 as cn_pb
from nexuscrm.connectors.v1 import connectors_pb2_grpc as cn_grpc
from nexuscrm_controlplane.dashboard import operations
from nexuscrm_controlplane.dashboard.app import create_app
from nexuscrm_controlplane.dashboard.connectors import ConnectorsReads, connectors_reads
from nexuscrm_controlplane.dashboard.server import DashboardServer
from nexuscrm_controlplane.dashboard.workers import integration_hosts
from nexuscrm_runtime.server import Registration, create_server
from nexuscrm_runtime.targets import Targets
from nexuscrm_tools.clients import CONNECTORS
from tests.support.factories import install_pack
from tests.support.invariants import assert_invariants
from workqueue.errors import DomainError, ErrorKind

pytestmark = pytest.mark.database


class VersionsOf(cn_grpc.ConnectorsServiceServicer):
    """ListFlowVersions for one pack: version 1 live, version 2 building and verified; NOT_FOUND for others."""

    def __init__(self, pack: str) -> None:
        self.pack = pack

    def ListFlowVersions(self, request: cn_pb.ListFlowVersionsRequest, context: object) -> Any:
        if request.pack_install_id != self.pack:
            raise DomainError(f"pack {request.pack_install_id} is not installed", kind=ErrorKind.NOT_FOUND)
        live = cn_pb.FlowVersion(
            pack_install_id=self.pack,
            work_type="project",
            version="1",
            source_version="1",
            state=cn_pb.FLOW_VERSION_STATE_LIVE,
            inputs_total=120,
            inputs_done=118,
            high_water_ordinal=120,
        )
        building = cn_pb.FlowVersion(
            pack_install_id=self.pack,
            work_type="project",
            version="2",
            source_version="1",
            state=cn_pb.FLOW_VERSION_STATE_BUILDING,
            inputs_total=120,
            inputs_done=30,
            generations_failed=1,
            inputs_per_second=9.0,
            seconds_left=10,
            verified_against="1",
            verified_through_ordinal=25,
            verdict=cn_pb.FLOW_VERSION_VERDICT_EQUAL,
            changes=[
                cn_pb.FlowVersionChange(version="2", action="build", actor="ops@acme", reason="v2", at_ordinal=90)
            ],
        )
        building.verified_at.FromSeconds(1_800_000_000)
        return cn_pb.ListFlowVersionsResponse(versions=[live, building])


@pytest.fixture
def reads(engine: sa.Engine) -> Iterator[tuple[str, ConnectorsReads]]:
    """An installed pack, and the dashboard's reads of a Connectors that knows its versions."""
    pack = install_pack(engine)
    registration = Registration(
        servicer=VersionsOf(pack),
        add=cn_grpc.add_ConnectorsServiceServicer_to_server,
        service_name=CONNECTORS.full_name,
        rules={},
    )
    running = create_server([registration], "127.0.0.1:0")
    with connectors_reads(Targets(connectors=f"127.0.0.1:{running.port}"), None) as connectors:
        yield pack, connectors
    running.stop(0)


def test_each_pack_lists_its_work_types_versions_with_state_progress_and_verification(
    engine: sa.Engine, reads: tuple[str, ConnectorsReads], unreachable_target: str
) -> None:
    pack, connectors = reads
    unknown = install_pack(engine)  # installed, but Connectors knows no version of it
    panel = operations.flow_versions(engine, connectors)
    packs = {p["pack_install_id"]: p for p in panel["packs"]}
    assert packs[unknown]["work_types"] == []
    (project,) = packs[pack]["work_types"]
    assert project["work_type"] == "project"
    shown = {v["version"]: v for v in project["versions"]}
    assert {name: v["state"] for name, v in shown.items()} == {"1": "live", "2": "building"}
    two = shown["2"]
    assert (two["inputs_done"], two["inputs_total"], two["inputs_per_second"], two["seconds_left"]) == (
        30,
        120,
        9.0,
        10,
    )
    assert two["generations_failed"] == 1 and shown["1"]["verification"] is None
    assert two["verification"] == {
        "verdict": "equal",
        "against": "1",
        "through_ordinal": 25,
        "verified_at": "2027-01-15T08:00:00.000Z",
    }
    assert [(c["action"], c["actor"], c["at_ordinal"]) for c in two["changes"]] == [("build", "ops@acme", 90)]

    with integration_hosts([unreachable_target], None) as workers:
        server = DashboardServer(create_app(engine, connectors=connectors, workers=workers), "127.0.0.1:0")
        server.start()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/api/flow-versions", timeout=30) as response:
                assert json.loads(response.read()) == panel
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/", timeout=30) as response:
                assert 'id="flow-versions"' in response.read().decode()
        finally:
            server.stop()
    assert_invariants(engine)
