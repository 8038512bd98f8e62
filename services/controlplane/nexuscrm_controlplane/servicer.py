"""ControlplaneService over gRPC: proto in, domain call, proto out."""

from __future__ import annotations

from sqlalchemy.engine import Engine

from nexuscrm.controlplane.v1 import controlplane_pb2_grpc as pb_grpc


class ControlplaneServicer(pb_grpc.ControlplaneServiceServicer):
    """Thin servicer; methods not overridden answer UNIMPLEMENTED."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
