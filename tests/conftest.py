"""Database harness: every database test runs on SQLite and on a MySQL-protocol server.

NEXUSCRM_TIDB_DSN names a MySQL-protocol server (TiDB, MariaDB, MySQL); each test gets its
own uniquely named database, created and dropped around it. Without a DSN, the session starts
a throwaway private MariaDB server when one is installed (``mariadbd``; its datadir in the
session's temporary directory, gone afterwards), else testcontainers' MariaDB when Docker
works. NEXUSCRM_TIDB_REQUIRED=1 turns the skip of a database test
into a failure. NEXUSCRM_REPO_ROOT names the Core checkout whose canonical schema is applied: the
database fixtures fail without it; which checkout each package comes from is the virtualenv's
choice, and the report header says it (tests/harness).
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from nexuscrm_runtime.database import create_engine, normalize_dsn
from tests.harness.checkouts import CORE_VARIABLE, core_checkout_problem
from tests.harness.provenance import owner_sources
from tests.support.pki import Pki, make_pki
from tests.support.private_mariadb import PrivateMariaDB, PrivateServerError

# This test tree's checkout (the README and the sources the tests read), never NEXUSCRM_REPO_ROOT.
REPO_ROOT = Path(__file__).resolve().parents[1]

BACKENDS = ("sqlite", "mysql")
REQUIRED = os.environ.get("NEXUSCRM_TIDB_REQUIRED") == "1"


def pytest_report_header() -> list[str]:
    return [
        *owner_sources(),
        "MySQL-protocol backend: "
        + (
            "NEXUSCRM_TIDB_DSN"
            if os.environ.get("NEXUSCRM_TIDB_DSN")
            else "a private MariaDB server if installed, else testcontainers if Docker works"
        )
        + (" (required)" if REQUIRED else ""),
    ]


def require_core_checkout() -> None:
    """Fail the test when NEXUSCRM_REPO_ROOT does not name a Core checkout (canonical-table tests need it)."""
    problem = core_checkout_problem(os.environ.get(CORE_VARIABLE))
    if problem:
        pytest.fail(problem, pytrace=False)


@pytest.fixture(scope="session")
def mysql_server_dsn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The DSN of a MySQL-protocol server, without a database name."""
    require_core_checkout()
    dsn = os.environ.get("NEXUSCRM_TIDB_DSN")
    if dsn:
        yield dsn
        return
    server = PrivateMariaDB(tmp_path_factory.mktemp("mariadb"))
    try:
        server.install()
        server.start()
    except PrivateServerError:  # not installed, or it cannot run here: try Docker
        server.close()
    else:
        try:
            yield server.dsn
        finally:
            server.stop()
        return
    try:
        from testcontainers.mysql import MySqlContainer

        container = MySqlContainer("mariadb:11", username="root", password="test")
        container.start()
    except Exception as error:
        message = f"no NEXUSCRM_TIDB_DSN and testcontainers could not start MariaDB: {error}"
        if REQUIRED:
            pytest.fail(f"NEXUSCRM_TIDB_REQUIRED=1: {message}")
        pytest.skip(message)
    try:
        yield container.get_connection_url()
    finally:
        container.stop()


def _mysql_database(server_dsn: str, prefix: str = "nxtest") -> Iterator[str]:
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(str(normalize_dsn(server_dsn).set(database=None)))
    with admin.begin() as connection:
        connection.exec_driver_sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    try:
        yield str(normalize_dsn(server_dsn).set(database=name).render_as_string(hide_password=False))
    finally:
        with admin.begin() as connection:
            connection.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
        admin.dispose()


def _migrated(dsn: str) -> str:
    """``dsn``'s database at the newest canonical schema, by the Core checkout's own migrations."""
    # Imported here, not at collection: a candidate's schema mismatch fails the database tests only.
    from nexuscrm_schema_catalog import migrations

    require_core_checkout()
    engine = create_engine(dsn)
    migrations.apply_schema(engine)
    engine.dispose()
    return dsn


# Migrating takes 0.2 s on SQLite and about a second on MariaDB (a dozen steps of DDL), so each
# session migrates one template per backend and every test's database is a copy of it: the
# same tables, indexes and rows (the schema versions, the payload contract), made in a few ms.
@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The path of a SQLite database at the newest canonical schema."""
    path = tmp_path_factory.mktemp("template") / "nexuscrm.db"
    _migrated(f"sqlite:///{path}")
    return str(path)


@pytest.fixture(scope="session")
def mysql_template(mysql_server_dsn: str) -> Iterator[str]:
    """The name of a database on the MySQL-protocol server at the newest canonical schema."""
    for dsn in _mysql_database(mysql_server_dsn, prefix="nxtemplate"):
        yield str(sa.make_url(_migrated(dsn)).database)


def _copy_sqlite(template: str, dsn: str) -> None:
    with sqlite3.connect(template) as source, sqlite3.connect(str(sa.make_url(dsn).database)) as target:
        source.backup(target)


def _copy_mysql(template: str, dsn: str) -> None:
    engine = create_engine(dsn)
    try:
        with engine.begin() as connection:
            names = connection.exec_driver_sql(
                "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s", (template,)
            ).scalars()
            for name in list(names):
                connection.exec_driver_sql(f"CREATE TABLE `{name}` LIKE `{template}`.`{name}`")
                connection.exec_driver_sql(f"INSERT INTO `{name}` SELECT * FROM `{template}`.`{name}`")
    finally:
        engine.dispose()


@pytest.fixture(params=BACKENDS)
def empty_dsn(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The DSN of an empty, isolated database on each backend."""
    require_core_checkout()
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'nexuscrm.db'}"
    else:
        yield from _mysql_database(request.getfixturevalue("mysql_server_dsn"))


@pytest.fixture
def empty_engine(empty_dsn: str) -> Iterator[sa.Engine]:
    """An engine on an empty, isolated database."""
    engine = create_engine(empty_dsn)
    yield engine
    engine.dispose()


@pytest.fixture
def dsn(empty_dsn: str, request: pytest.FixtureRequest) -> str:
    """The DSN of an isolated database at the newest canonical schema (a copy of the session's template)."""
    if sa.make_url(empty_dsn).get_backend_name() == "sqlite":
        _copy_sqlite(request.getfixturevalue("sqlite_template"), empty_dsn)
    else:
        _copy_mysql(request.getfixturevalue("mysql_template"), empty_dsn)
    return empty_dsn


@pytest.fixture
def engine(dsn: str) -> Iterator[sa.Engine]:
    """An engine on an isolated database at the newest canonical schema."""
    engine = create_engine(dsn)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """An offline CA, certificates and the authorization policy (``tests.support.pki``)."""
    return make_pki(tmp_path_factory.mktemp("pki"))
