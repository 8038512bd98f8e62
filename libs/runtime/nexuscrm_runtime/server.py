"""The shared gRPC server bootstrap: health, reflection, status mapping, graceful SIGTERM."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from sqlalchemy.engine import Engine

from nexuscrm_runtime.config import ServiceConfig, dsn_backend
from nexuscrm_runtime.database import create_engine
from nexuscrm_runtime.status import DomainErrorInterceptor

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Registration:
    """One servicer and how to add it to a server.

    ``add(servicer, server)`` comes from the *_pb2_grpc module; ``service_name`` is the full
    proto name reported by health and reflection.
    """

    servicer: Any
    add: Callable[[Any, grpc.Server], None]
    service_name: str


@dataclasses.dataclass(kw_only=True)
class RunningServer:
    """A started server, the port it bound and its health servicer."""

    server: grpc.Server
    port: int
    health: health.HealthServicer
    service_names: tuple[str, ...]

    def set_serving(self, serving: bool) -> None:
        """Report SERVING or NOT_SERVING for the whole server and each service."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *self.service_names):
            self.health.set(name, status)

    def stop(self, grace: float) -> None:
        """Report NOT_SERVING, refuse new RPCs and wait up to ``grace`` seconds for in-flight ones."""
        self.health.enter_graceful_shutdown()
        self.server.stop(grace).wait()


def create_server(
    registrations: Sequence[Registration],
    address: str,
    *,
    interceptors: Sequence[grpc.ServerInterceptor[Any, Any]] = (),
    max_workers: int = 16,
    serving: bool = True,
) -> RunningServer:
    """Build, bind and start a server with health checking and reflection.

    ``address`` may use port 0 (tests): the bound port is returned. Every servicer's domain
    errors are mapped to status codes by ``DomainErrorInterceptor``.
    """
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers),
        interceptors=[*interceptors, DomainErrorInterceptor()],
    )
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for registration in registrations:
        registration.add(registration.servicer, server)
    names = tuple(r.service_name for r in registrations)
    reflection.enable_server_reflection(
        (*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
        server,
    )
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"could not bind {address}")
    server.start()
    running = RunningServer(server=server, port=port, health=health_servicer, service_names=names)
    running.set_serving(serving)
    return running


def serve_until_signalled(running: RunningServer, *, grace: float, on_stop: Callable[[], None] | None = None) -> None:
    """Block until SIGTERM or SIGINT, then stop gracefully and run ``on_stop``."""
    stop_requested = threading.Event()

    def _request_stop(signum: int, _frame: object) -> None:
        log.info("received %s; shutting down gracefully", signal.Signals(signum).name)
        stop_requested.set()

    signal.signal(signal.SIGTERM, _request_stop)
    signal.signal(signal.SIGINT, _request_stop)
    stop_requested.wait()
    running.stop(grace)
    if on_stop is not None:
        on_stop()
    log.info("stopped")


def write_port_file(path: Path, port: int) -> None:
    """Publish the bound port for a launcher that asked for port 0 (atomic rename)."""
    partial = path.with_suffix(".partial")
    partial.write_text(str(port))
    os.replace(partial, path)


def configure_logging() -> None:
    """Plain single-line logs on stderr for the services' entry points."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def run_service(
    *,
    env_name: str,
    default_port: int,
    build: Callable[[ServiceConfig, Engine], Sequence[Registration]],
    on_stop: Callable[[], None] | None = None,
) -> None:
    """Run one service: the body of every service's ``main``.

    Reads the configuration of ``env_name``, opens the database, serves what ``build``
    registers until SIGTERM, then disposes the engine.
    """
    configure_logging()
    config = ServiceConfig.from_env(env_name, default_port)
    engine = create_engine(config.dsn)
    registrations = build(config, engine)
    running = create_server(registrations, config.address, max_workers=config.max_workers)
    log.info(
        "serving %s on port %d (%s database)",
        ", ".join(running.service_names),
        running.port,
        dsn_backend(config.dsn),
    )
    if config.port_file:
        write_port_file(Path(config.port_file), running.port)

    def _stop() -> None:
        if on_stop is not None:
            on_stop()
        engine.dispose()

    serve_until_signalled(running, grace=config.grace_seconds, on_stop=_stop)
