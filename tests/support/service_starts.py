"""One service process started against a prepared database, and what its start said (decision 144).

``schema_at`` prepares a database at a schema version; a version newer than this release
knows is faked by recording future SchemaVersion rows (migrations only add, so a newer
database is this one plus rows and tables). ``start_until_exit`` runs a service expected to
refuse and returns it ended (its exit code, its log, the port file it never wrote);
``serving`` runs one until it reports SERVING. Only libraries and Core are imported (owner
suites stand alone).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nexuscrm_runtime.clock import DATABASE_CLOCK
from nexuscrm_runtime.database import create_engine
from nexuscrm_schema import tables
from nexuscrm_schema.verification import NEWEST_VERSION
from nexuscrm_schema_catalog import migrations
from tests.support.waiting import DEADLINE, wait_until


def schema_at(dsn: str, version: int) -> None:
    """Bring the empty database at ``dsn`` to ``version``: 0 leaves it empty; past the newest, fake rows."""
    engine = create_engine(dsn)
    try:
        if version:
            migrations.apply_schema(engine, target_version=min(version, NEWEST_VERSION))
        with engine.begin() as connection:
            for future in range(NEWEST_VERSION + 1, version + 1):
                row = {"Version": future, "Step": f"v{future}_from_a_newer_release", "AppliedAt": DATABASE_CLOCK.now()}
                connection.execute(tables.SchemaVersion.insert().values(**row))
    finally:
        engine.dispose()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Service:
    """How to start one service: its module and the prefix of its address variable."""

    module: str  # nexuscrm_connectors.main
    env_name: str  # CONNECTORS


@dataclasses.dataclass(frozen=True, kw_only=True)
class Started:
    """A service process, its log and where it publishes its port."""

    process: subprocess.Popen[bytes]
    log_path: Path
    port_file: Path

    @property
    def log(self) -> str:
        """Everything the process logged so far."""
        return self.log_path.read_text()

    def lines(self, level: str) -> list[str]:
        """The log lines of ``level`` (``ERROR``, ``WARNING``, ``INFO``)."""
        return [line for line in self.log.splitlines() if f" {level} " in line]


def _start(service: Service, dsn: str, workdir: Path, address: str = "127.0.0.1:0") -> Started:
    workdir.mkdir(parents=True, exist_ok=True)
    log_path, port_file = workdir / "service.log", workdir / "service.port"
    env = {
        **os.environ,
        "NEXUSCRM_DSN": dsn,
        f"NEXUSCRM_{service.env_name}_ADDRESS": address,
        "NEXUSCRM_PORT_FILE": str(port_file),
    }
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", service.module], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    return Started(process=process, log_path=log_path, port_file=port_file)


def _end(process: subprocess.Popen[bytes]) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def start_until_exit(service: Service, *, dsn: str, workdir: Path, address: str = "127.0.0.1:0") -> Started:
    """Start ``service`` on ``address`` (port 0 unless given) against ``dsn``; wait (bounded) until it exits."""
    started = _start(service, dsn, workdir, address)
    try:
        started.process.wait(timeout=DEADLINE)
    finally:
        _end(started.process)
    return started


def health(address: str) -> str:
    """The server-wide health status name (``SERVING``, ``NOT_SERVING``)."""
    with grpc.insecure_channel(address) as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


@contextlib.contextmanager
def serving(service: Service, *, dsn: str, workdir: Path) -> Iterator[tuple[Started, str]]:
    """Start ``service`` against ``dsn``, wait until it reports SERVING, yield it and its address; stop it after.

    The exit code of the graceful stop must be 0.
    """
    started = _start(service, dsn, workdir)
    try:
        wait_until(lambda: started.port_file.exists() or started.process.poll() is not None, "the service's port")
        assert started.process.poll() is None, f"exited with {started.process.returncode}:\n{started.log}"
        address = f"127.0.0.1:{started.port_file.read_text()}"
        wait_until(lambda: health(address) == "SERVING", "SERVING")
        yield started, address
    finally:
        code = _end(started.process)
    assert code == 0, started.log
