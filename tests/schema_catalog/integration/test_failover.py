"""A DSN listing several servers (decision 182): split in order, and a dead first server passed over."""

from __future__ import annotations

import socket

import pytest
import sqlalchemy as sa

from nexuscrm_runtime import failover
from nexuscrm_runtime.database import create_engine, normalize_dsn
from nexuscrm_runtime.database_check import DatabaseUnusable, check_database

INVARIANTS_NOT_CHECKED = "connects and reads the server's id; writes nothing the invariants cover"


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _listing(dsn: str, first: str) -> str:
    """``dsn`` as a multi-host DSN: ``first``, then the server of ``dsn``."""
    url = normalize_dsn(dsn)
    credentials = url.username or ""
    if url.password:
        credentials += f":{url.password}"
    return f"mysql://{credentials}@/{url.database}?host={first}&host={url.host}:{url.port or 3306}"


def test_the_hosts_are_tried_in_the_order_the_dsn_lists_them() -> None:
    url, hosts = failover.split_hosts(normalize_dsn("mysql://u@a:1/db?host=b:2&host=c"))
    assert hosts == [("a", 1), ("b", 2), ("c", 3306)]
    assert "host" not in url.query and url.database == "db"
    assert failover.split_hosts(normalize_dsn("mysql://u@a:1/db")) == (normalize_dsn("mysql://u@a:1/db"), [])


def test_a_malformed_listed_host_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="host='b:x' is not HOST or HOST:PORT"):
        failover.split_hosts(normalize_dsn("mysql://u@/db?host=a&host=b:x"))


def test_a_server_that_refuses_is_passed_over(mysql_server_dsn: str) -> None:
    listed = _listing(f"{mysql_server_dsn.rstrip('/')}/mysql", f"127.0.0.1:{_closed_port()}")
    check_database(listed)
    engine = create_engine(listed)
    try:
        with engine.connect() as connection:
            assert connection.execute(sa.text("SELECT @@port")).scalar_one() == normalize_dsn(mysql_server_dsn).port
    finally:
        engine.dispose()


def test_no_listed_server_ready_names_each_one() -> None:
    ports = [_closed_port(), _closed_port()]
    dsn = f"mysql://root@/mysql?host=127.0.0.1:{ports[0]}&host=127.0.0.1:{ports[1]}"
    with pytest.raises(DatabaseUnusable, match=f"127.0.0.1:{ports[0]}, 127.0.0.1:{ports[1]}"):
        check_database(dsn)
