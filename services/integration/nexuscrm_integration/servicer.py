"""IntegrationService over gRPC: proto in, domain call, proto out."""

from __future__ import annotations

from sqlalchemy.engine import Engine

from nexuscrm.integration.v1 import integration_pb2_grpc as pb_grpc


class IntegrationServicer(pb_grpc.IntegrationServiceServicer):
    """Thin servicer; methods not overridden answer UNIMPLEMENTED."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
