"""The Integration Service with the four services as real processes on the real database.

Activation gate refusals (no protocol receipt; no WorkItem.ReplayOfWorkId), serving after
activation, the demo projection end to end, SIGTERM during work, and the operator CLI.
"""

from __future__ import annotations

import datetime as dt
import json
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import sqlalchemy as sa

from nexuscrm.controlplane.v1 import controlplane_pb2 as cp_pb
from nexuscrm.controlplane.v1 import controlplane_pb2_grpc as cp_grpc
from nexuscrm.integration.v1 import integration_pb2 as in_pb
from nexuscrm.integration.v1 import integration_pb2_grpc as in_grpc
from nexuscrm_integration.main import EXIT_REFUSED
from nexuscrm_runtime.database import create_engine
from nexuscrm_schema.tables import WorkItem
from nexuscrm_schema_catalog import migrations
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_tools import cli, demo
from nexuscrm_tools import demo_queries as queries
from nexuscrm_tools.exits import ExitCode
from nexuscrm_tools.launcher import (
    CONNECTORS,
    CONTROLPLANE,
    INTEGRATION,
    SCHEMA_CATALOG,
    LaunchError,
    ServiceProcess,
    health_status,
    start_service,
    start_services,
    stop_services,
    target_env,
)
from nexuscrm_tools.run import demo_pools, run_demo, settled, start_host, start_system
from nexuscrm_tools.simulator import Simulator, WorkloadConfig, workload
from tests.support.invariants import assert_invariants
from tests.support.metrics import counter
from tests.support.waiting import DEADLINE, wait_until
from workqueue import WorkStatus

pytestmark = [pytest.mark.acceptance, pytest.mark.database]

REPO_ROOT = Path(__file__).resolve().parents[3]
RPC_CALLS = "nexuscrm_rpc_server_duration_seconds_count"
CONNECTORS_RPC = "/nexuscrm.connectors.v1.ConnectorsService"


@pytest.fixture
def core(empty_dsn: str, tmp_path: Path) -> Iterator[list[ServiceProcess]]:
    services = start_services(
        (SCHEMA_CATALOG, CONTROLPLANE, CONNECTORS), env={"NEXUSCRM_DSN": empty_dsn}, workdir=tmp_path
    )
    yield services
    assert set(stop_services(services).values()) == {0}


def controlplane(services: list[ServiceProcess]) -> cp_grpc.ControlplaneServiceStub:
    address = next(s.address for s in services if s.spec is CONTROLPLANE)
    return cp_grpc.ControlplaneServiceStub(grpc.insecure_channel(address))


def install(services: list[ServiceProcess]) -> str:
    stub = controlplane(services)
    request = cp_pb.InstallPackRequest(namespace="acme", pack_name=demo.PACK_NAME, pack_version=demo.PACK_VERSION)
    return str(stub.InstallPack(request, timeout=10).pack.pack_install_id)


def host_env(empty_dsn: str, services: list[ServiceProcess], pack: str, **extra: str) -> dict[str, str]:
    return {
        "NEXUSCRM_DSN": empty_dsn,
        **target_env(services),
        "NEXUSCRM_INTEGRATION_POOLS": demo_pools(pack, 1),
        **extra,
    }


def test_host_refuses_before_the_protocol_receipt_and_serves_after_activation(
    empty_dsn: str, core: list[ServiceProcess], tmp_path: Path
) -> None:
    pack = install(core)
    with pytest.raises(LaunchError, match="exited with 3"):
        start_services((INTEGRATION,), env=host_env(empty_dsn, core, pack), workdir=tmp_path)
    log = (tmp_path / "integration.log").read_text()
    assert f"protocol: pack {pack} has no protocol receipt" in log and "NOT_SERVING" in log
    assert "activation passed" not in log

    waiting = start_service(
        INTEGRATION, env=host_env(empty_dsn, core, pack, NEXUSCRM_ACTIVATION_WAIT_SECONDS="forever"), workdir=tmp_path
    )
    try:
        stub = in_grpc.IntegrationServiceStub(grpc.insecure_channel(waiting.address))

        def refusal() -> in_pb.GetActivationResponse:
            response: in_pb.GetActivationResponse = stub.GetActivation(in_pb.GetActivationRequest(), timeout=5)
            return response

        wait_until(lambda: any(pack in missing for missing in refusal().missing), "a refusal naming the pack")
        refused = refusal()
        assert not refused.active and list(refused.pack_install_ids) == [pack]
        assert health_status(waiting.address, INTEGRATION.service_name) == "NOT_SERVING"
        assert list(stub.ListWorkers(in_pb.ListWorkersRequest(), timeout=5).workers) == []

        controlplane(core).ActivatePack(cp_pb.ActivatePackRequest(pack_install_id=pack), timeout=10)
        wait_until(lambda: health_status(waiting.address, INTEGRATION.service_name) == "SERVING", "activation")
        active = stub.GetActivation(in_pb.GetActivationRequest(), timeout=5)
        assert active.active and list(active.missing) == []
        listed = stub.ListWorkers(in_pb.ListWorkersRequest(), timeout=5).workers
        assert [(w.pack_install_id, w.work_type, w.flow) for w in listed] == [(pack, demo.WORK_TYPE, demo.FLOW_NAME)]
    finally:
        assert stop_services([waiting]) == {"integration": 0}
    engine = create_engine(empty_dsn)
    assert_invariants(engine)
    engine.dispose()


