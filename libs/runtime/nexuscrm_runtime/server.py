"""The shared gRPC server bootstrap: health, reflection, status mapping, observability, signals.

Signals of every service: SIGTERM and SIGINT stop gracefully, within the grace period plus
``SHUTDOWN_MARGIN`` whatever the service was doing (past that the process exits with
``EXIT_NOT_STOPPED``); SIGHUP reloads the certificates and the authorization policy. A
configuration refusal at start is one log line and exit code ``EXIT_CONFIG``; a database that
cannot be used (unreachable, missing a prerequisite, a schema the service does not support) is
one log line and exit code ``EXIT_NOT_STARTED``, before anything is registered or SERVING; so is
a listen address whose port another process holds (``listening``), before anything is SERVING.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pool
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from sqlalchemy.engine import Connection, Engine

from nexuscrm_runtime.authorization import AuthorizationInterceptor, Rule
from nexuscrm_runtime.config import ServiceConfig, check_address, dsn_backend, refusing_bad_configuration
from nexuscrm_runtime.database import DatabaseUnavailable, create_engine
from nexuscrm_runtime.database_check import DatabaseUnusable, check_database
from nexuscrm_runtime.exit_codes import ExitCode
from nexuscrm_runtime.listening import SERVER_OPTIONS, PortUnavailable, refuse_if_in_use
from nexuscrm_runtime.logs import configure_logging
from nexuscrm_runtime.metrics import RpcObservingInterceptor
from nexuscrm_runtime.metrics_endpoint import metrics_server
from nexuscrm_runtime.prerequisites import ServerFacts, StartRefused, read_server, verify
from nexuscrm_runtime.readiness import LIVENESS_NAME, Readiness, database_ready
from nexuscrm_runtime.security import Security
from nexuscrm_runtime.status import DomainErrorInterceptor
from nexuscrm_runtime.telemetry import Tracing, configure_tracing

log = logging.getLogger(__name__)
SHUTDOWN_MARGIN = 5.0  # seconds past a service's own bounds for the rest of its shutdown
SIGNAL_POLL = 0.2  # seconds between the main thread's looks at a pending signal
EXIT_NOT_STOPPED = 1  # the process did not stop within its bound and was ended


@dataclasses.dataclass(frozen=True, kw_only=True)
class Registration:
    """One servicer and how to add it to a server.

    ``add(servicer, server)`` comes from the *_pb2_grpc module; ``service_name`` is the full
    proto name reported by health and reflection; ``rules`` authorize each RPC by its method
    name (``authorization``), applied when the server runs with ``Security``.
    """

    servicer: Any
    add: Callable[[Any, grpc.Server], None]
    service_name: str
    rules: Mapping[str, Rule]

    def unruled_methods(self) -> list[str]:
        """The service's methods that have no rule (a server with ``Security`` refuses to start)."""
        service = descriptor_pool.Default().FindServiceByName(self.service_name)
        methods = (f"/{self.service_name}/{method.name}" for method in service.methods)
        return [method for method in methods if method not in self.rules]


@dataclasses.dataclass(kw_only=True)
class RunningServer:
    """A started server, the port it bound, its health servicer and, once it follows one, its readiness probe.

    Health names: "" and each service's name are its readiness (``set_serving``; SERVING
    while its gates passed and its database is usable), ``LIVENESS_NAME`` its liveness
    (SERVING from start until it stops).
    """

    server: grpc.Server
    port: int
    health: health.HealthServicer
    service_names: tuple[str, ...]
    readiness: Readiness | None = None

    def set_serving(self, serving: bool) -> None:
        """Report SERVING or NOT_SERVING for the whole server and each service (readiness)."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *self.service_names):
            self.health.set(name, status)

    def set_health(self, name: str, serving: bool) -> None:
        """Report SERVING or NOT_SERVING for one named part (e.g. a background loop of a service)."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        self.health.set(name, status)

    def follow_database(self, engine: Engine, *, interval: float) -> Readiness:
        """Report readiness as ``engine``'s database allows, probed every ``interval`` seconds, until ``stop``.

        Probes once before returning, so the health is the database's from here on.
        """
        self.readiness = Readiness(lambda: database_ready(engine), self.set_serving, interval=interval).start()
        return self.readiness

    def withdraw(self) -> None:
        """Stop following the database and report NOT_SERVING (a service that drains before it stops)."""
        if self.readiness is not None:
            self.readiness.stop()
        self.set_serving(False)

    def stop(self, grace: float) -> None:
        """Report NOT_SERVING, refuse new RPCs and wait up to ``grace`` seconds for in-flight ones."""
        self.health.enter_graceful_shutdown()  # first: a probe ending meanwhile no longer sets SERVING
        if self.readiness is not None:
            self.readiness.stop()
        self.server.stop(grace).wait()


