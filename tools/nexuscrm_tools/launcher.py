"""Starting the four services as separate processes on OS-chosen ports, and stopping them.

Used by ``nexuscrm-run`` and by the acceptance tests. Each child binds port 0 and publishes
the port it got through ``NEXUSCRM_PORT_FILE``; the launcher then waits until the child's
health service answers SERVING. A service started early can be told where a later one will
listen (``reserved_ports``): Controlplane's dashboard is given the Integration host's target
before the host starts (the host needs Controlplane first).

Each child shows in ``ps`` as ``nexuscrm-<service> (launched by <pid>)`` (setproctitle, where
the child's interpreter has it).

A child never outlives its launcher (``service_command``): whatever ends the launcher, SIGKILL
included, each service gets SIGTERM, its graceful shutdown.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nexuscrm_runtime.server import side_port_file
from nexuscrm_runtime.tls import TlsFiles, open_channel

STARTUP_TIMEOUT = 60.0  # seconds for a service to report SERVING
STOP_TIMEOUT = 20.0  # seconds between SIGTERM and SIGKILL


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServiceSpec:
    """How to start one service: its module and the environment prefix of its settings."""

    name: str
    module: str
    env_name: str
    service_name: str


SCHEMA_CATALOG = ServiceSpec(
    name="schema-catalog",
    module="nexuscrm_schema_catalog.main",
    env_name="SCHEMA_CATALOG",
    service_name="nexuscrm.schemacatalog.v1.SchemaCatalogService",
)
CONTROLPLANE = ServiceSpec(
    name="controlplane",
    module="nexuscrm_controlplane.main",
    env_name="CONTROLPLANE",
    service_name="nexuscrm.controlplane.v1.ControlplaneService",
)
CONNECTORS = ServiceSpec(
    name="connectors",
    module="nexuscrm_connectors.main",
    env_name="CONNECTORS",
    service_name="nexuscrm.connectors.v1.ConnectorsService",
)
INTEGRATION = ServiceSpec(
    name="integration",
    module="nexuscrm_integration.main",
    env_name="INTEGRATION",
    service_name="nexuscrm.integration.v1.IntegrationService",
)
# The schema catalog starts first: it applies the canonical schema the others need. Connectors
# starts before the Controlplane, whose dashboard finds it through NEXUSCRM_CONNECTORS_TARGET.
ALL_SERVICES = (SCHEMA_CATALOG, CONNECTORS, CONTROLPLANE, INTEGRATION)


# Run in the child's interpreter before the service module, then become the service. The
# kernel's PR_SET_PDEATHSIG (prctl option 1, kept across exec) signals the child when the
# *thread* that forked it ends, so it is asked for only when the main thread launches; in every
# case a watchdog thread sends SIGTERM when the launcher process is gone (its parent changes).
# Not a preexec_fn: running Python between fork and exec in a process with live gRPC threads
# deadlocks in gRPC's fork handlers.
# The process title is set where setproctitle is installed (the tools' environment); an
# environment that holds only the service's own installation keeps Python's command line.
_DIE_WITH_PARENT = """
import ctypes, os, runpy, signal, sys, threading
parent, with_thread = int(sys.argv[1]), sys.argv[2] == "1"
try:
    import setproctitle
except ImportError:
    pass
else:
    setproctitle.setproctitle(sys.argv[3])
if with_thread and sys.platform == "linux":
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
if os.getppid() != parent:
    sys.exit(1)

