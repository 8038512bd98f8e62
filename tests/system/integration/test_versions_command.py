"""``nexuscrm versions`` against a stand-in Connectors that serves the Flow-version RPCs (decision 185).

The stand-in keeps a work type's versions in memory: a build catches up a little on each
read, a switch refuses a version that is behind unless forced, a retire refuses the live
version. ``build --wait`` follows the build to standby; ``verify`` waits for both versions at
the ordinal, then compares the example Flow's digests (``examples/deal_alerts.py``) of two
read models built over the SDK's in-memory source: equal for the same Flow, the differing
identity listed for a deliberately different one (exit 9), coverage only for a Flow without a
digest; each verdict is recorded. Refusals exit as every command's do, nothing recorded.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from examples import deal_alerts
from nexuscrm.connectors.v1 import connectors_pb2 as cn_pb
from nexuscrm.connectors.v1 import connectors_pb2_grpc as cn_grpc
from nexuscrm_runtime.server import Registration, RunningServer, create_server
from nexuscrm_sdk import Flow, FlowContext, Generation, InMemoryWorkSource, Worker
from nexuscrm_tools import cli
from nexuscrm_tools.clients import CONNECTORS, SERVICES
from nexuscrm_tools.commands import flow_versions
from nexuscrm_wire import convert
from tests.connectors.unit.test_example_deal_alerts import PACK, WORK_TYPE, RoundedAmounts, identity
from tests.system.acceptance.test_cli_discovery_and_exit_codes import run
from tests.system.acceptance.test_operating_cli import refused
from workqueue.errors import DomainError, ErrorKind
from workqueue.values import Route

INVARIANTS_NOT_CHECKED = "a stand-in Connectors in memory and the example Flow's SQLite read models"

LANES = ("a", "b")


def rounded(context: FlowContext) -> RoundedAmounts:
    return RoundedAmounts(deal_alerts.open_database(context.settings["database"]))


def plain(context: FlowContext) -> Flow:
    def project(generation: Generation) -> None:
        for _ in generation.inputs:
            pass

    return project


class StandIn(cn_grpc.ConnectorsServiceServicer):
    """The version RPCs over one pack's versions in memory; a build catches up two inputs per read."""

    def __init__(self) -> None:
        self.versions = {
            "1": cn_pb.FlowVersion(
                pack_install_id=PACK,
                work_type=WORK_TYPE,
                version="1",
                source_version="1",
                state=cn_pb.FLOW_VERSION_STATE_LIVE,
                cover_from_ordinal=1,
                catch_up_through_ordinal=4,
                high_water_ordinal=4,
                inputs_total=4,
                inputs_done=4,
                generations_total=2,
                generations_done=2,
            )
        }
        self.recorded: list[cn_pb.RecordFlowVersionVerificationRequest] = []
        self.generation_reads: list[str] = []  # the companion version of each ListGenerations route
        self.first_pending = True  # version 2's first read finds one generation still pending

    def BuildFlowVersion(self, request: cn_pb.BuildFlowVersionRequest, context: object) -> Any:
        if request.version in self.versions:
            raise DomainError(f"version {request.version} of {request.work_type} exists", kind=ErrorKind.ALREADY_EXISTS)
        built = cn_pb.FlowVersion(
            pack_install_id=PACK,
            work_type=request.work_type,
            version=request.version,
            source_version="1",
            state=cn_pb.FLOW_VERSION_STATE_BUILDING,
            cover_from_ordinal=1,
            high_water_ordinal=4,
            inputs_total=4,
            generations_total=2,
            generations_done=1,  # by the counts one is not done: verify looks at each identity
            max_inputs_per_second=request.max_inputs_per_second,
        )
        self.versions[request.version] = built
        return cn_pb.BuildFlowVersionResponse(version=built, catch_up_generations=2, catch_up_inputs=4)

    def ListFlowVersions(self, request: cn_pb.ListFlowVersionsRequest, context: object) -> Any:
        for version in self.versions.values():
            if version.state == cn_pb.FLOW_VERSION_STATE_BUILDING:
                version.inputs_done += 2
                version.inputs_per_second, version.seconds_left = 2.0, 1
                if version.inputs_done == version.inputs_total:
                    version.state, version.catch_up_through_ordinal, version.seconds_left = (
                        cn_pb.FLOW_VERSION_STATE_STANDBY,
                        4,
                        0,
                    )
        return cn_pb.ListFlowVersionsResponse(versions=list(self.versions.values()))

    def SwitchFlowVersion(self, request: cn_pb.SwitchFlowVersionRequest, context: object) -> Any:
        target = self.versions[request.version]
        if target.state == cn_pb.FLOW_VERSION_STATE_BUILDING and not request.force:
            raise DomainError(f"version {request.version} is behind", kind=ErrorKind.FAILED_PRECONDITION)
        (live,) = [v for v in self.versions.values() if v.state == cn_pb.FLOW_VERSION_STATE_LIVE]
        live.state, live.cover_through_ordinal = cn_pb.FLOW_VERSION_STATE_STOPPED, 4
        target.state = cn_pb.FLOW_VERSION_STATE_LIVE
        return cn_pb.SwitchFlowVersionResponse(live=target, previous=live)

    def RetireFlowVersion(self, request: cn_pb.RetireFlowVersionRequest, context: object) -> Any:
        version = self.versions[request.version]
        if version.state == cn_pb.FLOW_VERSION_STATE_LIVE:
            raise DomainError(f"version {request.version} is live", kind=ErrorKind.FAILED_PRECONDITION)
        version.state = cn_pb.FLOW_VERSION_STATE_RETIRED
        version.retired_at.FromSeconds(1_800_000_000)
        return cn_pb.RetireFlowVersionResponse(version=version)

    def RecordFlowVersionVerification(
        self, request: cn_pb.RecordFlowVersionVerificationRequest, context: object
    ) -> Any:
        self.recorded.append(request)
        version = self.versions[request.version]
        version.verified_against, version.verified_through_ordinal = request.against_version, request.through_ordinal
        version.verdict = request.verdict
        return cn_pb.RecordFlowVersionVerificationResponse(version=version)

    def ListIdentities(self, request: cn_pb.ListIdentitiesRequest, context: object) -> Any:
        routes = [convert.route_to_proto(Route.of(identity(lane))) for lane in LANES]
        wanted = request.route
        kept = [r for r in routes if (r.work_type, r.companion_version) == (wanted.work_type, wanted.companion_version)]
        return cn_pb.ListIdentitiesResponse(identities=[cn_pb.IdentityOverview(route=r) for r in kept])

    def ListGenerations(self, request: cn_pb.ListGenerationsRequest, context: object) -> Any:
        self.generation_reads.append(request.route.companion_version)
        pending = request.route.companion_version == "2" and request.status == cn_pb.WORK_STATUS_PENDING
        if pending and self.first_pending:
            self.first_pending = False
            return cn_pb.ListGenerationsResponse(generations=[cn_pb.WorkItem(work_id="w-2", input_start_ordinal=1)])
        return cn_pb.ListGenerationsResponse()


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIn]:
    servicer = StandIn()
    registration = Registration(
        servicer=servicer,
        add=cn_grpc.add_ConnectorsServiceServicer_to_server,
        service_name=CONNECTORS.full_name,
        rules={},
    )
    running: RunningServer = create_server([registration], "127.0.0.1:0")
    for service in SERVICES:
        monkeypatch.delenv(service.variable, raising=False)
    monkeypatch.setenv(CONNECTORS.variable, f"127.0.0.1:{running.port}")
    monkeypatch.setattr(flow_versions, "POLL_INTERVAL", 0.0)
    yield servicer
    running.stop(0)


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The message of a command refused before any change: exit 2 with its usage."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        cli.main(list(argv))
    assert exited.value.code == 2, argv
    return capsys.readouterr().err


