"""Database engines for every backend and whole-transaction retry.

Backends: MySQL-protocol servers (TiDB in production, MariaDB/MySQL in tests) through PyMySQL
at READ COMMITTED, and embedded SQLite in WAL mode where every transaction starts with
``BEGIN IMMEDIATE`` (one writer at a time, so ``FOR UPDATE``, which SQLite lacks, is not
needed there). Engines hide bound parameters so payloads never reach error text.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, Engine, make_url

from nexuscrm_runtime.faults import fault_point
from workqueue.errors import DomainError, ErrorKind

log = logging.getLogger(__name__)

T = TypeVar("T")

SQLITE_BUSY_TIMEOUT_MS = 30_000  # milliseconds a writer waits for the file lock
RETRY_ATTEMPTS = 8
RETRY_BASE_DELAY = 0.01  # seconds; doubled per attempt, with full jitter
RETRY_MAX_DELAY = 0.5  # seconds

# Errors after which the whole transaction may run again: MySQL deadlock (1213) and lock wait
# timeout (1205, after which MySQL keeps the transaction open, so we roll back first), TiDB
# write conflicts (8002, 8022, 9007).
RETRYABLE_MYSQL_CODES = frozenset({1205, 1213, 8002, 8022, 9007})
# Errors that mean the server or connection went away: the caller may retry the request.
UNAVAILABLE_MYSQL_CODES = frozenset({2003, 2006, 2013, 2014, 2055, 1927, 1053})
# PyMySQL waits forever for a reply by default, so a partitioned connection would hold its
# handler thread until the kernel gives up (hours). A DSN may set its own values
# (``?read_timeout=5``); the default outlasts any lock wait we configure (MySQL's 50 s
# ``innodb_lock_wait_timeout``, the cutover's 300 s default bound).
MYSQL_IO_TIMEOUT = 360  # seconds per socket read or write


class DatabaseUnavailable(DomainError):
    """The database could not be reached or dropped the connection; retry the request."""

    kind = ErrorKind.UNAVAILABLE


class TransactionConflict(DomainError):
    """A transaction kept conflicting with concurrent ones after every retry."""

    kind = ErrorKind.ABORTED


def normalize_dsn(dsn: str) -> URL:
    """Parse ``dsn``, choosing PyMySQL for MySQL URLs, utf8mb4 and bounded socket waits by default."""
    url = make_url(dsn)
    if url.get_backend_name() in {"mysql", "mariadb"}:
        url = url.set(drivername="mysql+pymysql")
        defaults = {"charset": "utf8mb4", "read_timeout": str(MYSQL_IO_TIMEOUT), "write_timeout": str(MYSQL_IO_TIMEOUT)}
        url = url.update_query_dict({key: value for key, value in defaults.items() if key not in url.query})
    return url


def is_sqlite(engine: Engine) -> bool:
    """True for the embedded backend."""
    return engine.dialect.name == "sqlite"


def create_engine(dsn: str, *, pool_size: int = 8) -> Engine:
    """An engine for ``dsn`` configured for this project's transaction rules."""
    url = normalize_dsn(dsn)
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(url)
    engine = sa.create_engine(
        url,
        isolation_level="READ COMMITTED",
        hide_parameters=True,
        pool_pre_ping=True,
        pool_recycle=3600,
        pool_size=pool_size,
        max_overflow=pool_size,
    )
    event.listen(engine, "handle_error", _unavailable_on_connection_loss)
    return engine


def _unavailable_on_connection_loss(context: sa.engine.ExceptionContext) -> None:
    """Raise ``DatabaseUnavailable`` for a lost connection wherever it happens.

    Reads outside ``run_transaction`` (claim candidates, payload pages, inspection) would
    otherwise surface a raw driver error, which the status table maps to INTERNAL instead of
    a retryable UNAVAILABLE. The connection is invalidated either way. A failed pool
    pre-ping is left alone: the pool reconnects after it by itself.
    """
    if context.is_pre_ping:
        return
    error = context.sqlalchemy_exception
    if context.is_disconnect or (error is not None and is_unavailable(error)):
        context.is_disconnect = True
        raise DatabaseUnavailable("database connection lost; retry the request") from context.original_exception


def _sqlite_engine(url: URL) -> Engine:
    if url.database and url.database != ":memory:":
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(
        url,
        hide_parameters=True,
        connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we issue BEGIN ourselves
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def mysql_error_code(error: BaseException) -> int | None:
    """The MySQL error number carried by a DBAPI error, if any."""
    orig = getattr(error, "orig", None)
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int):
        return args[0]
    return None


def is_retryable(error: BaseException) -> bool:
    """True when the failed transaction can safely run again from the start."""
    if not isinstance(error, sa.exc.DBAPIError):
        return False
    if mysql_error_code(error) in RETRYABLE_MYSQL_CODES:
        return True
    return "database is locked" in str(getattr(error, "orig", ""))


def is_unavailable(error: BaseException) -> bool:
    """True when the database connection failed rather than the statement."""
    if not isinstance(error, sa.exc.DBAPIError):
        return False
    return bool(error.connection_invalidated) or mysql_error_code(error) in UNAVAILABLE_MYSQL_CODES


def run_transaction(engine: Engine, work: Callable[[Connection], T], *, name: str) -> T:
    """Run ``work`` in one transaction, retrying conflicts as whole transactions.

    Deadlocks, lock-wait timeouts and TiDB write conflicts are retried up to
    ``RETRY_ATTEMPTS`` times with jittered exponential backoff, each retry logged; then
    ``TransactionConflict``. A lost connection raises ``DatabaseUnavailable``: whether a
    commit applied is then unknown, so only the caller (retrying an idempotent request) can
    resolve it. ``work`` must be safe to run again: it may only touch the database.
    """
    for attempt in range(1, RETRY_ATTEMPTS + 1):
        try:
            with engine.begin() as connection:
                result = work(connection)
                fault_point(f"{name}:before_commit")
            fault_point(f"{name}:after_commit")
            return result
        except DatabaseUnavailable as error:  # raised by _unavailable_on_connection_loss
            raise DatabaseUnavailable(f"database unavailable during {name}; retry the request") from error
        except sa.exc.DBAPIError as error:
            if is_unavailable(error):
                raise DatabaseUnavailable(f"database unavailable during {name}; retry the request") from error
            if not is_retryable(error):
                raise
            if attempt == RETRY_ATTEMPTS:
                raise TransactionConflict(
                    f"{name} conflicted with concurrent transactions {attempt} times; retry the request"
                ) from error
            delay = random.uniform(0, min(RETRY_MAX_DELAY, RETRY_BASE_DELAY * 2**attempt))
            log.warning(
                "retrying %s after %s (attempt %d of %d, sleeping %.3fs)",
                name,
                type(error.orig).__name__,
                attempt,
                RETRY_ATTEMPTS,
                delay,
            )
            time.sleep(delay)
    raise AssertionError("unreachable")
