"""SQLite's one writer, handed from thread to thread of a process without sleeping (decision 134).

Every SQLite transaction starts with ``BEGIN IMMEDIATE`` (one writer at a time). A connection
that finds the file locked sleeps and polls in SQLite's busy handler, backing off in steps up
to 100 ms, so under contention the lock sits free while its waiters sleep and a newcomer may
take it first. Connectors' threads (an Ingest beside the workers' Claims and Completes) spent
most of their transactions' time there (docs/performance.md, "Thirteenth pass").

``SerializedWriterDialect`` makes the threads of one engine queue on a lock of their own, taken
before ``BEGIN IMMEDIATE`` and released once ``COMMIT`` or ``ROLLBACK`` returned: the next
waiter starts at once. Other engines and processes on the same file still meet SQLite's busy
handler, which stays the arbiter of the file.
"""

from __future__ import annotations

import sqlite3
import threading
from typing import Any

from sqlalchemy.dialects import registry
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite

DRIVER = "serialized_writer"  # the URL's driver: sqlite+serialized_writer://


def _dbapi(connection: Any) -> Any:
    """The DBAPI connection itself, whether ``connection`` is it or the pool's proxy of it."""
    return getattr(connection, "dbapi_connection", connection)


class SerializedWriterDialect(SQLiteDialect_pysqlite):
    """pysqlite whose transactions take this engine's writer lock first (``writer_timeout`` seconds at most)."""

    supports_statement_cache = True

    def __init__(self, writer_timeout: float = 30.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.writer = threading.Lock()
        self.writer_timeout = writer_timeout
        self.waiting = 0  # transactions queued for ``writer`` now
        self._waiting_lock = threading.Lock()
        self._holder: Any = None  # the DBAPI connection whose transaction holds ``writer``

    def do_begin(self, dbapi_connection: Any) -> None:
        connection = _dbapi(dbapi_connection)
        if self._holder is not connection:  # never wait for a lock this connection holds
            if not self._acquire():
                # What SQLite itself says after its busy timeout: a conflict, retried as a whole.
                raise sqlite3.OperationalError(
                    f"database is locked: another transaction of this process held the writer for "
                    f"{self.writer_timeout:g} s"
                )
            self._holder = connection
        try:
            connection.execute("BEGIN IMMEDIATE")
        except BaseException:
            self.release(connection)
            raise

    def _acquire(self) -> bool:
        with self._waiting_lock:
            self.waiting += 1
        try:
            return self.writer.acquire(timeout=self.writer_timeout)
        finally:
            with self._waiting_lock:
                self.waiting -= 1

    def do_commit(self, dbapi_connection: Any) -> None:
        try:
            super().do_commit(dbapi_connection)  # type: ignore[no-untyped-call]  # untyped upstream
        finally:
            self.release(dbapi_connection)

    def do_rollback(self, dbapi_connection: Any) -> None:
        try:
            super().do_rollback(dbapi_connection)  # type: ignore[no-untyped-call]  # untyped upstream
        finally:
            self.release(dbapi_connection)

    def release(self, dbapi_connection: Any) -> None:
        """Let the next transaction start, if ``dbapi_connection``'s holds the writer (else nothing)."""
        if self._holder is not None and self._holder is _dbapi(dbapi_connection):
            self._holder = None
            self.writer.release()


registry.register(f"sqlite.{DRIVER}", __name__, SerializedWriterDialect.__name__)