def read_models(tmp_path: Path) -> dict[str, str]:
    """The read models of the example Flow's versions 1 and 2 and of version 3 (rounded), over the same inputs."""
    source = InMemoryWorkSource()
    for lane, amount in zip(LANES, ("10.40", "7"), strict=True):
        deal = json.dumps({"deal_id": f"d-{lane}", "stage": "won", "amount": amount}).encode()
        source.add_inputs(identity(lane), payloads=[deal, deal.replace(b"won", b"paid")])
    databases = {}
    for version, factory in (("1", deal_alerts.deal_alerts), ("2", deal_alerts.deal_alerts), ("3", rounded)):
        if version != "1":
            source.build_version(PACK, work_type=WORK_TYPE, version=version)
        databases[version] = f"sqlite:///{tmp_path / version}.db"
        flow = factory(
            FlowContext(
                pack_install_id=PACK,
                work_type=WORK_TYPE,
                engine=deal_alerts.open_database("sqlite://"),
                settings={"database": databases[version]},
            )
        )
        worker = Worker(source, flow, worker_id=f"w{version}", flow_versions=[version] if version != "1" else [])
        while worker.run_once():
            pass
    return databases


def test_build_waits_to_standby_switch_refuses_a_version_behind_and_retire_the_live_one(
    stand_in: StandIn, capsys: pytest.CaptureFixture[str]
) -> None:
    by = ("--by", "ops@acme", "--reason", "new read model")
    built = run(capsys, "versions", "build", PACK, "--work-type", WORK_TYPE, "--version", "2", "--max-rate", "50", *by)
    assert (built["version"]["state"], built["catch_up_inputs"]) == ("building", 4)
    assert stand_in.versions["2"].max_inputs_per_second == 50
    exists = refused(capsys, "versions", "build", PACK, "--work-type", WORK_TYPE, "--version", "2", *by, code=8)
    assert "version 2 of deal-alerts exists" in exists
    switch = ("versions", "switch", PACK, "--work-type", WORK_TYPE, "--version", "2", *by)
    assert "version 2 is behind" in refused(capsys, *switch, code=8)
    listed = run(capsys, "versions", "list", PACK, "--watch")  # until version 2 caught up
    assert {v["version"]: v["state"] for v in listed["versions"]} == {"1": "live", "2": "standby"}
    assert {v["version"]: v["inputs_done"] for v in listed["versions"]} == {"1": 4, "2": 4}
    switched = run(capsys, *switch)
    assert (switched["live"]["version"], switched["previous"]["state"]) == ("2", "stopped")
    retire = ("versions", "retire", PACK, "--work-type", WORK_TYPE, "--by", "ops@acme", "--reason", "done")
    assert "version 2 is live" in refused(capsys, *retire, "--version", "2", code=8)
    assert run(capsys, *retire, "--version", "1")["state"] == "retired"
    assert stand_in.recorded == []  # nothing verified