def create_server(
    registrations: Sequence[Registration],
    address: str,
    *,
    interceptors: Sequence[grpc.ServerInterceptor[Any, Any]] = (),
    max_workers: int = 16,
    serving: bool = True,
    security: Security | None = None,
) -> RunningServer:
    """Build, bind and start a server with health checking and reflection.

    ``address`` may use port 0 (tests): the bound port is returned. ``interceptors`` run
    outermost (tracing); then every RPC is timed and given its log context
    (``RpcObservingInterceptor``) and its domain errors are mapped to status codes
    (``DomainErrorInterceptor``). With ``security`` the port speaks mutual TLS only and each
    RPC passes its registration's rule before its handler runs. The server never shares its
    port: binding one that another process holds raises ``PortUnavailable`` (``listening``).
    """
    chain: list[grpc.ServerInterceptor[Any, Any]] = [*interceptors, RpcObservingInterceptor(), DomainErrorInterceptor()]
    if security is not None:
        unruled = [method for registration in registrations for method in registration.unruled_methods()]
        if unruled:
            raise ValueError(f"RPCs without an authorization rule: {', '.join(unruled)}")
        rules = {method: rule for registration in registrations for method, rule in registration.rules.items()}
        chain.append(AuthorizationInterceptor(lambda: security.policy, rules))  # innermost: refusals map like any error
    executor = futures.ThreadPoolExecutor(max_workers=max_workers)
    server = grpc.server(executor, interceptors=chain, options=SERVER_OPTIONS)
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for registration in registrations:
        registration.add(registration.servicer, server)
    names = tuple(r.service_name for r in registrations)
    reflection.enable_server_reflection(
        (*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
        server,
    )
    try:
        if security is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, security.server_credentials())
    except RuntimeError as error:  # in use (taken since ``refuse_if_in_use`` looked), or not bindable
        raise PortUnavailable(f"cannot listen on {address}: {error}") from None
    if port == 0:
        raise PortUnavailable(f"cannot listen on {address}")
    server.start()
    running = RunningServer(server=server, port=port, health=health_servicer, service_names=names)
    running.set_serving(serving)
    running.set_health(LIVENESS_NAME, True)
    return running


class Signals:
    """SIGTERM and SIGINT request a stop, bounded by a deadline; SIGHUP reloads ``security``.

    Installed before start-up, so a stop requested while starting is not lost: the service
    stops as soon as it serves. ``deadline`` seconds after the first stop signal the process
    exits with ``EXIT_NOT_STOPPED`` if it has not ended by then: a handler thread stuck in a
    call (gRPC cannot cancel Python code) or a side server that does not stop must not keep a
    stopped service alive.
    """

    def __init__(self, *, deadline: float, security: Security | None = None) -> None:
        self.stop_requested = threading.Event()
        self._deadline = deadline
        self._security = security
        signal.signal(signal.SIGTERM, self._request_stop)
        signal.signal(signal.SIGINT, self._request_stop)
        if security is not None:
            signal.signal(signal.SIGHUP, self._reload)

    def wait(self) -> None:
        """Block until a stop is requested.

        Polls: the kernel may deliver the signal to another thread (gRPC's, uvicorn's), and
        Python runs its handler only when the main thread next runs bytecode; a main thread
        blocked in a plain ``Event.wait()`` would not notice it until woken by chance (a
        Controlplane once took over 20 s to see SIGTERM).
        """
        while not self.stop_requested.wait(SIGNAL_POLL):
            pass

    def _request_stop(self, signum: int, _frame: object) -> None:
        if self.stop_requested.is_set():
            return
        log.info("received %s; shutting down gracefully", signal.Signals(signum).name)
        self.stop_requested.set()
        watchdog = threading.Timer(self._deadline, self._end, args=(signal.Signals(signum).name,))
        watchdog.daemon = True
        watchdog.start()

    def _reload(self, _signum: int, _frame: object) -> None:
        if self._security is not None:
            self._security.reload()

    def _end(self, name: str) -> None:
        log.error("did not stop within %.0fs of %s; exiting now", self._deadline, name)
        logging.shutdown()
        os._exit(EXIT_NOT_STOPPED)


