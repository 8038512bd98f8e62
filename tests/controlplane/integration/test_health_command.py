"""``nexuscrm health`` and ``nexuscrm version`` against a deployment of one owner (decision 177).

A stand-in Connectors (a gRPC server with health and GetBuildInfo only) is the one deployed
service: only NEXUSCRM_CONNECTORS_TARGET is set. ``version`` and ``health`` then ask it alone
and pass; ``health`` exits 3 when it reports NOT_SERVING, and ``--service`` names a service
that is not deployed, whose unreachable answer names the variable that sets its target.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from nexuscrm.buildinfo.v1.build_info_pb2 import BuildInfo, SchemaSupport
from nexuscrm.connectors.v1 import connectors_pb2 as cn_pb
from nexuscrm.connectors.v1 import connectors_pb2_grpc as cn_grpc
from nexuscrm_runtime.server import Registration, RunningServer, create_server
from nexuscrm_tools import cli
from nexuscrm_tools.clients import CONNECTORS, SERVICES, deployed

BUILD = BuildInfo(
    owner="connectors",
    package="nexuscrm-connectors",
    package_version="0.2.0",
    contract_version="1.6.0",
    schema_support=SchemaSupport(minimum=14, newest=14, forward_window=1),
    database_schema_version=14,
)


class _BuildInfoOnly(cn_grpc.ConnectorsServiceServicer):
    def GetBuildInfo(
        self, request: cn_pb.GetBuildInfoRequest, context: grpc.ServicerContext
    ) -> cn_pb.GetBuildInfoResponse:
        return cn_pb.GetBuildInfoResponse(build=BUILD)


@pytest.fixture
def connectors_alone(monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningServer]:
    """The stand-in serving, and the environment of a machine that deploys Connectors only."""
    registration = Registration(
        servicer=_BuildInfoOnly(),
        add=cn_grpc.add_ConnectorsServiceServicer_to_server,
        service_name=CONNECTORS.full_name,
        rules={},
    )
    running = create_server([registration], "127.0.0.1:0")
    for service in SERVICES:
        monkeypatch.delenv(service.variable, raising=False)
    monkeypatch.setenv(CONNECTORS.variable, f"127.0.0.1:{running.port}")
    yield running
    running.stop(0)


def _closed_port() -> int:
    with socket.socket() as probe:  # bound then closed: nothing listens there
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    capsys.readouterr()
    code = cli.main(["--json", *argv])
    return int(code), json.loads(capsys.readouterr().out)


def test_the_deployed_services_are_those_whose_target_is_set() -> None:
    assert deployed({CONNECTORS.variable: "h:1", "NEXUSCRM_CONNECTORS_ADDRESS": "x"}) == (CONNECTORS,)
    assert deployed({}) == SERVICES  # none set: a local run of all four on their default ports
    assert [s.name for s in SERVICES] == ["schema-catalog", "connectors", "controlplane", "integration"]


def test_version_and_health_check_only_the_deployed_owner(
    connectors_alone: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{connectors_alone.port}"
    code, versions = _run(capsys, "version")
    assert code == 0, versions
    assert [(s["service"], s["reply"], s["fit"]) for s in versions["services"]] == [
        ("connectors", "answered", "supported")
    ]

    code, health = _run(capsys, "health")
    assert (code, health) == (
        0,
        {
            "services": [
                {
                    "service": "connectors",
                    "target": address,
                    "target_variable": "NEXUSCRM_CONNECTORS_TARGET",
                    "health": "serving",
                }
            ],
            "serving": True,
        },
    )

    connectors_alone.set_health(CONNECTORS.full_name, False)
    code, health = _run(capsys, "health", "--service", "connectors")
    assert code == 3
    assert [(s["service"], s["health"]) for s in health["services"]] == [("connectors", "not_serving")]
    assert health["serving"] is False


def test_health_of_a_service_that_does_not_answer_names_its_variable(
    connectors_alone: RunningServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEXUSCRM_INTEGRATION_TARGET", f"127.0.0.1:{_closed_port()}")
    capsys.readouterr()
    assert cli.main(["health", "--service", "integration"]) == 3
    shown = capsys.readouterr().out
    assert "health: not serving: integration" in shown
    assert "unreachable (set NEXUSCRM_INTEGRATION_TARGET): UNAVAILABLE" in shown
    code, health = _run(capsys, "health")  # both deployed now: one serving, one silent
    assert code == 3
    assert [(s["service"], s["health"]) for s in health["services"]] == [
        ("connectors", "serving"),
        ("integration", "unreachable"),
    ]
