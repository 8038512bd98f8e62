"""The one table of database error codes: what each means for a transaction and its gRPC status.

Every MySQL-protocol engine we speak to (MySQL, MariaDB with Galera, TiDB) reports errors as a
number; this table sorts the numbers that need more than "a bug: INTERNAL" into four classes.
``docs/tidb.md`` cites it; ``tests/schema_catalog/unit/test_engine_errors.py`` forges each code as PyMySQL
raises it and checks the class, the status and the message.

- ``CONFLICT``: the transaction lost to a concurrent one and nothing of it committed;
  ``run_transaction`` runs it again within its budget (decision 107), then ABORTED.
- ``UNAVAILABLE``: the server, a cluster component or the connection is gone for now; whether
  a commit applied may be unknown, so the caller retries the (idempotent) request: UNAVAILABLE.
- ``TOO_LARGE``: the transaction or statement exceeded a server limit; retrying the same work
  fails the same way: RESOURCE_EXHAUSTED naming the limit. The product's own budgets
  (``nexuscrm_runtime.budgets``) keep every transaction below the defaults, so seeing one means
  the server was configured below them.
- ``PERMANENT``: listed only where an engine-specific number needs saying so; it and every code
  not in the table is a bug or a misconfiguration: INTERNAL, logged with its traceback.

Only numbers that mean the same on every engine are listed (TiDB's own codes, 8000-9999, are
unused by MySQL and MariaDB).
"""

from __future__ import annotations

import dataclasses
import enum

from workqueue.errors import ErrorKind


class ErrorClass(enum.StrEnum):
    """What a failed statement means for its transaction."""

    CONFLICT = "retryable conflict"
    UNAVAILABLE = "unavailable"
    TOO_LARGE = "too large"
    PERMANENT = "permanent"


@dataclasses.dataclass(frozen=True)
class EngineError:
    """One error number: the engines that raise it, its class, its gRPC status and what it says."""

    code: int
    engines: str  # which engines raise it, for the docs: "MySQL, MariaDB, TiDB", "TiDB", ...
    error_class: ErrorClass
    meaning: str  # one line, in the caller's terms; the too-large ones name the limit and its default

    @property
    def status(self) -> ErrorKind | None:
        """The gRPC status a request ends with when this error ends it; None: INTERNAL."""
        return _CLASS_STATUS[self.error_class]


_CLASS_STATUS: dict[ErrorClass, ErrorKind | None] = {
    ErrorClass.CONFLICT: ErrorKind.ABORTED,  # once the retry budget is spent
    ErrorClass.UNAVAILABLE: ErrorKind.UNAVAILABLE,
    ErrorClass.TOO_LARGE: ErrorKind.RESOURCE_EXHAUSTED,
    ErrorClass.PERMANENT: None,
}

_ALL = "MySQL, MariaDB, TiDB"

