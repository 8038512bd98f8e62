"""Every RPC of every service, fuzzed with requests built from its descriptor.

Only deliberate status codes come back (never INTERNAL or UNKNOWN: no unhandled exception),
and a refused call changes no row. Each RPC is fuzzed in plaintext and, with mutual TLS and
the authorization policy, as the one-namespace principal ``acme`` (its rules see the same
random requests before the handlers do). A second pass sends raw bytes below the message
layer (``wire_strategy``: undecodable, not UTF-8, over-long ids) with no serializer: they must
answer INVALID_ARGUMENT (or a refusal of the rules), never INTERNAL, and change nothing.
NEXUSCRM_FUZZ_CASES_PER_SERVICE sets the cases per service and pass, shared among its RPCs
(default 100 in `make test`; `make reliability` runs 10 000).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
import sqlalchemy as sa
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings

from nexuscrm.connectors.v1 import connectors_pb2
from nexuscrm.controlplane.v1 import controlplane_pb2
from nexuscrm.integration.v1 import integration_pb2
from nexuscrm.schemacatalog.v1 import schema_catalog_pb2
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.servicer import registration as connectors_registration
from nexuscrm_controlplane.fences import arm_fence
from nexuscrm_controlplane.servicer import registration as controlplane_registration
from nexuscrm_integration.host import HostStatus
from nexuscrm_integration.servicer import registration as integration_registration
from nexuscrm_runtime.server import Registration, create_server
from nexuscrm_runtime.tls import open_channel
from nexuscrm_schema_catalog.servicer import registration as schema_catalog_registration
from tests.support.checksums import database_digest
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants
from tests.support.pki import Pki
from tests.support.proto_strategies import message_strategy, wire_strategy

pytestmark = pytest.mark.database

CASES_PER_SERVICE = int(os.environ.get("NEXUSCRM_FUZZ_CASES_PER_SERVICE", "100"))
DELIBERATE = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.DATA_LOSS,
}
# (messages module, registration builder) of every service under test.
SERVICES: list[tuple[Any, Callable[[sa.Engine], Registration]]] = [
    (schema_catalog_pb2, schema_catalog_registration),
    (connectors_pb2, lambda engine: connectors_registration(Connectors(engine))),
    (controlplane_pb2, controlplane_registration),
    (integration_pb2, lambda engine: integration_registration(HostStatus(["pk-fuzz"]))),
]
METHODS = {
    method.full_name: method
    for module, _ in SERVICES
    for service in module.DESCRIPTOR.services_by_name.values()
    for method in service.methods
}


@pytest.fixture(params=["plaintext", "mutual-tls"])
def server(request: pytest.FixtureRequest, engine: sa.Engine) -> Iterator[tuple[grpc.Channel, list[str]]]:
    pack = install_pack(engine)
    connectors = Connectors(engine)
    results = connectors.ingest(pack, items=[delivery("r-1"), delivery("r-2", lane="b")])
    claim = connectors.claim("w", pack_install_ids=[pack])[0]
    fence = arm_fence(engine, "acme", reason="fuzz")
    known = [pack, "acme", fence.fence_id, "r-1", "r-2", str(results[0].work_id), claim.lease_token]
    known += ["native_projection", "project", "w", "coverage_missing", "stored"]
    pki: Pki | None = request.getfixturevalue("pki") if request.param == "mutual-tls" else None
    running = create_server(
        [build(engine) for _, build in SERVICES], "127.0.0.1:0", security=pki.security() if pki else None
    )
    channel = open_channel(f"127.0.0.1:{running.port}", pki.tls("acme") if pki else None)
    yield channel, known
    channel.close()
    running.stop(0)


@pytest.mark.parametrize("method_name", sorted(METHODS))
def test_rpc_answers_only_deliberate_codes_and_refusals_change_nothing(
    server: tuple[grpc.Channel, list[str]], engine: sa.Engine, method_name: str
) -> None:
    channel, known = server
    method = METHODS[method_name]
    path = f"/{method.containing_service.full_name}/{method.name}"
    call = (channel.unary_stream if method.server_streaming else channel.unary_unary)(
        path, request_serializer=lambda m: m.SerializeToString(), response_deserializer=lambda b: b
    )

    examples = max(1, CASES_PER_SERVICE // len(method.containing_service.methods))

    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(message_strategy(method.input_type, known))
    def check(request: Message) -> None:
        with engine.connect() as connection:
            before = database_digest(connection)
        try:
            response = call(request, timeout=30)
            if method.server_streaming:
                list(response)
        except grpc.RpcError as error:
            assert error.code() in DELIBERATE, f"{method_name} answered {error.code()}: {error.details()}"
            assert error.details(), "a refusal must say why"
            with engine.connect() as connection:
                assert database_digest(connection) == before, f"refused {method_name} changed rows"

    check()
    assert_invariants(engine)  # whatever the fuzzed requests wrote when accepted


@pytest.mark.parametrize("method_name", sorted(METHODS))
def test_raw_request_bytes_answer_only_deliberate_codes_and_change_nothing(
    server: tuple[grpc.Channel, list[str]], engine: sa.Engine, method_name: str
) -> None:
    channel, known = server
    method = METHODS[method_name]
    path = f"/{method.containing_service.full_name}/{method.name}"
    call = (channel.unary_stream if method.server_streaming else channel.unary_unary)(
        path, request_serializer=None, response_deserializer=None
    )
    examples = max(1, CASES_PER_SERVICE // len(method.containing_service.methods))

    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(wire_strategy(method.input_type, known))
    def check(payload: bytes) -> None:
        with engine.connect() as connection:
            before = database_digest(connection)
        try:
            response = call(payload, timeout=30)
            if method.server_streaming:
                list(response)
        except grpc.RpcError as error:
            assert error.code() in DELIBERATE, f"{method_name} answered {error.code()}: {error.details()}"
            assert error.details(), "a refusal must say why"
            assert len(error.details() or "") <= 2_000, "a refusal must not echo unbounded input"
            with engine.connect() as connection:
                assert database_digest(connection) == before, f"refused {method_name} changed rows"

    check()
    assert_invariants(engine)  # whatever the fuzzed requests wrote when accepted
