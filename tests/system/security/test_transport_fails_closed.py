"""What an adversarial client sends below the message layer is refused, never an INTERNAL.

Every RPC of every service, on every backend: bytes that are no message, a string field that
is not UTF-8, an out-of-range Timestamp and an identifier longer than its column all answer
INVALID_ARGUMENT naming the message type or the field (and the limit), with no ERROR logged,
and no status message grows with the input (docs/decisions/109-transport-fails-closed.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import grpc
import pytest
import sqlalchemy as sa
from google.protobuf.descriptor import FieldDescriptor, MethodDescriptor
from google.protobuf.message_factory import GetMessageClass

from nexuscrm.connectors.v1 import connectors_pb2 as cn
from nexuscrm.connectors.v1 import connectors_pb2_grpc as cn_grpc
from nexuscrm.controlplane.v1 import controlplane_pb2
from nexuscrm.integration.v1 import integration_pb2
from nexuscrm.schemacatalog.v1 import schema_catalog_pb2
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.servicer import registration as connectors_registration
from nexuscrm_controlplane.servicer import registration as controlplane_registration
from nexuscrm_integration.host import HostStatus
from nexuscrm_integration.servicer import registration as integration_registration
from nexuscrm_runtime.server import create_server
from nexuscrm_runtime.tls import open_channel
from nexuscrm_schema_catalog.servicer import registration as schema_catalog_registration
from nexuscrm_wire import convert
from tests.support.checksums import database_digest
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants
from tests.support.statuses import violation_field
from workqueue.limits import REQUEST_FIELD_LIMITS

pytestmark = pytest.mark.database

MODULES = [schema_catalog_pb2, cn, controlplane_pb2, integration_pb2]
METHODS: dict[str, MethodDescriptor] = {
    method.full_name: method
    for module in MODULES
    for service in module.DESCRIPTOR.services_by_name.values()
    for method in service.methods
}
LIMITED = [
    (name, field.name)
    for name, method in METHODS.items()
    for field in method.input_type.fields
    if field.type == FieldDescriptor.TYPE_STRING and field.name in REQUEST_FIELD_LIMITS
]
UTF8 = [
    (name, field)
    for name, method in METHODS.items()
    for field in method.input_type.fields
    if field.type == FieldDescriptor.TYPE_STRING
]


@pytest.fixture
def channel(engine: sa.Engine) -> Iterator[grpc.Channel]:
    registrations = [
        schema_catalog_registration(engine),
        connectors_registration(Connectors(engine)),
        controlplane_registration(engine),
        integration_registration(HostStatus(["pk-transport"])),
    ]
    running = create_server(registrations, "127.0.0.1:0")
    channel = open_channel(f"127.0.0.1:{running.port}", None)
    yield channel
    channel.close()
    running.stop(0)


def _call_raw(channel: grpc.Channel, method_name: str, payload: bytes) -> grpc.RpcError:
    method = METHODS[method_name]
    path = f"/{method.containing_service.full_name}/{method.name}"
    call = (channel.unary_stream if method.server_streaming else channel.unary_unary)(
        path, request_serializer=None, response_deserializer=None
    )
    with pytest.raises(grpc.RpcError) as raised:
        response = call(payload, timeout=30)
        if method.server_streaming:
            list(response)
    return raised.value


def _no_error_logged(caplog: pytest.LogCaptureFixture) -> None:
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, f"logged {[r.getMessage() for r in errors]}"


@pytest.mark.parametrize("method_name", sorted(METHODS))
def test_undecodable_bytes_answer_invalid_argument_naming_the_message_type(
    channel: grpc.Channel, method_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    error = _call_raw(channel, method_name, b"\xff\xff\xff\xff")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert METHODS[method_name].input_type.full_name in (error.details() or "")
    _no_error_logged(caplog)


@pytest.mark.parametrize(("method_name", "field"), [(m, f.name) for m, f in UTF8])
def test_invalid_utf8_answers_invalid_argument_naming_the_field(
    channel: grpc.Channel, method_name: str, field: str, caplog: pytest.LogCaptureFixture
) -> None:
    number = METHODS[method_name].input_type.fields_by_name[field].number
    error = _call_raw(channel, method_name, bytes([number << 3 | 2, 2]) + b"\xc3\x28")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert violation_field(error).startswith(field), error.details()
    assert "UTF-8" in (error.details() or "")
    _no_error_logged(caplog)


@pytest.mark.parametrize(("seconds", "nanos"), [(2**40, 0), (-(2**40), 0), (0, -1), (0, 1_000_000_000)])
def test_out_of_range_source_time_rejects_that_item_naming_the_field(
    channel: grpc.Channel, engine: sa.Engine, seconds: int, nanos: int, caplog: pytest.LogCaptureFixture
) -> None:
    pack = install_pack(engine)
    item = convert.item_to_proto(delivery("r-1"))
    item.source_time.seconds, item.source_time.nanos = seconds, nanos
    request = cn.IngestRequest(pack_install_id=pack, items=[item])
    before = database_digest(engine)
    (result,) = cn_grpc.ConnectorsServiceStub(channel).Ingest(request).results
    assert result.outcome == cn.INGEST_OUTCOME_REJECTED
    assert result.message.startswith("items[0].source_time."), result.message
    assert database_digest(engine) == before  # no Event, no receipt, no counter moved
    _no_error_logged(caplog)
    assert_invariants(engine)


@pytest.mark.parametrize(("method_name", "field"), LIMITED)
def test_overlong_identifier_answers_invalid_argument_naming_field_and_limit(
    channel: grpc.Channel, method_name: str, field: str
) -> None:
    request = GetMessageClass(METHODS[method_name].input_type)()
    value = "x" * 10_000
    if METHODS[method_name].input_type.fields_by_name[field].is_repeated:
        getattr(request, field).append(value)
    else:
        setattr(request, field, value)
    error = _call_raw(channel, method_name, request.SerializeToString())
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert violation_field(error).startswith(field)
    assert f"the limit is {REQUEST_FIELD_LIMITS[field]}" in (error.details() or "")
    assert len(error.details() or "") < 2_000


def test_claim_refuses_max_items_zero_and_claims_one_when_unset(channel: grpc.Channel, engine: sa.Engine) -> None:
    pack = install_pack(engine)
    Connectors(engine).ingest(pack, items=[delivery("r-1"), delivery("r-2", lane="b")])
    claim = "nexuscrm.connectors.v1.ConnectorsService.Claim"
    error = _call_raw(channel, claim, cn.ClaimRequest(worker_id="w", max_items=0).SerializeToString())
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert violation_field(error) == "max_items"
    stub = channel.unary_unary(
        "/nexuscrm.connectors.v1.ConnectorsService/Claim",
        request_serializer=cn.ClaimRequest.SerializeToString,
        response_deserializer=cn.ClaimResponse.FromString,
    )
    assert len(stub(cn.ClaimRequest(worker_id="w", pack_install_ids=[pack]), timeout=30).claims) == 1
    assert_invariants(engine)
