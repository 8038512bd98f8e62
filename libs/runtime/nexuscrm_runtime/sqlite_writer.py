"""SQLite's one writer, handed from thread to thread of a process without sleeping (decisions 134, 171).

Every SQLite transaction starts with ``BEGIN IMMEDIATE`` (one writer at a time). A connection
that finds the file locked sleeps and polls in SQLite's busy handler, backing off in steps up
to 100 ms, so under contention the lock sits free while its waiters sleep and a newcomer may
take it first: Connectors' threads (an Ingest beside the workers' Claims and Completes) waited
there (measured in docs/performance-log.md, "Thirteenth pass").

``SerializedWriterDialect`` makes the threads of one engine queue on a lock of their own, taken
before ``BEGIN IMMEDIATE`` and released once ``COMMIT`` or ``ROLLBACK`` returned: the next
waiter starts at once. Between engines and processes on the same file, the holder of an
engine's lock takes the file's writer lock next (``sqlite_file_lock``, decision 171): woken
when it is free, in turn with the other engines, within the same bound.

Transactions begun inside ``urgent()`` (Ingest's: a client waits on each, while the workers'
Claims and Completes are background) go before the ordinary ones waiting, but not twice in a
row while ordinary ones wait: when both kinds wait the writer alternates, so neither starves
and an Ingest waits for at most one ordinary transaction (decision 136). Other backends
ignore ``urgent()``: their writers do not queue on one lock.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from typing import Any

from sqlalchemy.dialects import registry
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.engine import URL

from nexuscrm_runtime.sqlite_file_lock import SUPPORTED, FileWriterLock

DRIVER = "serialized_writer"  # the URL's driver: sqlite+serialized_writer://

log = logging.getLogger(__name__)


_URGENT: contextvars.ContextVar[bool] = contextvars.ContextVar("nexuscrm_sqlite_writer_urgent", default=False)


@contextlib.contextmanager
def urgent() -> Iterator[None]:
    """Transactions begun inside go before the engine's other waiting transactions (alternating with them)."""
    token = _URGENT.set(True)
    try:
        yield
    finally:
        _URGENT.reset(token)


class WriterLock:
    """Two queues, urgent and ordinary: urgent waiters go first, never twice in a row while ordinary ones wait.

    A release hands the lock to the next waiter directly (first come, first served within a
    kind): the releasing thread, which still holds the interpreter lock, cannot take it back
    before the woken waiter runs.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._held = False
        self._queues: dict[bool, collections.deque[threading.Lock]] = {
            True: collections.deque(),
            False: collections.deque(),
        }
        self._last_urgent = False  # the kind of the last grant

    def acquire(self, *, urgent: bool, timeout: float) -> bool:
        """Take the lock within ``timeout`` seconds; False if it could not."""
        with self._mutex:
            if not self._held:  # free only while nobody waits
                self._held, self._last_urgent = True, urgent
                return True
            turn = threading.Lock()
            turn.acquire()
            self._queues[urgent].append(turn)
        if turn.acquire(timeout=timeout):
            return True  # handed over by ``release``
        with self._mutex:
            if turn in self._queues[urgent]:
                self._queues[urgent].remove(turn)
                return False
        return True  # handed over between the timeout and here

    def release(self) -> None:
        with self._mutex:
            urgent, ordinary = self._queues[True], self._queues[False]
            if not urgent and not ordinary:
                self._held = False
                return
            # Both kinds waiting: the kind that did not take the last turn.
            self._last_urgent = bool(urgent) and not (ordinary and self._last_urgent)
            self._queues[self._last_urgent].popleft().release()

    def locked(self) -> bool:
        """Whether a transaction holds the lock now."""
        return self._held

    @property
    def waiting(self) -> int:
        """Transactions queued for the lock now."""
        with self._mutex:
            return len(self._queues[True]) + len(self._queues[False])


def _dbapi(connection: Any) -> Any:
    """The DBAPI connection itself, whether ``connection`` is it or the pool's proxy of it."""
    return getattr(connection, "dbapi_connection", connection)


class SerializedWriterDialect(SQLiteDialect_pysqlite):
    """pysqlite whose transactions take this engine's writer lock first (``writer_timeout`` seconds at most)."""

    supports_statement_cache = True

    def __init__(self, writer_timeout: float = 30.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.writer = WriterLock()
        self.writer_timeout = writer_timeout
        self._holder: Any = None  # the DBAPI connection whose transaction holds ``writer``
        self.file_writer: FileWriterLock | None = None  # the writer among processes (a file's only)

    def create_connect_args(self, url: URL) -> Any:
        database = url.database or ""
        if SUPPORTED and database not in ("", ":memory:"):
            try:
                self.file_writer = FileWriterLock(database)
            except OSError as error:  # e.g. a read-only folder: SQLite's busy handler still arbitrates
                log.warning("SQLite writer lock file unavailable, processes wait in SQLite's busy handler: %s", error)
        return super().create_connect_args(url)

    @property
    def waiting(self) -> int:
        """Transactions queued for ``writer`` now."""
        return self.writer.waiting

    def do_begin(self, dbapi_connection: Any) -> None:
        connection = _dbapi(dbapi_connection)
        if self._holder is not connection:  # never wait for a lock this connection holds
            deadline = time.monotonic() + self.writer_timeout
            if not self.writer.acquire(urgent=_URGENT.get(), timeout=self.writer_timeout):
                raise _locked("another transaction of this process", self.writer_timeout)
            try:
                taken = self.file_writer is None or self.file_writer.acquire(deadline)
            except BaseException:
                self.writer.release()
                raise
            if not taken:
                self.writer.release()
                raise _locked("another process", self.writer_timeout)
            self._holder = connection
        try:
            connection.execute("BEGIN IMMEDIATE")
        except BaseException:
            self.release(connection)
            raise

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
            if self.file_writer is not None:
                self.file_writer.release()
            self.writer.release()


def _locked(holder: str, seconds: float) -> sqlite3.OperationalError:
    """What SQLite itself says after its busy timeout: a conflict, retried as a whole."""
    return sqlite3.OperationalError(f"database is locked: {holder} held the writer for {seconds:g} s")


registry.register(f"sqlite.{DRIVER}", __name__, SerializedWriterDialect.__name__)