def serve_until_signalled(
    running: RunningServer, signals: Signals, *, grace: float, on_stop: Callable[[], None] | None = None
) -> None:
    """Block until ``signals`` asks to stop, then stop gracefully.

    ``on_stop`` (side servers, background loops) runs while the gRPC server waits up to
    ``grace`` for its in-flight calls, not after, so that the two waits do not add up.
    """
    signals.wait()
    grpc_stop = threading.Thread(target=running.stop, args=(grace,), name="grpc-stop")
    grpc_stop.start()
    if on_stop is not None:
        on_stop()
    grpc_stop.join()
    log.info("stopped")


def write_port_file(path: Path, port: int) -> None:
    """Publish the bound port for a launcher that asked for port 0 (atomic rename)."""
    partial = path.with_suffix(".partial")
    partial.write_text(str(port))
    os.replace(partial, path)


def side_port_file(port_file: Path, name: str) -> Path:
    """Where a side server (``metrics``, ``dashboard``) publishes its port: beside ``port_file``.

    ``var/controlplane.port`` -> ``var/controlplane.dashboard.port``. Written before the
    gRPC port file, so a launcher that saw the gRPC port finds the side ports too.
    """
    return port_file.with_name(f"{port_file.stem}.{name}{port_file.suffix}")


def publish_side_port(config: ServiceConfig, name: str, port: int) -> None:
    """Log a side server's port and, with ``NEXUSCRM_PORT_FILE`` set, publish it (``side_port_file``)."""
    log.info("serving %s on port %d", name, port)
    if config.port_file:
        write_port_file(side_port_file(Path(config.port_file), name), port)


@contextlib.contextmanager
def observability(service: str, config: ServiceConfig, security: Security | None = None) -> Iterator[Tracing]:
    """Tracing as ``NEXUSCRM_OTEL`` asks and, if configured, the metrics endpoint, while inside.

    Yields the process's ``Tracing`` (its server interceptors, engine instrumentation). With
    ``security`` the metrics endpoint speaks mutual TLS (``metrics_endpoint``).
    """
    tracing = configure_tracing(f"nexuscrm-{service.lower().replace('_', '-')}")
    try:
        with contextlib.ExitStack() as stack:
            if config.metrics_address:
                endpoint = metrics_server(config.metrics_address, security=security)
                publish_side_port(config, "metrics", stack.enter_context(endpoint))
            yield tracing
    finally:
        tracing.shutdown()


EXIT_NOT_STARTED = ExitCode.UNREACHABLE  # 3, the shared table's "a service did not start"
EXIT_PREREQUISITES = EXIT_NOT_STARTED


@contextlib.contextmanager
def refusing_to_start(engine: Engine | None = None) -> Iterator[None]:
    """Turn a start-up refusal inside into one log line and exit ``EXIT_NOT_STARTED``.

    Refusals: ``StartRefused`` (a prerequisite, a schema gate, a port in use), a database URL that cannot be
    used (``DatabaseUnusable``) and a connection lost while checking (``DatabaseUnavailable``).
    ``engine`` is disposed first.
    """
    try:
        yield
    except (StartRefused, DatabaseUnusable, DatabaseUnavailable) as error:
        if engine is not None:
            engine.dispose()
        log.error("refusing to start: %s", error)
        sys.exit(EXIT_NOT_STARTED)


