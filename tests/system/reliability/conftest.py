"""Shared harness of the database-fault, restart and history tests: a Connectors process under test.

The schema catalog talks to the database directly; the Connectors process talks to it with
short socket timeouts, so a call cut off by a fault ends in seconds instead of the
production default: through ``tests.support.tcp_proxy`` (so the test can reset, refuse or
blackhole its connections), or straight to a private MariaDB server that the test restarts
(``tests.support.private_mariadb``; the shared server must never be restarted). An admin
engine, connected directly, checks the database and kills the service's connections by id.
``NEXUSCRM_RELIABILITY_FULL=1`` (``make reliability``) scales the scenarios up.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
import sqlalchemy as sa

from nexuscrm_runtime.database import create_engine, normalize_dsn
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_tools.launcher import (
    CONNECTORS,
    SCHEMA_CATALOG,
    ServiceProcess,
    start_services,
    stop_services,
    target_env,
)
from tests.conftest import REQUIRED
from tests.support.private_mariadb import PrivateMariaDB, PrivateServerError
from tests.support.sessions import processlist
from tests.support.tcp_proxy import TcpProxy, tcp_proxy

FULL = os.environ.get("NEXUSCRM_RELIABILITY_FULL") == "1"
SERVICE_IO_TIMEOUT = 2  # seconds: the proxied service's connect, read and write timeouts
CALL_TIMEOUT = 30.0  # seconds: client deadline, well above the service's own timeouts


def record_figures(test: str, figures: Mapping[str, object]) -> None:
    """Append a run's figures as one JSON line to ``NEXUSCRM_RELIABILITY_FIGURES`` (if set) and print them."""
    line = json.dumps({"test": test, **figures}, sort_keys=True, default=str)
    print(line)
    path = os.environ.get("NEXUSCRM_RELIABILITY_FIGURES")
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as sink:
            sink.write(line + "\n")


class ConnectorsCluster:
    """A schema catalog and a Connectors process on one database, and an admin engine on it."""

    def __init__(self, dsn: str, services: list[ServiceProcess]) -> None:
        self.dsn = dsn
        self.services = services
        self.admin = create_engine(dsn)

    @property
    def connectors(self) -> ServiceProcess:
        """The Connectors process (never restarted by these tests)."""
        return self.services[-1]

    @contextmanager
    def client(self) -> Iterator[ConnectorsClient]:
        """A client on a fresh channel, with a deadline on every call."""
        with grpc.insecure_channel(self.connectors.address) as channel:
            yield ConnectorsClient(channel, timeout=dt.timedelta(seconds=CALL_TIMEOUT))

    def close(self) -> dict[str, int]:
        """Stop the services and dispose the admin engine; each service's exit code."""
        codes = stop_services(self.services)
        self.admin.dispose()
        return codes


class ProxiedConnectors(ConnectorsCluster):
    """A cluster whose Connectors process reaches the database through a proxy."""

    def __init__(self, dsn: str, proxy: TcpProxy, services: list[ServiceProcess]) -> None:
        super().__init__(dsn, services)
        self.proxy = proxy

    def service_connection_ids(self, *, busy: bool = False) -> list[int]:
        """Server-side ids of the Connectors process's database connections (``busy``: running a statement)."""
        ports = {f"127.0.0.1:{port}" for port in self.proxy.upstream_ports()}
        with self.admin.connect() as connection:
            rows = connection.execute(sa.text(f"SELECT ID, HOST, COMMAND FROM {processlist(connection)}")).all()
        return [row.ID for row in rows if row.HOST in ports and (not busy or row.COMMAND == "Query")]

    def kill_connection(self, connection_id: int) -> bool:
        """``KILL CONNECTION`` one server connection; False if it was already gone."""
        with self.admin.connect() as connection:
            try:
                connection.exec_driver_sql(f"KILL CONNECTION {int(connection_id)}")
            except sa.exc.OperationalError:  # 1094 unknown thread id: it closed meanwhile
                return False
        return True


def service_dsn(dsn: str, port: int) -> str:
    """``dsn`` pointed at loopback ``port`` (a proxy's, or the server's own), with the test's short socket timeouts."""
    timeouts = {name: str(SERVICE_IO_TIMEOUT) for name in ("connect_timeout", "read_timeout", "write_timeout")}
    url = normalize_dsn(dsn).set(host="127.0.0.1", port=port).update_query_dict(timeouts)
    return url.render_as_string(hide_password=False)


def start_pair(dsn: str, connectors_dsn: str, env: Mapping[str, str], workdir: Path) -> list[ServiceProcess]:
    """Start the schema catalog on ``dsn``, then Connectors on ``connectors_dsn`` with extra ``env``."""
    (catalog,) = start_services([SCHEMA_CATALOG], env={"NEXUSCRM_DSN": dsn}, workdir=workdir)
    try:
        (connectors,) = start_services(
            [CONNECTORS],
            env={"NEXUSCRM_DSN": connectors_dsn, **target_env([catalog]), **env},
            workdir=workdir,
        )
    except BaseException:
        stop_services([catalog])
        raise
    return [catalog, connectors]


StartProxied = Callable[[Mapping[str, str]], ProxiedConnectors]


@pytest.fixture
def start_proxied(empty_dsn: str, tmp_path: Path) -> Iterator[StartProxied]:
    """Start the proxied pair with extra Connectors environment; everything stops at teardown."""
    url = normalize_dsn(empty_dsn)
    started: list[ProxiedConnectors] = []
    with tcp_proxy(url.host or "127.0.0.1", url.port or 3306) as proxy:

        def start(env: Mapping[str, str]) -> ProxiedConnectors:
            services = start_pair(empty_dsn, service_dsn(empty_dsn, proxy.port), env, tmp_path)
            cluster = ProxiedConnectors(empty_dsn, proxy, services)
            started.append(cluster)
            return cluster

        try:
            yield start
        finally:
            proxy.blackhole(False)
            proxy.refuse(False)
            for cluster in started:
                cluster.close()


@pytest.fixture
def private_server(tmp_path: Path) -> Iterator[PrivateMariaDB]:
    """A running MariaDB server of the test's own, killed at teardown.

    If it cannot start, the test fails under ``NEXUSCRM_TIDB_REQUIRED=1`` and is skipped otherwise.
    """
    server = PrivateMariaDB(tmp_path / "mariadb")
    try:
        try:
            server.install()
            server.start()
        except PrivateServerError as error:
            if REQUIRED:
                pytest.fail(f"NEXUSCRM_TIDB_REQUIRED=1: no private MariaDB server: {error}")
            pytest.skip(f"no private MariaDB server: {error}")
        yield server
    finally:
        server.close()
