"""Whether a database URL can serve the runtime, said in one line a person can act on.

``nexuscrm-run`` checks NEXUSCRM_DSN before starting any service, and ``nexuscrm-schema``
checks its DSN before reading or migrating the schema, so a wrong URL ends at once with its
cause (unknown database, authentication failed, nothing listening, no database name,
unsupported scheme) instead of a traceback. The messages name where the URL came from, the
host, port, user and database, never the password.
"""

from __future__ import annotations

import socket

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import NullPool

from nexuscrm_runtime import failover
from nexuscrm_runtime.database import create_engine, mysql_error_code, normalize_dsn

SUPPORTED_BACKENDS = ("sqlite", "mysql", "mariadb")
CONNECT_TIMEOUT = 5  # seconds for the check's one connection attempt
# MySQL client and server error numbers, and what each means for the person who set the URL.
ACCESS_DENIED = (1045, 1698)  # wrong password; no password given where one is needed
DATABASE_ACCESS_DENIED = 1044
UNKNOWN_DATABASE = 1049
CANNOT_CONNECT = 2003


class DatabaseUnusable(RuntimeError):
    """The database URL cannot serve the runtime; the message is one line naming the cause."""


def check_database(dsn: str, *, named: str = "NEXUSCRM_DSN") -> None:
    """Connect once to ``dsn``; raise ``DatabaseUnusable`` saying why it cannot be used.

    ``named`` is where the URL came from (a variable or an option), as the messages call it.
    """
    try:
        url = make_url(dsn)
    except ArgumentError:
        raise DatabaseUnusable(
            f"{named} is not a database URL (sqlite:///PATH or mysql://USER@HOST:PORT/DATABASE)"
        ) from None
    backend = url.get_backend_name()
    if backend not in SUPPORTED_BACKENDS:
        raise DatabaseUnusable(
            f"{named} has the unsupported scheme {url.drivername!r}: use sqlite:///PATH or mysql://..."
        )
    if not url.database:
        raise DatabaseUnusable(f"{named} names no database: add /DATABASE to the URL ({_where(url)})")
    try:
        engine = create_engine(dsn) if backend == "sqlite" else _server_engine(url, named)
    except OSError as error:  # the SQLite file's folder cannot be made
        raise DatabaseUnusable(f"cannot use the {_where(url)}: {error.strerror}") from None
    try:
        with engine.connect() as connection:
            connection.execute(sa.select(1))
    except sa.exc.DBAPIError as error:
        raise DatabaseUnusable(_cause(url, error, named)) from None
    finally:
        engine.dispose()


def _server_engine(url: URL, named: str) -> Engine:
    """A bare engine (no reconnect handling, which would hide the cause) after the host resolves."""
    for host, port in failover.split_hosts(url)[1] or [(url.host or "localhost", url.port or 3306)]:
        try:
            socket.getaddrinfo(host, port)
        except OSError:
            raise DatabaseUnusable(f"unknown host {host!r} in {named}") from None
    query = {} if "connect_timeout" in url.query else {"connect_timeout": str(CONNECT_TIMEOUT)}
    bare, hosts = failover.split_hosts(normalize_dsn(url.render_as_string(hide_password=False)))
    engine = sa.create_engine(bare.update_query_dict(query), poolclass=NullPool)
    failover.install(engine, hosts)
    return engine


def _where(url: URL) -> str:
    if url.get_backend_name() == "sqlite":
        return f"sqlite file {url.database}"
    listed = failover.split_hosts(url)[1]
    if listed:
        return ", ".join(f"{host}:{port}" for host, port in listed)
    return f"{url.host or 'localhost'}:{url.port or 3306}"


def _cause(url: URL, error: sa.exc.DBAPIError, named: str) -> str:
    where = _where(url)
    code = mysql_error_code(error)
    if code == UNKNOWN_DATABASE:
        return f"database {url.database!r} does not exist on {where}: create it, or name another in {named}"
    if code in ACCESS_DENIED:
        return f"authentication failed for user {url.username!r} on {where}: check the user and password"
    if code == DATABASE_ACCESS_DENIED:
        return f"user {url.username!r} may not use database {url.database!r} on {where}"
    if code == CANNOT_CONNECT:
        return f"nothing is listening on {where}: is the database server running?"
    detail = f"error {code}" if code is not None else type(getattr(error, "orig", error)).__name__
    return f"cannot use the database at {where} ({detail})"
