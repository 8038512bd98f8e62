"""ConnectorsService over gRPC: proto in, domain call, proto out."""

from __future__ import annotations

from sqlalchemy.engine import Engine

from nexuscrm.connectors.v1 import connectors_pb2_grpc as pb_grpc


class ConnectorsServicer(pb_grpc.ConnectorsServiceServicer):
    """Thin servicer; methods not overridden answer UNIMPLEMENTED."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
