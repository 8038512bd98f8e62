"""Inbound, end to end through real processes: gRPC ingress, claim, the WorkId adapter, the
complete Flow payload set and durable completion, on every backend."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import sqlalchemy as sa
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from nexuscrm.connectors.v1 import connectors_pb2 as pb
from nexuscrm.connectors.v1 import connectors_pb2_grpc as pb_grpc
from nexuscrm_runtime.database import create_engine
from nexuscrm_schema.tables import WorkItem
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_sdk.flows import Generation
from nexuscrm_sdk.worker import Worker
from nexuscrm_tools.launcher import CONNECTORS, SCHEMA_CATALOG, ServiceProcess, start_services, stop_services
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants
from workqueue import WorkStatus
from workqueue.values import Outcome

pytestmark = [pytest.mark.database, pytest.mark.acceptance]


@pytest.fixture
def services(empty_dsn: str, tmp_path: Path) -> Iterator[tuple[str, ServiceProcess]]:
    started = start_services(
        [SCHEMA_CATALOG, CONNECTORS],
        env={"NEXUSCRM_DSN": empty_dsn, "NEXUSCRM_MATERIALIZE_INTERVAL_SECONDS": "0"},
        workdir=tmp_path,
    )
    try:
        yield empty_dsn, started[1]
    finally:
        assert stop_services(started) == {"schema-catalog": 0, "connectors": 0}


def test_ingress_claim_adapter_payload_set_and_completion(services: tuple[str, ServiceProcess]) -> None:
    dsn, connectors = services
    engine = create_engine(dsn)
    pack = install_pack(engine)
    seen: Counter[int] = Counter()
    payloads: dict[int, bytes] = {}
    lock = threading.Lock()

    def flow(generation: Generation) -> None:
        ordinals = []
        for item in generation.inputs:
            ordinals.append(item.enqueue_ordinal)
            with lock:
                payloads[item.enqueue_ordinal] = item.payload
        assert ordinals == sorted(ordinals)
        assert ordinals[0] == generation.work.input_start_ordinal and ordinals[-1] == generation.work.lane_ordinal
        with lock:
            seen.update(ordinals)

    with grpc.insecure_channel(connectors.address) as channel:
        client = ConnectorsClient(channel)
        sent = {}
        for batch in range(4):
            items = [delivery(f"b{batch}-{i}", lane=f"lane-{i % 3}") for i in range(25)]
            results = client.ingest(pack, items=items)
            assert all(r.outcome is Outcome.ADMITTED for r in results)
            sent.update({r.enqueue_ordinal: item.payload for r, item in zip(results, items, strict=True)})
        duplicate = client.ingest(pack, items=[delivery("b0-0", lane="lane-0", payload=b"payload of b0-0")])[0]
        assert duplicate.outcome is Outcome.DUPLICATE_COVERED

        workers = [Worker(client, flow, worker_id=f"w{n}", pack_install_ids=[pack], page_size=7) for n in range(2)]
        for worker in workers:
            while worker.run_once():
                pass
    assert seen == Counter(list(sent))  # every input executed exactly once
    assert payloads == sent
    with engine.connect() as connection:
        statuses = set(connection.execute(sa.select(WorkItem.c.Status)).scalars())
    assert statuses == {WorkStatus.COMPLETED}
    assert_invariants(engine)
    engine.dispose()


def test_rpc_errors_name_the_field_and_change_nothing(services: tuple[str, ServiceProcess]) -> None:
    dsn, connectors = services
    engine = create_engine(dsn)
    pack = install_pack(engine)
    with grpc.insecure_channel(connectors.address) as channel:
        stub = pb_grpc.ConnectorsServiceStub(channel)

        def code_of(call: object, request: object) -> tuple[grpc.StatusCode, str]:
            with pytest.raises(grpc.RpcError) as caught:
                response = call(request, timeout=10)  # type: ignore[operator]
                if hasattr(response, "__iter__") and not hasattr(response, "ListFields"):
                    list(response)
            return caught.value.code(), caught.value.details() or ""

        assert code_of(stub.Ingest, pb.IngestRequest(pack_install_id="", items=[])) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "pack_install_id is required",
        )
        assert code_of(stub.Ingest, pb.IngestRequest(pack_install_id="pk-nope"))[0] == grpc.StatusCode.NOT_FOUND
        too_many = pb.IngestRequest(
            pack_install_id=pack, items=[pb.IngestItem(receipt_key=f"k{i}") for i in range(1001)]
        )
        assert code_of(stub.Ingest, too_many)[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert code_of(stub.Claim, pb.ClaimRequest(worker_id=""))[1] == "worker_id is required"
        with pytest.raises(grpc.RpcError) as caught:
            stub.Claim(pb.ClaimRequest(worker_id="w", max_items=1000), timeout=10)
        rich = rpc_status.from_call(caught.value)  # type: ignore[arg-type]  # the error is the call
        assert rich is not None and rich.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        bad_request = error_details_pb2.BadRequest()
        assert rich.details[0].Unpack(bad_request)
        assert [v.field for v in bad_request.field_violations] == ["max_items"]
        code, details = code_of(stub.Claim, pb.ClaimRequest(worker_id="w", lease_seconds=100000))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "lease_seconds" in details
        for wait_ms in (-1, 2**31 - 1):
            code, details = code_of(stub.Claim, pb.ClaimRequest(worker_id="w", wait_ms=wait_ms))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "wait_ms" in details
        assert code_of(stub.GetWork, pb.GetWorkRequest(work_id="nope"))[0] == grpc.StatusCode.NOT_FOUND
        assert code_of(stub.Replay, pb.ReplayRequest(work_id="nope"))[0] == grpc.StatusCode.NOT_FOUND
        assert (
            code_of(stub.Complete, pb.CompleteRequest(work_id="nope", lease_token="t"))[0] == grpc.StatusCode.NOT_FOUND
        )
        code, details = code_of(stub.LoadInputs, pb.LoadInputsRequest(work_id="w", lease_token="t", page_size=-1))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "page_size" in details

        # Per-item validation: the bad item is rejected and its neighbours are admitted.
        good = pb.IngestItem(
            receipt_key="ok",
            route=pb.ProjectionRoute(
                event_kind="k", route_version="1", companion_version="c", work_type="t", source_lane="l"
            ),
            payload=b"{}",
        )
        bad_lane = pb.IngestItem(
            receipt_key="bad",
            route=pb.ProjectionRoute(
                event_kind="k", route_version="1", companion_version="c", work_type="t", source_lane="a\x00b"
            ),
            payload=b"{}",
        )
        response = stub.Ingest(pb.IngestRequest(pack_install_id=pack, items=[bad_lane, good]), timeout=10)
        assert [r.outcome for r in response.results] == [pb.INGEST_OUTCOME_REJECTED, pb.INGEST_OUTCOME_ADMITTED]
        assert "source_lane" in response.results[0].message
        work_id = response.results[1].work_id
        claimed = stub.Claim(pb.ClaimRequest(worker_id="w", pack_install_ids=[pack]), timeout=10).claims[0]
        stale = stub.Complete
        assert (
            code_of(stale, pb.CompleteRequest(work_id=work_id, lease_token="stale"))[0]
            == grpc.StatusCode.FAILED_PRECONDITION
        )
        stub.Complete(pb.CompleteRequest(work_id=work_id, lease_token=claimed.lease_token), timeout=10)
        replayed = stub.Replay(pb.ReplayRequest(work_id=work_id), timeout=10)
        assert replayed.work.replay_of_work_id == work_id
        assert code_of(stub.Replay, pb.ReplayRequest(work_id=work_id))[0] == grpc.StatusCode.FAILED_PRECONDITION
    assert_invariants(engine)
    engine.dispose()
