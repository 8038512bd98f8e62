"""SchemaCatalogService over gRPC: proto in, catalog call, proto out."""

from __future__ import annotations

import grpc
from sqlalchemy.engine import Engine

from nexuscrm.schemacatalog.v1 import schema_catalog_pb2 as pb
from nexuscrm.schemacatalog.v1 import schema_catalog_pb2_grpc as pb_grpc
from nexuscrm_schema_catalog import catalog, migrations


class SchemaCatalogServicer(pb_grpc.SchemaCatalogServiceServicer):
    """Thin servicer; errors are mapped to status codes by the shared interceptor."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def ApplySchema(self, request: pb.ApplySchemaRequest, context: grpc.ServicerContext) -> pb.ApplySchemaResponse:
        start, end, applied = migrations.apply_schema(self._engine, request.target_version)
        return pb.ApplySchemaResponse(from_version=start, to_version=end, applied_steps=applied)

    def DescribeSchema(
        self, request: pb.DescribeSchemaRequest, context: grpc.ServicerContext
    ) -> pb.DescribeSchemaResponse:
        described = catalog.describe_schema(self._engine)
        return pb.DescribeSchemaResponse(
            version=described.version,
            newest_version=described.newest_version,
            tables=[
                pb.TableDescription(
                    name=t.name,
                    columns=[pb.ColumnDescription(name=c.name, type=c.type, nullable=c.nullable) for c in t.columns],
                    indexes=[pb.IndexDescription(name=i.name, columns=i.columns, unique=i.unique) for i in t.indexes],
                )
                for t in described.tables
            ],
        )

    def VerifySchema(self, request: pb.VerifySchemaRequest, context: grpc.ServicerContext) -> pb.VerifySchemaResponse:
        feature = request.feature or catalog.NATIVE_PROJECTION
        missing = catalog.verify_schema(self._engine, feature)
        return pb.VerifySchemaResponse(feature=feature, complete=not missing, missing=missing)
