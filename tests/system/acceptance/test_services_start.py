"""The four services run as separate processes, answer health checks and stop on SIGTERM."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from nexuscrm.schemacatalog.v1 import schema_catalog_pb2, schema_catalog_pb2_grpc
from nexuscrm_tools.launcher import ALL_SERVICES, health_status, start_services, stop_services

INVARIANTS_NOT_CHECKED = "processes start, answer health checks and stop: nothing is admitted"

pytestmark = [pytest.mark.acceptance, pytest.mark.database]


def test_four_services_serve_health_and_stop_cleanly(empty_dsn: str, tmp_path: Path) -> None:
    services = start_services(ALL_SERVICES, env={"NEXUSCRM_DSN": empty_dsn}, workdir=tmp_path)
    try:
        assert len({s.process.pid for s in services}) == 4
        assert len({s.port for s in services}) == 4
        for service in services:
            assert health_status(service.address) == "SERVING"
            assert health_status(service.address, service.spec.service_name) == "SERVING"
        catalog = next(s for s in services if s.spec.name == "schema-catalog")
        with grpc.insecure_channel(catalog.address) as channel:
            stub = schema_catalog_pb2_grpc.SchemaCatalogServiceStub(channel)
            verified = stub.VerifySchema(
                schema_catalog_pb2.VerifySchemaRequest(feature="native_projection"), timeout=10
            )
            assert verified.complete and list(verified.missing) == []
            with pytest.raises(grpc.RpcError) as caught:
                stub.VerifySchema(schema_catalog_pb2.VerifySchemaRequest(feature="no_such_feature"), timeout=10)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "no_such_feature" in (caught.value.details() or "")
    finally:
        codes = stop_services(services)
    assert codes == {spec.name: 0 for spec in ALL_SERVICES}
