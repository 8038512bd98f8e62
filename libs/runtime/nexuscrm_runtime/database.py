"""Database engines for every backend and whole-transaction retry.

Backends: MySQL-protocol servers (TiDB in production, MariaDB/MySQL in tests) through PyMySQL
at READ COMMITTED (each TiDB session set as ``prerequisites`` says), and embedded SQLite in
WAL mode where every transaction starts with ``BEGIN IMMEDIATE`` (one writer at a time, so
``FOR UPDATE``, which SQLite lacks, is not needed there). Engines hide bound parameters so
payloads never reach error text.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import time
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar, cast

import sqlalchemy as sa
from prometheus_client import Counter
from pymysql.constants.SERVER_STATUS import SERVER_STATUS_IN_TRANS
from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.pool import PoolResetState

from nexuscrm_runtime import causal, failover, sqlite_writer
from nexuscrm_runtime.clock import TIDB_DIALECT_FLAG
from nexuscrm_runtime.engine_errors import (
    DUPLICATE_KEY_CODES,
    SQLITE_STORAGE_ERRORS,
    EngineError,
    ErrorClass,
    engine_error,
    error_class,
)
from nexuscrm_runtime.faults import fault_point
from nexuscrm_runtime.mysql_conversions import CONVERSIONS
from nexuscrm_runtime.prerequisites import install_session_settings, is_tidb
from nexuscrm_runtime.tidb_profile import ENV as PROFILE_ENV
from nexuscrm_runtime.tidb_profile import TidbProfile
from workqueue.errors import DomainError, ErrorKind

log = logging.getLogger(__name__)

T = TypeVar("T")

SQLITE_BUSY_TIMEOUT_MS = 30_000  # milliseconds a writer waits for the file lock
# Conflict retries (``RetryPolicy``), sized for multi-writer contention: on a multi-primary
# engine (Galera) writers on different nodes abort each other at commit on their shared hot
# rows (a pack's PackInstall counter, a generation's row), so a fixed handful of attempts is
# used up by a burst. Full jitter spreads the retries of the writers that collided; the
# budget, not a count, bounds the whole call (TiDB's rule: retried transactions are bounded).
RETRY_BUDGET = 10.0  # seconds from the first attempt after which a conflict is no longer retried
RETRY_BASE_DELAY = 0.01  # seconds: the ceiling of the first backoff, doubled per retry
RETRY_MAX_DELAY = 0.5  # seconds: the largest ceiling of one backoff (mean sleep at the cap 0.25 s)

FOLLOW_UP_FAILURES = Counter(
    "nexuscrm_follow_up_failures_total",
    "Steps after a committed transaction that failed and were left to their backstop, by transaction name.",
    ["transaction"],
)
CONFLICTS = Counter(
    "nexuscrm_transaction_conflicts_total",
    "Transactions that conflicted with concurrent ones, by transaction name and what followed (retried, exhausted).",
    ["transaction", "outcome"],
)

# The longest a ``run_transaction`` attempt may run (and hold its locks) before it is rolled
# back: a statement starting or a commit after it raises ``TransactionTooLong``. Longer than any
# healthy transaction here (milliseconds; a lock wait is bounded by the server's 50 s
# ``innodb_lock_wait_timeout``, which one statement may add), far below TiDB's 1 h lock TTL.
MAX_TRANSACTION_SECONDS = 60.0  # seconds
# (clock, deadline, name, bound) of the attempt this thread runs; a context variable, not
# connection state, so that a connection lost mid-attempt needs no cleanup.
_DEADLINE: ContextVar[tuple[Callable[[], float], float, str, float] | None] = ContextVar(
    "nexuscrm_transaction_deadline", default=None
)

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


class TransactionTooLong(DomainError):
    """A transaction ran past its maximum duration and was rolled back: nothing of it committed."""

    kind = ErrorKind.ABORTED


class DatabaseLimitExceeded(DomainError):
    """A transaction or statement exceeded a server limit; the same work would fail again."""

    kind = ErrorKind.RESOURCE_EXHAUSTED


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


def create_engine(dsn: str, *, pool_size: int = 8, tidb_profile: TidbProfile | None = None) -> Engine:
    """An engine for ``dsn`` configured for this project's transaction rules.

    ``tidb_profile`` makes a MySQL-protocol engine refuse what TiDB would refuse for its size
    (default: TiDB's limits when ``NEXUSCRM_TIDB_PROFILE=1``; ``nexuscrm_runtime.tidb_profile``).
    """
    url = normalize_dsn(dsn)
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(url)
    url, hosts = failover.split_hosts(url)
    engine = sa.create_engine(
        url,
        isolation_level="READ COMMITTED",
        hide_parameters=True,
        pool_pre_ping=True,
        pool_recycle=3600,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_reset_on_return=None,  # _reset_open_transaction instead
        connect_args={"conv": CONVERSIONS},
    )
    failover.install(engine, hosts)
    event.listen(engine, "reset", _reset_open_transaction)
    event.listen(engine, "handle_error", _unavailable_on_connection_loss)

    @event.listens_for(engine, "first_connect")
    def _detect_engine(dbapi_connection: Any, _record: Any) -> None:
        # TiDB's SQL nodes each have their own clock: the database clock reads PD's instead.
        setattr(engine.dialect, TIDB_DIALECT_FLAG, is_tidb(dbapi_connection.get_server_info()))
        causal.detect_galera(engine, dbapi_connection)  # Galera's reads lag: causal reads wait

    install_session_settings(engine)
    event.listen(engine, "before_cursor_execute", _check_transaction_deadline)
    if tidb_profile is None and os.environ.get(PROFILE_ENV) == "1":
        tidb_profile = TidbProfile()
    if tidb_profile is not None:
        tidb_profile.install(engine)
    return engine


def _reset_open_transaction(dbapi_connection: Any, _record: Any, reset_state: PoolResetState) -> None:
    """Roll back a connection returned to the pool only when the server says its transaction is open.

    The pool's default reset rolls back every returned connection, which after a committed
    ``run_transaction`` is one more round trip per transaction for nothing (docs/performance-log.md,
    "Twenty-third pass"). Every OK packet carries the server's in-transaction flag, which PyMySQL
    keeps: after SQLAlchemy's own COMMIT or ROLLBACK it is clear. A connection given back with
    work still open (a raw DBAPI use, a failure SQLAlchemy did not roll back) is rolled back as
    before.
    """
    if not reset_state.transaction_was_reset and dbapi_connection.server_status & SERVER_STATUS_IN_TRANS:
        dbapi_connection.rollback()


def _unavailable_on_connection_loss(context: sa.engine.ExceptionContext) -> None:
    """Raise ``DatabaseUnavailable`` for a lost connection, ``DatabaseLimitExceeded`` for a limit, wherever.

    Reads outside ``run_transaction`` (claim candidates, payload pages, inspection) would
    otherwise surface a raw driver error, which the status table maps to INTERNAL instead of
    a retryable UNAVAILABLE or a RESOURCE_EXHAUSTED naming the limit. The connection is
    invalidated after a loss. A failed pool pre-ping is left alone: the pool reconnects after
    it by itself. Conflicts stay driver errors here, so that ``run_transaction`` retries them.
    """
    if context.is_pre_ping:
        return
    error = context.sqlalchemy_exception
    if context.is_disconnect or (error is not None and is_unavailable(error)):
        context.is_disconnect = True
        raise DatabaseUnavailable("database connection lost; retry the request") from context.original_exception
    refusal = None if error is None else limit_exceeded(error, "a statement")
    if refusal is not None:
        raise refusal from context.original_exception


def _sqlite_engine(url: URL) -> Engine:
    if url.database and url.database != ":memory:":
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(
        url.set(drivername=f"sqlite+{sqlite_writer.DRIVER}"),  # BEGIN IMMEDIATE behind the engine's writer lock
        hide_parameters=True,
        connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
        writer_timeout=SQLITE_BUSY_TIMEOUT_MS / 1000,
    )
    dialect = cast(sqlite_writer.SerializedWriterDialect, engine.dialect)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we issue BEGIN ourselves
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.close()

    event.listen(engine, "handle_error", _reopen_after_storage_fault)
    # A connection back in the pool, or dropped, never keeps the writer (its transaction ended).
    for ended in ("checkin", "invalidate"):
        event.listen(engine, ended, lambda dbapi_connection, *_: dialect.release(dbapi_connection))
    event.listen(engine, "before_cursor_execute", _check_transaction_deadline)
    return engine


def _reopen_after_storage_fault(context: sa.engine.ExceptionContext) -> None:
    """Drop the pool's SQLite connections after a file that could not be written or read (UNAVAILABLE).

    SQLite decides at open whether a file is writable: a connection opened while the file was
    read-only stays read-only. Marked as a disconnect, the pool opens new connections, so the
    service writes again as soon as the file does, without a restart. A full disk keeps its
    connections: they write again once space returns.
    """
    entry = _sqlite_storage_error(context.sqlalchemy_exception)
    if entry is not None and entry.error_class is ErrorClass.UNAVAILABLE and not context.is_pre_ping:
        context.is_disconnect = True


def _sqlite_storage_error(error: BaseException | None) -> EngineError | None:
    """The storage-fault entry of a sqlite3 error (``SQLITE_STORAGE_ERRORS``); None for any other error."""
    code = getattr(getattr(error, "orig", None), "sqlite_errorcode", None)
    return SQLITE_STORAGE_ERRORS.get(code & 0xFF) if isinstance(code, int) else None


def storage_fault(error: BaseException, what: str) -> DomainError | None:
    """The refusal for an embedded SQLite storage fault during ``what``, naming its cause; None otherwise.

    A full disk is RESOURCE_EXHAUSTED (``DatabaseLimitExceeded``), a file that cannot be
    written or read UNAVAILABLE (``DatabaseUnavailable``); either way the transaction rolled
    back and nothing of it was committed, so the same request is safe to send again.
    """
    entry = _sqlite_storage_error(error)
    if entry is None:
        return None
    refusal = DatabaseLimitExceeded if entry.error_class is ErrorClass.TOO_LARGE else DatabaseUnavailable
    return refusal(f"{what} failed: {entry.meaning}; nothing was committed, retry the request then")


def _check_transaction_deadline(*_args: Any) -> None:
    """Refuse a statement of a ``run_transaction`` attempt past its deadline (the attempt then rolls back)."""
    bound = _DEADLINE.get()
    if bound is not None:
        clock, deadline, name, seconds = bound
        if clock() > deadline:
            raise TransactionTooLong(
                f"{name} ran longer than its {seconds:g} s bound and was rolled back; "
                "nothing was committed, retry the request"
            )


def mysql_error_code(error: BaseException) -> int | None:
    """The MySQL error number carried by a DBAPI error, if any."""
    orig = getattr(error, "orig", None)
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int):
        return args[0]
    return None


def is_retryable(error: BaseException) -> bool:
    """True when the failed transaction can safely run again from the start (a ``CONFLICT`` of the table)."""
    if not isinstance(error, sa.exc.DBAPIError):
        return False
    if error_class(mysql_error_code(error)) is ErrorClass.CONFLICT:
        return True
    return "database is locked" in str(getattr(error, "orig", ""))


def is_duplicate_key(error: BaseException) -> bool:
    """True when a MySQL-protocol engine refused a row whose unique key another transaction holds."""
    return isinstance(error, sa.exc.DBAPIError) and mysql_error_code(error) in DUPLICATE_KEY_CODES


def is_unavailable(error: BaseException) -> bool:
    """True when the database connection or cluster failed rather than the statement."""
    if not isinstance(error, sa.exc.DBAPIError):
        return False
    return bool(error.connection_invalidated) or error_class(mysql_error_code(error)) is ErrorClass.UNAVAILABLE


def limit_exceeded(error: BaseException, what: str) -> DatabaseLimitExceeded | None:
    """The refusal for a driver error of class ``TOO_LARGE``, naming the limit; None for any other error."""
    entry = engine_error(mysql_error_code(error)) if isinstance(error, sa.exc.DBAPIError) else None
    if entry is None or entry.error_class is not ErrorClass.TOO_LARGE:
        return None
    return DatabaseLimitExceeded(
        f"{what} was refused by the database: {entry.meaning} (error {entry.code}); nothing was "
        "committed, and the same request fails again until it is smaller or the limit is raised"
    )


def domain_error(error: BaseException) -> DomainError | None:
    """The refusal a driver error that escaped every retry stands for; None: a bug (INTERNAL).

    The RPC layer asks this of an error no handler caught, so that a conflict in a statement
    run outside ``run_transaction`` answers ABORTED (retry the request) like one inside it.
    """
    if isinstance(error, DomainError):
        return error
    if not isinstance(error, sa.exc.DBAPIError):
        return None
    fault = storage_fault(error, "a statement")
    if fault is not None:
        return fault
    if is_unavailable(error):
        return DatabaseUnavailable("database unavailable; retry the request")
    if is_retryable(error):
        return TransactionConflict("a statement conflicted with a concurrent transaction; retry the request")
    return limit_exceeded(error, "a statement")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How ``run_transaction`` retries conflicts: full-jitter exponential backoff within a time budget.

    The sleep before retry n (1-based) is uniform in [0, min(``max_delay``, ``base_delay`` *
    2**(n-1))]. A retry is made only if it would start (after its sleep) less than ``budget``
    seconds after the first attempt started; otherwise the conflict is final. There is no
    attempt count: a burst of conflicts among a few writers is outlasted, a call never runs
    much past its budget, and a transaction that alone takes longer than the budget is not
    retried. ``clock`` (seconds, monotonic), ``sleep`` and ``jitter`` are injectable for tests.
    """

    budget: float = RETRY_BUDGET  # seconds
    base_delay: float = RETRY_BASE_DELAY  # seconds
    max_delay: float = RETRY_MAX_DELAY  # seconds
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    jitter: Callable[[float, float], float] = random.uniform

    def __post_init__(self) -> None:
        if self.budget < 0 or self.base_delay < 0 or self.max_delay < self.base_delay:
            raise ValueError("RetryPolicy needs budget >= 0 and 0 <= base_delay <= max_delay (seconds)")

    def delay(self, retry: int, started: float) -> float | None:
        """The sleep before retry ``retry`` (1-based) of a call that started at ``started``; None: give up."""
        ceiling = min(self.max_delay, self.base_delay * 2 ** min(retry - 1, 62))
        delay = self.jitter(0.0, ceiling)
        if self.clock() + delay - started >= self.budget:
            return None
        return delay


DEFAULT_RETRY = RetryPolicy()


def run_transaction(
    engine: Engine,
    work: Callable[[Connection], T],
    *,
    name: str,
    retry: RetryPolicy | None = None,
    max_seconds: float | None = MAX_TRANSACTION_SECONDS,
    unique_keys_conflict: bool = False,
) -> T:
    """Run ``work`` in one transaction, retrying conflicts as whole transactions.

    The conflicts of ``engine_errors.ENGINE_ERRORS`` (deadlocks, lock-wait timeouts, Galera
    certification failures reported as deadlocks, TiDB write conflicts, schema changes and
    lock-resolve timeouts) are retried under ``retry`` (default ``DEFAULT_RETRY``: jittered
    exponential backoff within ``RETRY_BUDGET`` seconds), each retry logged and counted
    (``nexuscrm_transaction_conflicts_total``); then ``TransactionConflict``, and nothing
    of ``work`` committed. A lost connection raises ``DatabaseUnavailable``: whether a
    commit applied is then unknown, so only the caller (retrying an idempotent request) can
    resolve it. A server limit (``TOO_LARGE``) raises ``DatabaseLimitExceeded`` naming it,
    not retried; so does SQLite's full disk, and its read-only or unreadable file raises
    ``DatabaseUnavailable`` naming the cause (``storage_fault``). ``work`` must be safe to
    run again: it may only touch the database. With ``unique_keys_conflict`` a duplicate-key
    error is a conflict too (``DUPLICATE_KEY_CODES``): the next attempt reads the row another
    primary committed first.

    Each attempt may run ``max_seconds`` (seconds on ``retry``'s clock; None: unbounded, for a
    caller with its own deadline): a statement that would start, or a commit, after that
    raises ``TransactionTooLong`` (ABORTED) and the attempt rolls back, so a live client never
    holds its locks longer than the bound plus one statement.
    """
    policy = retry or DEFAULT_RETRY
    started = policy.clock()
    attempt = 0
    while True:
        attempt += 1
        try:
            with engine.begin() as connection:
                bound = None if max_seconds is None else (policy.clock, policy.clock() + max_seconds, name, max_seconds)
                token = _DEADLINE.set(bound)
                try:
                    result = work(connection)
                    fault_point(f"{name}:before_commit")
                    _check_transaction_deadline()
                finally:
                    _DEADLINE.reset(token)
            fault_point(f"{name}:after_commit")
            return result
        except DatabaseUnavailable as error:  # raised by _unavailable_on_connection_loss
            raise DatabaseUnavailable(f"database unavailable during {name}; retry the request") from error
        except DatabaseLimitExceeded as error:  # raised by _unavailable_on_connection_loss
            raise DatabaseLimitExceeded(f"{name}: {error}") from error
        except sa.exc.DBAPIError as error:
            fault = storage_fault(error, name)
            if fault is not None:
                raise fault from error
            if is_unavailable(error):
                raise DatabaseUnavailable(f"database unavailable during {name}; retry the request") from error
            refusal = limit_exceeded(error, name)  # an error that did not pass the engine's hook
            if refusal is not None:
                raise refusal from error
            if not (is_retryable(error) or (unique_keys_conflict and is_duplicate_key(error))):
                raise
            delay = policy.delay(attempt, started)
            if delay is None:
                CONFLICTS.labels(name, "exhausted").inc()
                raise TransactionConflict(
                    f"{name} conflicted with concurrent transactions {attempt} times in "
                    f"{policy.clock() - started:.1f}s (retry budget {policy.budget:g}s); nothing was "
                    "committed, retry the request"
                ) from error
            CONFLICTS.labels(name, "retried").inc()
            log.warning(
                "retrying %s after %s (attempt %d, %.3fs of a %gs budget used, sleeping %.3fs)",
                name,
                type(error.orig).__name__,
                attempt,
                policy.clock() - started,
                policy.budget,
                delay,
            )
            policy.sleep(delay)


def follow_up(name: str, action: Callable[[], object]) -> None:
    """Run a step that follows the committed transaction ``name``; its failure never reaches the caller.

    The answer of a call must never hide committed work: once the transaction committed, the
    caller gets its outcome even if a later step (counting metrics, waking claimers, a
    cache) fails. Such a step must have a backstop that finishes it afterwards (claims poll,
    the materializer's next pass); its failure is logged with its traceback and counted
    (``nexuscrm_follow_up_failures_total``). The fault point ``<name>:follow_up`` lets tests
    fail it.
    """
    try:
        fault_point(f"{name}:follow_up")
        action()
    except Exception:
        FOLLOW_UP_FAILURES.labels(name).inc()
        log.exception("a step after the committed %s transaction failed; its backstop finishes it", name)