def test_a_pool_that_names_its_pack_is_served_once_the_name_resolves(
    empty_dsn: str, core: list[ServiceProcess], tmp_path: Path
) -> None:
    name = {"namespace": "acme", "name": demo.PACK_NAME, "version": demo.PACK_VERSION}
    pools = json.dumps([{"pack": name, "work_type": demo.WORK_TYPE, "flow": demo.FLOW_NAME}])
    env = {"NEXUSCRM_DSN": empty_dsn, **target_env(core), "NEXUSCRM_INTEGRATION_POOLS": pools}
    with pytest.raises(LaunchError, match="exited with 3"):
        start_services((INTEGRATION,), env=env, workdir=tmp_path)
    log = (tmp_path / "integration.log").read_text()
    assert f"pack acme/{demo.PACK_NAME}@{demo.PACK_VERSION} is not installed; `nexuscrm packs list" in log

    waiting = start_service(INTEGRATION, env={**env, "NEXUSCRM_ACTIVATION_WAIT_SECONDS": "forever"}, workdir=tmp_path)
    try:
        stub = in_grpc.IntegrationServiceStub(grpc.insecure_channel(waiting.address))
        pack = install(core)
        wait_until(  # resolved now; the protocol receipt is what is missing
            lambda: list(stub.GetActivation(in_pb.GetActivationRequest(), timeout=5).pack_install_ids) == [pack],
            "the pack name resolved",
        )
        controlplane(core).ActivatePack(cp_pb.ActivatePackRequest(pack_install_id=pack), timeout=10)
        wait_until(lambda: health_status(waiting.address, INTEGRATION.service_name) == "SERVING", "activation")
        listed = stub.ListWorkers(in_pb.ListWorkersRequest(), timeout=5).workers
        assert [(w.pack_install_id, w.work_type) for w in listed] == [(pack, demo.WORK_TYPE)]
    finally:
        assert stop_services([waiting]) == {"integration": 0}
    engine = create_engine(empty_dsn)
    assert_invariants(engine)
    engine.dispose()


def test_host_refuses_a_schema_without_replay_of_work_id(empty_dsn: str, tmp_path: Path) -> None:
    engine = create_engine(empty_dsn)
    migrations.apply_schema(engine)
    with engine.begin() as connection:  # an older, incomplete WorkItem: what rolling compatibility would accept
        connection.exec_driver_sql(
            "DROP INDEX ix_workitem_replay_of" + ("" if engine.dialect.name == "sqlite" else " ON WorkItem")
        )
        connection.exec_driver_sql("ALTER TABLE WorkItem DROP COLUMN ReplayOfWorkId")
    env = {"NEXUSCRM_DSN": empty_dsn, "NEXUSCRM_APPLY_SCHEMA_ON_START": "0"}
    services = start_services((SCHEMA_CATALOG, CONTROLPLANE, CONNECTORS), env=env, workdir=tmp_path)
    try:
        pack = install(services)
        controlplane(services).ActivatePack(cp_pb.ActivatePackRequest(pack_install_id=pack), timeout=10)
        with pytest.raises(LaunchError, match=f"exited with {EXIT_REFUSED}"):
            start_services((INTEGRATION,), env=host_env(empty_dsn, services, pack), workdir=tmp_path)
    finally:
        assert set(stop_services(services).values()) == {0}
    log = (tmp_path / "integration.log").read_text()
    assert "schema: WorkItem.ReplayOfWorkId" in log and "schema: WorkItem(ix_workitem_replay_of)" in log
    assert pack not in log.split("activation refused", 1)[1].splitlines()[0]  # only the schema is missing
    with engine.begin() as connection:  # restore the column so the invariant checker can read WorkItem
        connection.exec_driver_sql("ALTER TABLE WorkItem ADD COLUMN ReplayOfWorkId VARCHAR(36) NULL")
    assert_invariants(engine)
    engine.dispose()


