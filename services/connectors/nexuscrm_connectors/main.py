"""Entry point of the Connectors service (``nexuscrm-connectors``).

Environment: NEXUSCRM_DSN, NEXUSCRM_CONNECTORS_ADDRESS (default 127.0.0.1:50053), and the
limits of ``nexuscrm_connectors.settings.Settings`` (NEXUSCRM_MAX_BATCH_ITEMS, ...). A
background materializer admits stored receipts every NEXUSCRM_MATERIALIZE_INTERVAL_SECONDS;
its health is the gRPC health status of ``materializer.HEALTH_NAME``, and its back-off ends as
soon as the database is usable again (``nexuscrm_runtime.readiness``). Before anything serves,
the schema gate (``release``) refuses a database this release does not serve: exit 3, one log line.
NEXUSCRM_CONNECTORS_METRICS_ADDRESS serves the counters of ``nexuscrm_connectors.metrics`` and
the per-version gauges of ``operating.flow_version_gauges``.
"""

from __future__ import annotations

import logging

from prometheus_client import REGISTRY
from sqlalchemy.engine import Engine

from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.operating.flow_version_gauges import FlowVersionCollector
from nexuscrm_connectors.queue.materializer import HEALTH_NAME, Materializer
from nexuscrm_connectors.release import RELEASE
from nexuscrm_connectors.servicer import registration
from nexuscrm_connectors.settings import Settings
from nexuscrm_runtime.config import ServiceConfig
from nexuscrm_runtime.security import Security
from nexuscrm_runtime.server import Registration, RunningServer, run_service
from nexuscrm_schema.support import start_gate

log = logging.getLogger("nexuscrm_connectors")
DEFAULT_PORT = 50053


def main() -> None:
    """Serve ConnectorsService and run the materializer until SIGTERM, once the schema gate passed (``release``)."""
    materializers: list[Materializer] = []
    services: list[Connectors] = []

    def build(config: ServiceConfig, engine: Engine, security: Security | None) -> list[Registration]:
        connectors = Connectors(engine, Settings.from_env())
        if config.metrics_address:
            REGISTRY.register(FlowVersionCollector(connectors.context))
        materializer = Materializer(connectors)
        materializer.start()
        materializers.append(materializer)
        services.append(connectors)
        return [registration(connectors)]

    def serving(running: RunningServer) -> None:
        for materializer in materializers:
            materializer.attach_health(lambda healthy: running.set_health(HEALTH_NAME, healthy))
            if running.readiness is not None:  # a pass waiting out its back-off runs as soon as the database is back
                running.readiness.on_ready(materializer.wake)

    def stop() -> None:  # runs as soon as SIGTERM came, while gRPC waits for in-flight calls
        for connectors in services:
            connectors.reservations.close()  # a Claim waiting for work answers now, not after the grace
        for materializer in materializers:
            materializer.stop()

    run_service(
        env_name="CONNECTORS",
        default_port=DEFAULT_PORT,
        build=build,
        on_stop=stop,
        on_serving=serving,
        before_serving=start_gate(RELEASE, log),
    )


if __name__ == "__main__":
    main()
