"""Entry point of the Integration Service (``nexuscrm-integration``): the worker host.

Serves IntegrationService (GetActivation, ListWorkers) with health NOT_SERVING, runs the
activation gate for every configured pack (resolving, through Controlplane's ListPacks, the
pools that name their pack instead of its id; ``packs``), then starts the worker pools and
reports SERVING while its read-model database can be used (``nexuscrm_runtime.readiness``).
SIGTERM (or SIGINT) stops all claims, waits for in-flight generations (RunUntilDrained) and
stops the server.

Environment: NEXUSCRM_DSN (the Flows' read-model database), NEXUSCRM_INTEGRATION_ADDRESS
(default 127.0.0.1:50054), NEXUSCRM_SCHEMA_CATALOG_TARGET / NEXUSCRM_CONTROLPLANE_TARGET /
NEXUSCRM_CONNECTORS_TARGET (see ``targets``), the host configuration of ``config``, and
the observability settings every service reads (NEXUSCRM_INTEGRATION_METRICS_ADDRESS,
NEXUSCRM_OTEL, NEXUSCRM_LOG_FORMAT; see docs/observability.md), and the security settings
(NEXUSCRM_TLS_CA / _CERT / _KEY, NEXUSCRM_AUTHZ_POLICY; docs/security.md): the host's
certificate then serves IntegrationService and authenticates it to the other services.

Exit codes: 0 stopped cleanly; 1 did not stop within the drain timeout, the grace period and
the shutdown margin together; 2 configuration refused (one log line names the problem); 3 the
read-model database (NEXUSCRM_DSN) cannot be used, another process holds its listen or metrics
port, or the activation gate refused (the log names what is missing, a database schema outside
this release's range included: ``release``);
4 in-flight work did not finish within the drain timeout. SIGHUP reloads the certificates and the authorization policy.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from pathlib import Path

from prometheus_client import REGISTRY

from nexuscrm_integration.activation import remote_gate, wait_for_activation
from nexuscrm_integration.config import HostConfig
from nexuscrm_integration.errors import ActivationRefused, IntegrationError
from nexuscrm_integration.host import HostStatus, WorkerHost
from nexuscrm_integration.metrics import WorkerClockCollector
from nexuscrm_integration.packs import Resolution
from nexuscrm_integration.release import RELEASE
from nexuscrm_integration.servicer import registration
from nexuscrm_runtime.config import EXIT_CONFIG, ConfigError, ServiceConfig, refusing_bad_configuration
from nexuscrm_runtime.database import create_engine
from nexuscrm_runtime.database_check import check_database
from nexuscrm_runtime.listening import refuse_if_in_use
from nexuscrm_runtime.logs import configure_logging
from nexuscrm_runtime.release import check_schema
from nexuscrm_runtime.security import Security
from nexuscrm_runtime.server import (
    SHUTDOWN_MARGIN,
    Signals,
    create_server,
    observability,
    refusing_to_start,
    write_port_file,
)
from nexuscrm_runtime.targets import Targets
from nexuscrm_runtime.telemetry import Tracing
from nexuscrm_runtime.tls import open_channel
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_sdk.flows import FlowNotFound

log = logging.getLogger("nexuscrm_integration")
DEFAULT_PORT = 50054
EXIT_REFUSED = 3
EXIT_NOT_DRAINED = 4


def main() -> None:
    """Run the worker host until SIGTERM; exit with one of the module's exit codes."""
    with refusing_bad_configuration():
        configure_logging()
        config = ServiceConfig.from_env("INTEGRATION", DEFAULT_PORT)
        try:
            host_config = HostConfig.from_env()
        except IntegrationError as error:
            raise ConfigError(str(error)) from None
        security = Security.from_env()
        deadline = host_config.drain_timeout_seconds + config.grace_seconds + SHUTDOWN_MARGIN
        signals = Signals(deadline=deadline, security=security)
        with refusing_to_start():  # a second host on the same ports: one line, exit 3
            refuse_if_in_use(config.address, config.metrics_address)
        with observability("INTEGRATION", config, security) as tracing:
            with refusing_to_start():  # the Flows' read-model database: exit 3 in one line if unusable
                check_database(config.dsn)
            code = serve(config, host_config, Targets.from_env(), tracing, security, signals)
    sys.exit(code)


def serve(
    config: ServiceConfig,
    host_config: HostConfig,
    targets: Targets,
    tracing: Tracing,
    security: Security | None,
    signals: Signals,
) -> int:
    """Serve, gate, host the pools until ``signals`` asks to stop; return the exit code."""
    stop = signals.stop_requested
    status = HostStatus(host_config.pack_install_ids)
    if config.metrics_address:
        REGISTRY.register(WorkerClockCollector(status))
    with refusing_to_start():  # the port was taken since ``main`` looked
        running = create_server(
            [registration(status)],
            config.address,
            interceptors=tracing.interceptors,
            max_workers=config.max_workers,
            serving=False,
            security=security,
        )
    log.info("listening on port %d; checking activation of %s", running.port, list(host_config.pack_install_ids))
    if config.port_file:
        write_port_file(Path(config.port_file), running.port)
    resolved: list[Resolution] = []

    def on_resolved(resolution: Resolution) -> None:
        resolved[:] = [resolution]
        status.checking(resolution.pack_install_ids)

    with (
        open_channel(targets.schema_catalog) as catalog,
        open_channel(targets.controlplane) as controlplane,
        open_channel(targets.connectors) as connectors,
    ):
        try:
            grant = wait_for_activation(
                remote_gate(catalog, controlplane, host_config.pools, on_resolved, status.schema_read),
                wait_seconds=host_config.activation_wait_seconds,
                stop=stop,
                on_refused=status.refused,
            )
        except ActivationRefused as error:
            running.stop(0)
            if stop.is_set():
                return 0
            log.error("NOT_SERVING: %s", error)
            return EXIT_REFUSED
        warning = check_schema(RELEASE, status.schema_version())  # the gate passed: at most a warning
        if warning is not None:
            log.warning(warning)
        log.info(RELEASE.start_line(status.schema_version()))
        engine = create_engine(config.dsn)
        tracing.instrument_engine(engine)
        try:
            # Pools that named their pack serve what it resolved to; a pool by id and one by name
            # of the same pack and work type are refused like any duplicate pool.
            pools = dataclasses.replace(host_config, pools=resolved[0].pools).pools
            log.info("pools: %s", ", ".join(pool.name for pool in pools))
            host = WorkerHost(grant, pools, ConnectorsClient(connectors), engine, host_id=host_config.host_id)
        except (IntegrationError, FlowNotFound) as error:
            log.error("configuration error: %s", error)
            running.stop(0)
            engine.dispose()
            return EXIT_CONFIG
        host.start()
        status.activated(host)
        running.follow_database(engine, interval=config.readiness_interval_ms / 1000)  # SERVING while usable
        log.info("activation passed; serving %d workers", len(host.workers()))
        signals.wait()
        running.withdraw()
        drained = host.run_until_drained(host_config.drain_timeout_seconds)
        if not drained:
            log.error(
                "in-flight work did not finish in %.0fs; its leases expire and it runs again",
                host_config.drain_timeout_seconds,
            )
        running.stop(config.grace_seconds)
        engine.dispose()
    log.info("stopped")
    return 0 if drained else EXIT_NOT_DRAINED


if __name__ == "__main__":
    main()