def refuse_unless_prerequisites(engine: Engine, *, read: Callable[[Connection], ServerFacts] = read_server) -> None:
    """Exit with ``EXIT_PREREQUISITES`` and one log line naming each unmet database prerequisite."""
    with refusing_to_start(engine):
        verify(engine, read=read)


def run_service(
    *,
    env_name: str,
    default_port: int,
    build: Callable[[ServiceConfig, Engine, Security | None], Sequence[Registration]],
    on_stop: Callable[[], None] | None = None,
    on_serving: Callable[[RunningServer], None] | None = None,
    before_serving: Callable[[Engine], None] | None = None,
    side_addresses: Mapping[str, str] | None = None,
) -> None:
    """Run one service: the body of every service's ``main``.

    Reads the configuration of ``env_name`` and its ``Security``, sets up logs, tracing and
    metrics, opens the database, runs the start-up gates, serves what ``build`` registers
    until SIGTERM, then disposes the engine. The gates, in order: the database URL connects
    (``database_check``), the server meets the prerequisites (``prerequisites``), then
    ``before_serving`` (the service's schema gate, ``nexuscrm_schema.support``), which raises
    ``StartRefused`` to refuse. Before them, the listen and metrics addresses, and those of
    the service's side servers (``side_addresses``: variable name -> host:port, "" when not
    configured, such as Controlplane's dashboard), must be free (``listening``: a second
    instance on the same port). A refusal is one log line and exit
    ``EXIT_NOT_STARTED`` before ``build`` runs: nothing is registered, no port is bound, nothing
    reports SERVING.
    ``on_serving`` gets the started server (to report the health of a background part, for
    instance). Once serving, the overall health follows the database (``readiness``:
    NOT_SERVING while it cannot be used), probed every ``NEXUSCRM_READINESS_INTERVAL_MS``.
    """
    with refusing_bad_configuration():
        configure_logging()
        config = ServiceConfig.from_env(env_name, default_port)
        security = Security.from_env()
        signals = Signals(deadline=config.grace_seconds + SHUTDOWN_MARGIN, security=security)
        sides = [check_address(name, address) for name, address in (side_addresses or {}).items() if address]
        _serve(env_name, config, security, signals, build, on_stop, on_serving, before_serving, sides)


def _serve(
    env_name: str,
    config: ServiceConfig,
    security: Security | None,
    signals: Signals,
    build: Callable[[ServiceConfig, Engine, Security | None], Sequence[Registration]],
    on_stop: Callable[[], None] | None,
    on_serving: Callable[[RunningServer], None] | None,
    before_serving: Callable[[Engine], None] | None,
    side_addresses: Sequence[str],
) -> None:
    with refusing_to_start():  # a second instance on the same ports, before it touches anything
        refuse_if_in_use(config.address, config.metrics_address, *side_addresses)
    with observability(env_name, config, security) as tracing:
        with refusing_to_start():
            check_database(config.dsn)
        # One pooled connection per RPC thread: a smaller pool closes its overflow connections
        # on every check-in, and each RPC past it would connect (and authenticate) anew.
        engine = create_engine(config.dsn, pool_size=config.max_workers)
        with refusing_to_start(engine):
            verify(engine)
            if before_serving is not None:
                before_serving(engine)
        tracing.instrument_engine(engine)
        registrations = build(config, engine, security)
        with refusing_to_start(engine):  # the port was taken since the check above
            running = create_server(
                registrations,
                config.address,
                interceptors=tracing.interceptors,
                max_workers=config.max_workers,
                serving=False,
                security=security,
            )
        running.follow_database(engine, interval=config.readiness_interval_ms / 1000)
        log.info(
            "serving %s on port %d (%s database, %s)",
            ", ".join(running.service_names),
            running.port,
            dsn_backend(config.dsn),
            "mutual TLS and authorization" if security else "plaintext, no authorization",
        )
        if on_serving is not None:
            on_serving(running)
        if config.port_file:
            write_port_file(Path(config.port_file), running.port)

        serve_until_signalled(running, signals, grace=config.grace_seconds, on_stop=on_stop)
        engine.dispose()
