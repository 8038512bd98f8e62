"""Entry point of the controlplane service (``nexuscrm-controlplane``).

Environment: NEXUSCRM_DSN, NEXUSCRM_CONTROLPLANE_ADDRESS (default 127.0.0.1:50052).
"""

from __future__ import annotations

from sqlalchemy.engine import Engine

from nexuscrm.controlplane.v1 import controlplane_pb2_grpc as pb_grpc
from nexuscrm_controlplane.servicer import ControlplaneServicer
from nexuscrm_runtime.config import ServiceConfig
from nexuscrm_runtime.server import Registration, run_service

SERVICE_NAME = "nexuscrm.controlplane.v1.ControlplaneService"
DEFAULT_PORT = 50052


def build(config: ServiceConfig, engine: Engine) -> list[Registration]:
    """Register the servicer."""
    return [
        Registration(
            servicer=ControlplaneServicer(engine),
            add=pb_grpc.add_ControlplaneServiceServicer_to_server,
            service_name=SERVICE_NAME,
        )
    ]


def main() -> None:
    """Serve ControlplaneService until SIGTERM."""
    run_service(env_name="CONTROLPLANE", default_port=DEFAULT_PORT, build=build)


if __name__ == "__main__":
    main()
