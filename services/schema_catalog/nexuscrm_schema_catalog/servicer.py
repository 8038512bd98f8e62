"""SchemaCatalogService over gRPC: proto in, catalog call, proto out."""

from __future__ import annotations

import grpc
from sqlalchemy.engine import Engine

from nexuscrm.schemacatalog.v1 import schema_catalog_pb2 as pb
from nexuscrm.schemacatalog.v1 import schema_catalog_pb2_grpc as pb_grpc
from nexuscrm_runtime.authorization import allow_any_principal, require_all_namespaces
from nexuscrm_runtime.build_info import build_info
from nexuscrm_runtime.clock import iso_utc
from nexuscrm_runtime.server import Registration
from nexuscrm_schema import verification
from nexuscrm_schema.support import read_version
from nexuscrm_schema_catalog import migrations, payload_contract
from nexuscrm_schema_catalog.payload_contract import ContractState
from nexuscrm_schema_catalog.payload_move import FIRST_ORDINAL, Pending
from nexuscrm_schema_catalog.release import RELEASE
from workqueue.errors import InvalidArgument

SERVICE_NAME = "nexuscrm.schemacatalog.v1.SchemaCatalogService"


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
        described = verification.describe_schema(self._engine)
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
        feature = request.feature or verification.NATIVE_PROJECTION
        missing = verification.verify_schema(self._engine, feature)
        return pb.VerifySchemaResponse(feature=feature, complete=not missing, missing=missing)

    def ContractPayloads(
        self, request: pb.ContractPayloadsRequest, context: grpc.ServicerContext
    ) -> pb.ContractPayloadsResponse:
        if request.max_batches < 0:
            raise InvalidArgument(f"max_batches must be 0 or more, got {request.max_batches}", field="max_batches")
        if request.dry_run:
            return _counted(*payload_contract.count_moves(self._engine))
        start = (
            (request.after_pack_install_id, request.after_ordinal)
            if request.after_pack_install_id
            else ("", FIRST_ORDINAL)
        )
        state, batches, done = payload_contract.contract_payloads(
            self._engine,
            f"ContractPayloads from {context.peer()}",
            start=start,
            max_batches=request.max_batches or 1,
        )
        pack, after = (batches[-1].pack, batches[-1].through) if batches else start
        return pb.ContractPayloadsResponse(
            set_at=iso_utc(state.set_at),
            set_by=state.set_by,
            newly_set=state.newly_set,
            emptied=sum(b.emptied for b in batches),
            emptied_bytes=sum(b.bytes for b in batches),
            next_pack_install_id=pack,
            next_after_ordinal=after,
            done=done,
            moved=sum(b.moved for b in batches),
        )

    def GetBuildInfo(self, request: pb.GetBuildInfoRequest, context: grpc.ServicerContext) -> pb.GetBuildInfoResponse:
        return pb.GetBuildInfoResponse(build=build_info(RELEASE, read_version(self._engine)))


def _counted(state: ContractState | None, pending: Pending) -> pb.ContractPayloadsResponse:
    """A dry run's answer: the flag as found (empty while unset) and what a move would change."""
    return pb.ContractPayloadsResponse(
        set_at="" if state is None else iso_utc(state.set_at),
        set_by="" if state is None else state.set_by,
        emptied=pending.events,
        emptied_bytes=pending.bytes,
        moved=pending.moves,
        done=True,
    )


def registration(engine: Engine) -> Registration:
    """SchemaCatalogService over ``engine``: anyone the policy knows may read, only ``*`` may migrate."""
    method = f"/{SERVICE_NAME}/"
    return Registration(
        servicer=SchemaCatalogServicer(engine),
        add=pb_grpc.add_SchemaCatalogServiceServicer_to_server,
        service_name=SERVICE_NAME,
        rules={
            method + "ApplySchema": require_all_namespaces,
            method + "ContractPayloads": require_all_namespaces,
            method + "DescribeSchema": allow_any_principal,
            method + "VerifySchema": allow_any_principal,
            method + "GetBuildInfo": allow_any_principal,
        },
    )
