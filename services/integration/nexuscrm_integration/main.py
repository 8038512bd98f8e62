"""Entry point of the integration service (``nexuscrm-integration``).

Environment: NEXUSCRM_DSN, NEXUSCRM_INTEGRATION_ADDRESS (default 127.0.0.1:50054).
"""

from __future__ import annotations

from sqlalchemy.engine import Engine

from nexuscrm.integration.v1 import integration_pb2_grpc as pb_grpc
from nexuscrm_integration.servicer import IntegrationServicer
from nexuscrm_runtime.config import ServiceConfig
from nexuscrm_runtime.server import Registration, run_service

SERVICE_NAME = "nexuscrm.integration.v1.IntegrationService"
DEFAULT_PORT = 50054


def build(config: ServiceConfig, engine: Engine) -> list[Registration]:
    """Register the servicer."""
    return [
        Registration(
            servicer=IntegrationServicer(engine),
            add=pb_grpc.add_IntegrationServiceServicer_to_server,
            service_name=SERVICE_NAME,
        )
    ]


def main() -> None:
    """Serve IntegrationService until SIGTERM."""
    run_service(env_name="INTEGRATION", default_port=DEFAULT_PORT, build=build)


if __name__ == "__main__":
    main()