def watch():
    while os.getppid() == parent:
        threading.Event().wait(1.0)
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=watch, name="launcher-watchdog", daemon=True).start()
module = sys.argv[4]
sys.argv = [module, *sys.argv[5:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def service_command(python: str, module: str, title: str) -> list[str]:
    """The command that runs ``python -m module`` in a child that stops when this process ends.

    Launched from the main thread, the kernel signals the child the moment the launcher dies
    (``PR_SET_PDEATHSIG``); from any thread, a watchdog in the child notices within
    a second. Either way the child gets SIGTERM, its graceful shutdown. ``title``: what ``ps``
    shows for the child.
    """
    main = threading.current_thread() is threading.main_thread()
    return [python, "-c", _DIE_WITH_PARENT, str(os.getpid()), "1" if main else "0", title, module]


def process_title(spec: ServiceSpec) -> str:
    """What ``ps`` shows for a service this process launched."""
    return f"nexuscrm-{spec.name} (launched by {os.getpid()})"


class LaunchError(RuntimeError):
    """A service did not start or did not become healthy; the message says which and why."""


@dataclasses.dataclass(kw_only=True)
class ServiceProcess:
    """A running service process, where it listens and the certificates it was started with."""

    spec: ServiceSpec
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    tls: TlsFiles | None = None

    @property
    def address(self) -> str:
        """host:port for clients."""
        return f"127.0.0.1:{self.port}"

    def channel(self) -> grpc.Channel:
        """A channel to the service, with the service's own certificate when it runs mutual TLS."""
        return open_channel(self.address, self.tls)

    def side_port(self, name: str) -> int | None:
        """The port of a side server (``metrics``, ``dashboard``) the service published, or None."""
        path = side_port_file(self.log_path.with_suffix(".port"), name)
        return int(path.read_text()) if path.exists() else None


def health_status(address: str, service_name: str = "", timeout: float = 2.0, tls: TlsFiles | None = None) -> str:
    """The health status name a service reports ("SERVING", "NOT_SERVING", ...)."""
    with open_channel(address, tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        response = stub.Check(health_pb2.HealthCheckRequest(service=service_name), timeout=timeout)
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


def _wait_for_port(spec: ServiceSpec, process: subprocess.Popen[bytes], port_file: Path, log_path: Path) -> int:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if port_file.exists():
            return int(port_file.read_text())
        if process.poll() is not None:
            raise LaunchError(f"{spec.name} exited with {process.returncode} during startup; see {log_path}")
        time.sleep(0.05)
    raise LaunchError(f"{spec.name} did not bind a port within {STARTUP_TIMEOUT:.0f}s; see {log_path}")


def _wait_serving(service: ServiceProcess) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while True:
        if service.process.poll() is not None:  # a refusal (e.g. the activation gate) ends the wait at once
            raise LaunchError(
                f"{service.spec.name} exited with {service.process.returncode} before serving; see {service.log_path}"
            )
        try:
            if health_status(service.address, service.spec.service_name, tls=service.tls) == "SERVING":
                return
        except grpc.RpcError:
            pass
        if time.monotonic() > deadline:
            raise LaunchError(
                f"{service.spec.name} is not SERVING after {STARTUP_TIMEOUT:.0f}s; see {service.log_path}"
            )
        time.sleep(0.1)


def start_service(
    spec: ServiceSpec, *, env: Mapping[str, str], workdir: Path, python: str = sys.executable, port: int = 0
) -> ServiceProcess:
    """Start one service on ``port`` (0: one the OS chooses) with ``env`` added to this process's environment.

    ``python`` is the interpreter that runs it: this one by default, or the interpreter of an
    environment that holds only the service's own installation (tests/architecture). A port
    other than 0 comes from ``reserved_ports``.
    """
    port_file = workdir / f"{spec.name}.port"
    port_file.unlink(missing_ok=True)
    for stale in workdir.glob(f"{spec.name}.*.port"):  # side ports of an earlier run
        stale.unlink()
    log_path = workdir / f"{spec.name}.log"
    child_env = {
        **os.environ,
        **env,
        f"NEXUSCRM_{spec.env_name}_ADDRESS": f"127.0.0.1:{port}",
        "NEXUSCRM_PORT_FILE": str(port_file),
    }
    with log_path.open("ab") as log_file:
        # A session of its own: Ctrl-C in a terminal reaches only the launcher, which then stops
        # the services in order (the worker host drains while Connectors still answers); and
        # whatever ends the launcher, the kernel stops the child (die_with_parent).
        process = subprocess.Popen(
            service_command(python, spec.module, process_title(spec)),
            env=child_env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        port = _wait_for_port(spec, process, port_file, log_path)
    except BaseException:  # interrupted or timed out: the caller never learns of this child
        process.kill()
        process.wait()
        raise
    return ServiceProcess(spec=spec, process=process, port=port, log_path=log_path, tls=TlsFiles.from_env(child_env))


def start_services(
    specs: Sequence[ServiceSpec],
    *,
    env: Mapping[str, str],
    workdir: Path,
    interpreters: Mapping[str, str] | None = None,
    ports: Mapping[ServiceSpec, int] | None = None,
) -> list[ServiceProcess]:
    """Start ``specs`` in order, each healthy before the next.

    Each service gets the addresses of those started before it (``NEXUSCRM_<NAME>_TARGET``,
    see ``target_env``) on top of ``env``. ``interpreters`` maps a service's name to the Python
    that runs it (default: this one); ``ports`` a service to the port ``reserved_ports`` holds
    for it (default: one the OS chooses). On failure, stops what started and raises.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    started: list[ServiceProcess] = []
    try:
        for spec in specs:
            python = (interpreters or {}).get(spec.name, sys.executable)
            port = (ports or {}).get(spec, 0)
            service = start_service(spec, env={**env, **target_env(started)}, workdir=workdir, python=python, port=port)
            started.append(service)
            _wait_serving(service)
    except BaseException:
        stop_services(started)
        raise
    return started


def target_env(services: Sequence[ServiceProcess]) -> dict[str, str]:
    """``NEXUSCRM_<NAME>_TARGET`` of each service: how later services and clients find them."""
    return {_target_variable(service.spec): service.address for service in services}


def reserved_target_env(ports: Mapping[ServiceSpec, int]) -> dict[str, str]:
    """``NEXUSCRM_<NAME>_TARGET`` of services not started yet, at the ports ``reserved_ports`` holds."""
    return {_target_variable(spec): f"127.0.0.1:{port}" for spec, port in ports.items()}


def _target_variable(spec: ServiceSpec) -> str:
    return f"NEXUSCRM_{spec.env_name}_TARGET"


@contextlib.contextmanager
def reserved_ports(specs: Sequence[ServiceSpec]) -> Iterator[dict[ServiceSpec, int]]:
    """A free port on 127.0.0.1 per service of ``specs``, held until the block ends.

    Each port is held by a socket bound with SO_REUSEADDR and never listening: the OS hands it
    out to no one else, while the service, whose gRPC server binds with SO_REUSEADDR too, can
    bind and listen (a bound socket that does not listen is no conflict: ``nexuscrm_runtime.listening``);
    connections reach only the service, the one listener. Start the services
    within the block (``start_services(..., ports=...)``).
    """
    holders: dict[ServiceSpec, socket.socket] = {}
    try:
        for spec in specs:
            holder = holders[spec] = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            holder.bind(("127.0.0.1", 0))
        yield {spec: int(holder.getsockname()[1]) for spec, holder in holders.items()}
    finally:
        for holder in holders.values():
            holder.close()


def stop_services(services: Sequence[ServiceProcess], timeout: float = STOP_TIMEOUT) -> dict[str, int]:
    """Stop services and return each one's exit code.

    Sends SIGTERM to every service (last started first) and SIGKILL to any still running
    after ``timeout`` seconds.
    """
    for service in reversed(services):
        if service.process.poll() is None:
            service.process.send_signal(signal.SIGTERM)
    codes: dict[str, int] = {}
    for service in reversed(services):
        try:
            codes[service.spec.name] = service.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            service.process.kill()
            codes[service.spec.name] = service.process.wait()
    return codes
