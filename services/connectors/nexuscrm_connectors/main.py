"""Entry point of the connectors service (``nexuscrm-connectors``).

Environment: NEXUSCRM_DSN, NEXUSCRM_CONNECTORS_ADDRESS (default 127.0.0.1:50053).
"""

from __future__ import annotations

from sqlalchemy.engine import Engine

from nexuscrm.connectors.v1 import connectors_pb2_grpc as pb_grpc
from nexuscrm_connectors.servicer import ConnectorsServicer
from nexuscrm_runtime.config import ServiceConfig
from nexuscrm_runtime.server import Registration, run_service

SERVICE_NAME = "nexuscrm.connectors.v1.ConnectorsService"
DEFAULT_PORT = 50053


def build(config: ServiceConfig, engine: Engine) -> list[Registration]:
    """Register the servicer."""
    return [
        Registration(
            servicer=ConnectorsServicer(engine),
            add=pb_grpc.add_ConnectorsServiceServicer_to_server,
            service_name=SERVICE_NAME,
        )
    ]


def main() -> None:
    """Serve ConnectorsService until SIGTERM."""
    run_service(env_name="CONNECTORS", default_port=DEFAULT_PORT, build=build)


if __name__ == "__main__":
    main()
