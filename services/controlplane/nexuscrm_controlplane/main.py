"""Entry point of the controlplane service (``nexuscrm-controlplane``).

Environment: NEXUSCRM_DSN, NEXUSCRM_CONTROLPLANE_ADDRESS (default 127.0.0.1:50052),
NEXUSCRM_DASHBOARD_ADDRESS (host:port of the operator dashboard; empty, the default: no
dashboard), NEXUSCRM_CONTROLPLANE_METRICS_ADDRESS (the Prometheus endpoint, which then also
serves the per-pack queue gauges of ``dashboard.collector``), NEXUSCRM_OTEL and
NEXUSCRM_LOG_FORMAT (docs/observability.md), NEXUSCRM_TLS_CA / _CERT / _KEY and
NEXUSCRM_AUTHZ_POLICY (docs/security.md: with them, the dashboard is HTTPS and asks for a
token of a principal of every namespace). The dashboard's search and receipt lists ask
Connectors at NEXUSCRM_CONNECTORS_TARGET (``nexuscrm_runtime.targets``) over the same mutual
TLS, with the Controlplane's certificate, whose principal must then span every namespace;
its worker list asks the Integration hosts at NEXUSCRM_DASHBOARD_INTEGRATION_TARGETS
(comma-separated; default NEXUSCRM_INTEGRATION_TARGET) the same way.
"""

from __future__ import annotations

import contextlib
import logging

from prometheus_client import REGISTRY
from sqlalchemy.engine import Engine

from nexuscrm_controlplane.dashboard.access import token_middleware
from nexuscrm_controlplane.dashboard.app import create_app
from nexuscrm_controlplane.dashboard.collector import QueueCollector
from nexuscrm_controlplane.dashboard.connectors import connectors_reads
from nexuscrm_controlplane.dashboard.server import DashboardServer
from nexuscrm_controlplane.dashboard.workers import TARGETS_VARIABLE, integration_hosts, integration_targets
from nexuscrm_controlplane.release import RELEASE
from nexuscrm_controlplane.servicer import registration
from nexuscrm_runtime.config import ServiceConfig, env_str
from nexuscrm_runtime.security import Security
from nexuscrm_runtime.server import Registration, publish_side_port, run_service
from nexuscrm_runtime.targets import Targets
from nexuscrm_schema.support import start_gate

log = logging.getLogger("nexuscrm_controlplane")
DEFAULT_PORT = 50052


def main() -> None:
    """Serve ControlplaneService (and the dashboard, when configured) until SIGTERM, once the schema gate passed."""
    dashboard_address = env_str("NEXUSCRM_DASHBOARD_ADDRESS", "")
    dashboards: list[DashboardServer] = []
    channels = contextlib.ExitStack()

    def build(config: ServiceConfig, engine: Engine, security: Security | None) -> list[Registration]:
        if config.metrics_address:
            REGISTRY.register(QueueCollector(engine))
        if dashboard_address:
            tls = security.tls if security else None
            targets = Targets.from_env()
            hosts = integration_targets(env_str(TARGETS_VARIABLE, ""), targets.integration)
            connectors = channels.enter_context(connectors_reads(targets, tls))
            workers = channels.enter_context(integration_hosts(hosts, tls))
            if security is None:
                app = create_app(engine, connectors=connectors, workers=workers)
                dashboard = DashboardServer(app, dashboard_address, grace=config.grace_seconds)
            else:
                access = token_middleware(lambda: security.policy)
                app = create_app(engine, connectors=connectors, workers=workers, middleware=[access], https=True)
                dashboard = DashboardServer(app, dashboard_address, security.tls, grace=config.grace_seconds)
                security.on_reload(dashboard.follow)
            dashboard.start()
            dashboards.append(dashboard)
            publish_side_port(config, "dashboard", dashboard.port)
        return [registration(engine)]

    def stop() -> None:
        for dashboard in dashboards:
            dashboard.stop()
        channels.close()

    run_service(
        env_name="CONTROLPLANE",
        default_port=DEFAULT_PORT,
        build=build,
        on_stop=stop,
        before_serving=start_gate(RELEASE, log),
        side_addresses={"NEXUSCRM_DASHBOARD_ADDRESS": dashboard_address},
    )


if __name__ == "__main__":
    main()