# (code, engines that raise it, meaning) per class; the too-large ones name the limit and its default.
_ROWS: dict[ErrorClass, tuple[tuple[int, str, str], ...]] = {
    # The whole transaction may run again.
    ErrorClass.CONFLICT: (
        (1205, _ALL, "lock wait timeout exceeded"),
        (1213, _ALL, "deadlock; on Galera also a certification failure at commit"),
        (8002, "TiDB", "write conflict in a transaction that read FOR UPDATE"),
        (8005, "TiDB", "write conflict, txnStartTS is stale"),
        (8022, "TiDB", "commit failed and was rolled back"),
        (8028, "TiDB", "a table's schema changed during the transaction (metadata lock off or a DDL raced it)"),
        (9004, "TiDB", "resolving another transaction's locks timed out (heavy contention)"),
        (9007, "TiDB", "write conflict"),
    ),
    # Retry the request later.
    ErrorClass.UNAVAILABLE: (
        (1040, _ALL, "too many connections"),
        (1047, "MariaDB (Galera)", "the Galera node is not ready to accept queries (not in the primary component)"),
        (1053, _ALL, "server shutdown in progress"),
        (
            1180,
            "MySQL, MariaDB",
            "an error during COMMIT; on Galera the node left the primary component mid-commit (outcome unknown)",
        ),
        (1927, "MariaDB", "the connection was killed"),
        (2003, "client", "cannot connect to the server"),
        (2006, "client", "the server has gone away"),
        (2013, "client", "lost connection during a query"),
        (2014, "client", "commands out of sync"),
        (2055, "client", "lost connection (system error)"),
        (8027, "TiDB", "this TiDB server's schema is out of date (it cannot reach PD or TiKV)"),
        (9001, "TiDB", "PD server timeout"),
        (9002, "TiDB", "TiKV server timeout"),
        (9003, "TiDB", "TiKV server is busy"),
        (9005, "TiDB", "a Region is unavailable (too few replicas up)"),
    ),
    # The same work fails the same way.
    ErrorClass.TOO_LARGE: (
        (1153, _ALL, "a statement exceeded the server's max_allowed_packet"),
        (1197, "MySQL, MariaDB", "the transaction exceeded the server's max_binlog_cache_size"),
        (8004, "TiDB", "the transaction exceeded TiDB's txn-total-size-limit (100 MiB by default)"),
        (8025, "TiDB", "a row exceeded TiDB's txn-entry-size-limit (6 MiB by default)"),
        (8175, "TiDB", "a statement exceeded TiDB's memory quota tidb_mem_quota_query (1 GiB by default)"),
    ),
    # Named because a reader might take them for transient.
    ErrorClass.PERMANENT: (
        (8003, "TiDB", "a row and its index disagree (ADMIN CHECK TABLE): data corruption"),
        (9006, "TiDB", "the transaction outlived tidb_gc_life_time; no transaction here should run that long"),
    ),
}

ENGINE_ERRORS: dict[int, EngineError] = {
    code: EngineError(code, engines, error_class, meaning)
    for error_class, rows in _ROWS.items()
    for code, engines, meaning in rows
}


# A unique key that a concurrent transaction committed first (MySQL, MariaDB, TiDB; TiDB's
# optimistic transactions report it at commit). A bug in most transactions, but a conflict in
# those that read a key's absence and then insert it while another primary may commit the same
# key in between (twin deliveries through two Galera nodes or TiDB servers): those pass
# ``unique_keys_conflict`` to ``run_transaction``, run again and find the other's row.
DUPLICATE_KEY_CODES = frozenset({1062, 1586})  # ER_DUP_ENTRY, ER_DUP_ENTRY_WITH_KEY_NAME


def engine_error(code: int | None) -> EngineError | None:
    """The table's entry for ``code``; None for a code the table does not list (permanent)."""
    return None if code is None else ENGINE_ERRORS.get(code)


def error_class(code: int | None) -> ErrorClass:
    """The class of ``code``: the table's, or ``PERMANENT`` for every code it does not list."""
    entry = engine_error(code)
    return ErrorClass.PERMANENT if entry is None else entry.error_class


# The embedded SQLite default's storage faults, by primary result code (the low byte of
# ``sqlite3.Error.sqlite_errorcode``): a full disk answers RESOURCE_EXHAUSTED, a file that
# cannot be written or read UNAVAILABLE; each names its cause (decision 183). Every other
# SQLite error is a bug, as above (``database is locked`` is a conflict, ``is_retryable``).
SQLITE_STORAGE_ERRORS: dict[int, EngineError] = {
    entry.code: entry
    for entry in (
        EngineError(
            13,
            "SQLite",
            ErrorClass.TOO_LARGE,
            "the disk holding the database file is full (SQLITE_FULL); free space on it",
        ),
        EngineError(
            8,
            "SQLite",
            ErrorClass.UNAVAILABLE,
            "the database file is read-only (SQLITE_READONLY: its permissions or a read-only mount); make it writable",
        ),
        EngineError(10, "SQLite", ErrorClass.UNAVAILABLE, "a disk I/O error on the database file (SQLITE_IOERR)"),
        EngineError(14, "SQLite", ErrorClass.UNAVAILABLE, "the database file cannot be opened (SQLITE_CANTOPEN)"),
    )
}