def test_build_wait_shows_progress_until_it_caught_up(stand_in: StandIn, capsys: pytest.CaptureFixture[str]) -> None:
    by = ("--by", "ops@acme", "--reason", "new read model")
    capsys.readouterr()
    assert cli.main(["versions", "build", PACK, "--work-type", WORK_TYPE, "--version", "2", *by, "--wait"]) == 0
    out, err = capsys.readouterr()
    # Not a terminal: one progress line per read, inputs done of total, rate and time left.
    assert "deal-alerts 2 building: 2 of 4 inputs, 2.0/s, 0:00:01 left" in err
    assert "deal-alerts 2 standby: 4 of 4 inputs" in err and "caught up" in out


def test_verify_records_equal_then_lists_the_identity_that_differs_and_says_coverage_only_without_a_digest(
    stand_in: StandIn, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    databases = read_models(tmp_path)
    by = ("--by", "ops@acme", "--reason", "new read model")
    for version in ("2", "3"):
        run(capsys, "versions", "build", PACK, "--work-type", WORK_TYPE, "--version", version, *by)
    verify = ("versions", "verify", PACK, "--work-type", WORK_TYPE, "--against", "1")
    flows = ("--against-flow", "examples.deal_alerts:deal_alerts", "--against-setting", f"database={databases['1']}")
    common = (*verify, *flows, "--dsn", "sqlite://", "--by", "ops@acme")
    second = (*common, "--version", "2", "--setting", f"database={databases['2']}")
    third = (*common, "--version", "3", "--setting", f"database={databases['3']}", "--flow", f"{__name__}:rounded")

    equal = run(capsys, *second, "--flow", "examples.deal_alerts:deal_alerts")
    assert (equal["verdict"], equal["through_ordinal"], equal["identities"], equal["differing"]) == ("equal", 4, 2, [])
    assert "2" in stand_in.generation_reads  # each identity of version 2 looked at ...
    assert "1" not in stand_in.generation_reads  # ... none of version 1, whose every generation is done
    assert not stand_in.first_pending  # it waited for version 2's pending generation

    different = run(capsys, *third, code=9)
    (differs,) = different["differing"]
    assert differs["projection_key"] == identity("a").key and differs["digest"] != differs["against_digest"]
    assert different["version"]["verdict"] == "different"
    capsys.readouterr()
    assert cli.main(list(third)) == 9
    table = capsys.readouterr().out
    assert "1 identity differ" in table and differs["digest"] in table and differs["against_digest"] in table

    coverage = run(capsys, *second, "--flow", f"{__name__}:plain")
    assert coverage["verdict"] == "coverage_only" and coverage["differing"] == []
    verdicts = [(r.version, r.verdict, list(r.differing_projection_keys), r.through_ordinal) for r in stand_in.recorded]
    assert verdicts == [
        ("2", cn_pb.FLOW_VERSION_VERDICT_EQUAL, [], 4),
        ("3", cn_pb.FLOW_VERSION_VERDICT_DIFFERENT, [identity("a").key], 4),
        ("3", cn_pb.FLOW_VERSION_VERDICT_DIFFERENT, [identity("a").key], 4),
        ("2", cn_pb.FLOW_VERSION_VERDICT_COVERAGE_ONLY, [], 4),
    ]

    unknown = usage_error(capsys, *second, "--flow", "examples.deal_alerts:deal_alerts", "--against", "7")
    assert "has no version 7; it has ['1', '2', '3']" in unknown
    assert "flow 'no_such_module:f' cannot be imported" in usage_error(capsys, *second, "--flow", "no_such_module:f")
    assert len(stand_in.recorded) == 4  # refusals record nothing