def expected_contacts(config: WorkloadConfig) -> dict[str, tuple[dict[str, str | None], int]]:
    """The projection the inputs imply, folded here from the simulator's deterministic workload.

    One sender admits fresh deliveries in receipt-key order, so that is ordinal order. A contact
    starts with no field set; each update overwrites the fields it names and counts once.
    """
    expected: dict[str, tuple[dict[str, str | None], int]] = {}
    for sent in (d for batch in workload(config) for d in batch if not d.duplicate):
        update = json.loads(sent.item.payload)
        fields, updates = expected.get(update["contact_id"], (dict.fromkeys(("name", "email", "company", "stage")), 0))
        expected[update["contact_id"]] = ({**fields, **update["fields"]}, updates + 1)
    return expected


def test_demo_projection_matches_the_inputs_and_the_cli_explains_it(
    empty_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = WorkloadConfig(lanes=20, inputs=300, rate=0, duplicate_ratio=0.1, burst_chance=0.3, seed=5)
    services, pack = start_system(empty_dsn, tmp_path, namespace="acme", workers=2)
    engine = create_engine(empty_dsn)
    try:
        summary = run_demo(
            engine, services, pack, config, stop=threading.Event(), timeout=dt.timedelta(seconds=DEADLINE)
        )
        assert summary.complete and summary.problems == ()
        assert summary.stats.admitted == 300 and summary.stats.fresh_sent == 300
        assert summary.stats.duplicates_acknowledged == summary.stats.duplicates_sent > 0
        assert 0 < summary.generations <= summary.executions
        with engine.connect() as connection:
            rows = queries.demo_contacts_get(connection, pack)
        projected = {
            r.ContactId: ({"name": r.Name, "email": r.Email, "company": r.Company, "stage": r.Stage}, r.Updates)
            for r in rows
        }
        assert projected == expected_contacts(config)

        for name, address in target_env(services).items():
            monkeypatch.setenv(name, address)
        capsys.readouterr()

        def run_cli(*argv: str, code: int = 0) -> Any:
            assert cli.main(["--json", *argv]) == code
            return json.loads(capsys.readouterr().out)

        assert run_cli("activation")["active"] is True
        listed = run_cli("workers")
        assert {w["state"] for w in listed} <= {"idle", "working"}
        # Every worker that ran work measured its host's clock against the database's: one host here.
        skews = [w["clock_skew_seconds"] for w in listed if w["executions"]]
        assert skews and all(abs(skew) < 5 for skew in skews), skews
        assert run_cli("packs", "protocol", pack)["protocol"]["legacy_max_ordinal"] == 0
        explained = run_cli("why", pack, "r-00000007")
        assert explained["receipt_state"] == "confirmed" and explained["covered_by"]["work_id"]
        shown = run_cli("work", "show", explained["covered_by"]["work_id"])
        assert shown["work"]["status"] == "completed"
        start, end = shown["work"]["first_ordinal"], shown["work"]["last_ordinal"]
        assert start <= 7 <= end and shown["member_count"] >= 1
        assert run_cli("receipts", "missing", "--pack", pack)["receipts"] == []
        assert run_cli("drain", "status", pack)["drained"] is True  # greenfield: no old-protocol work
        assert run_cli("drain", "wait", pack, "--timeout", "5s", "--interval", "100ms")["drained"] is True
        assert cli.main(["work", "show", "no-such-work"]) == ExitCode.USAGE  # an unknown WorkId
        assert "NOT_FOUND" in capsys.readouterr().err

        # The reads of issue 16: queue state, generations, members, the pack record.
        state = run_cli("queue", "state", pack)
        assert state["drained"] is True and state["pending"] == 0 and state["oldest_waiting_work_id"] == ""
        assert run_cli("queue", "wait", pack, "--timeout", "5s")["drained"] is True
        described = run_cli("packs", "show", pack)
        assert described["protocol_state"] == "greenfield" and described["pack"]["ordinal_counter"] == 300
        found = run_cli(
            "packs", "find", "--namespace", "acme", "--name", demo.PACK_NAME, "--version", demo.PACK_VERSION
        )
        assert [p["pack_install_id"] for p in found] == [pack]
        work = shown["work"]
        lane = ["--event-kind", work["route"]["event_kind"], "--route-version", work["route"]["route_version"]]
        lane += ["--companion-version", work["route"]["companion_version"], "--work-type", demo.WORK_TYPE]
        listed = run_cli("work", "list", pack, *lane, "--lane", work["route"]["source_lane"], "--page-size", "500")
        assert work["work_id"] in [g["work_id"] for g in listed["generations"]]
        lanes = [g["last_ordinal"] for g in listed["generations"]]
        assert lanes == sorted(lanes, reverse=True)
        members = run_cli("work", "members", work["work_id"])
        ordinals = [i["enqueue_ordinal"] for i in members["inputs"]]
        assert 7 in ordinals and ordinals == sorted(ordinals) and len(ordinals) == shown["member_count"]
        assert cli.main(["queue", "state", "pk-none"]) == ExitCode.USAGE  # an unknown pack
        assert "NOT_FOUND" in capsys.readouterr().err
    finally:
        assert set(stop_services(services).values()) == {0}
    assert demo.verify_projection(engine, pack) == []
    assert_invariants(engine)
    engine.dispose()


def test_sigterm_during_work_drains_in_flight_generations_and_loses_nothing(empty_dsn: str, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    env = {"NEXUSCRM_TEST_GATE_DIR": str(gate), "PYTHONPATH": str(REPO_ROOT)}
    services, pack = start_system(
        empty_dsn,
        tmp_path,
        namespace="acme",
        workers=2,
        flow="tests.system.acceptance.gated_flow:gated_contacts",
        extra_env=env,
    )
    core, host = services[:3], services[3]
    engine = create_engine(empty_dsn)
    try:
        connectors = next(s.address for s in core if s.spec is CONNECTORS)
        with grpc.insecure_channel(connectors) as channel:
            config = WorkloadConfig(lanes=10, inputs=200, rate=0, seed=11)
            stats = Simulator(ConnectorsClient(channel), pack, config, threading.Event()).run()
        assert stats.admitted == 200
        wait_until(lambda: len(list(gate.glob("*.started"))) == 2, "two generations in flight")
        in_flight = {p.name.removesuffix(".started") for p in gate.glob("*.started")}

        host.process.send_signal(signal.SIGTERM)
        (gate / "release").touch()
        assert host.process.wait(timeout=DEADLINE) == 0
        with engine.connect() as connection:
            statuses = dict(connection.execute(sa.select(WorkItem.c.WorkId, WorkItem.c.Status)).all())
        assert {statuses[work_id] for work_id in in_flight} == {WorkStatus.COMPLETED}
        assert WorkStatus.PROCESSING not in statuses.values()  # no claim outlived the drain
        assert not settled(engine, pack, stats)  # work is left for the next host

        services[3] = start_host(core, pack, tmp_path, env={"NEXUSCRM_DSN": empty_dsn}, workers=2)
        wait_until(lambda: settled(engine, pack, stats), "the restarted host to project every input")
    finally:
        assert set(stop_services(services).values()) == {0}
    assert demo.verify_projection(engine, pack) == []
    assert_invariants(engine)
    engine.dispose()


def test_workers_on_their_own_connectors_replica_need_only_that_replica(empty_dsn: str, tmp_path: Path) -> None:
    """``start_system(worker_connectors=True)``: the host's workers call a second Connectors (decision 135).

    The first Connectors is stopped before anything is ingested, then the workload goes in
    through the replica: only a host wired to the replica can project it. The host's pool is
    started with ``complete_in_claim`` (decision 170): its workers complete every generation in
    a later Claim, so the replica answers no Complete.
    """
    services, pack = start_system(
        empty_dsn,
        tmp_path,
        namespace="acme",
        workers=2,
        worker_connectors=True,
        complete_in_claim=True,
        extra_env={"NEXUSCRM_CONNECTORS_METRICS_ADDRESS": "127.0.0.1:0"},
    )
    first, replica = (service for service in services if service.spec is CONNECTORS)
    engine = create_engine(empty_dsn)
    try:
        assert first.address != replica.address
        assert set(stop_services([first]).values()) == {0}
        with replica.channel() as channel:
            config = WorkloadConfig(lanes=10, inputs=200, rate=0, duplicate_ratio=0.1, seed=13)
            stats = Simulator(ConnectorsClient(channel), pack, config, threading.Event()).run()
        assert stats.admitted == 200
        wait_until(lambda: settled(engine, pack, stats), "the host on the replica to project every input")
        metrics_port = replica.side_port("metrics")
        assert counter(metrics_port, RPC_CALLS, method=f"{CONNECTORS_RPC}/Claim", code="OK") > 0
        assert counter(metrics_port, RPC_CALLS, method=f"{CONNECTORS_RPC}/Complete") == 0
    finally:
        assert set(stop_services([service for service in services if service is not first]).values()) == {0}
    assert demo.verify_projection(engine, pack) == []
    assert_invariants(engine)
    engine.dispose()
