"""SQLite's one writer handed between processes, in turn and within a bound (decision 171).

Processes on one SQLite file (Connectors beside the Integration host's folds) used to meet only
in SQLite's busy handler, which sleeps 1, 2, 5 ms and up to 100 ms between attempts: while
Connectors handed the writer from thread to thread without a gap (decision 134), the host's
transactions slept through the moments it was free and folded little until ingest ended
(docs/performance-log.md, "Twenty-fifth pass").

``FileWriterLock`` is a second lock each engine takes after its own writer lock and before
``BEGIN IMMEDIATE``: an open-file-description lock (``F_OFD_SETLK``) on byte ``WRITER`` of the
file ``<database>-writer``. The kernel drops it if its process dies. A waiter blocks in the
kernel, which wakes it when the writer is free; it blocks on a thread of the engine's own and
on a file description of its own, so the caller gives up at its deadline (a late grant is then
dropped) and a process stuck inside a transaction holds the others back no longer than
SQLite's busy timeout did. While it waits it holds a shared lock on byte ``WAITING``: the holder
finds it there when it releases, and its next transaction first lets the waiter take the
writer (for ``GRACE`` seconds at most, in case the waiter has stalled). Under contention,
engines take turns.

Engines that do not take this lock (an older release, the ``sqlite3`` shell) still meet SQLite's
busy handler, which remains the arbiter of the file; this lock only orders those that take it.
Where the platform has no open-file-description locks, engines do without it.
"""

from __future__ import annotations

import errno
import os
import queue
import struct
import sys
import threading
import time
import weakref

if sys.platform != "win32":
    import fcntl

WRITER, WAITING = 0, 1  # the lock file's bytes: the writer itself, and its waiters' announcements
GRACE = 0.02  # seconds a releaser waits at most for an announced waiter to take the writer
POLL = 0.00025  # seconds between a releaser's looks at whether the waiter has it
SUPPORTED = sys.platform != "win32" and hasattr(fcntl, "F_OFD_SETLK")  # Linux 3.15 and later

# struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for open-file-description locks).
_FLOCK = struct.Struct("hhqqi4x")
_CONFLICT = {errno.EAGAIN, errno.EACCES}


def lock_path(database: str) -> str:
    """The lock file of the SQLite file ``database``, beside its ``-wal`` and ``-shm``."""
    return f"{database}-writer"


class FileWriterLock:
    """One engine's claim on the writer of a SQLite file, among every engine that takes it."""

    def __init__(self, database: str) -> None:
        self._path = lock_path(database)
        # The database's own permissions, as SQLite gives its -wal and -shm files.
        mode = os.stat(database).st_mode & 0o777 if os.path.exists(database) else 0o644
        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, mode)
        self._holding = self._fd  # the file description whose lock is this engine's writer
        self._others_waiting = False  # an announced waiter saw this engine release: let it go first
        self._waits: queue.SimpleQueue[_Wait | None] = queue.SimpleQueue()
        self._waiter: threading.Thread | None = None  # started at the first wait
        weakref.finalize(self, _close, self._fd, self._waits)

    def acquire(self, deadline: float) -> bool:
        """Take the writer by ``deadline`` (``time.monotonic()``); False if another engine held it until then."""
        if self._others_waiting:
            self._others_waiting = False
            self._let_waiters_go_first(min(deadline, time.monotonic() + GRACE))
        if _set(self._fd, fcntl.F_OFD_SETLK, fcntl.F_WRLCK, WRITER):
            self._holding = self._fd
            return True
        _set(self._fd, fcntl.F_OFD_SETLK, fcntl.F_RDLCK, WAITING)  # fails only while a releaser tests it
        try:
            return self._wait(deadline)
        finally:
            _set(self._fd, fcntl.F_OFD_SETLK, fcntl.F_UNLCK, WAITING)

    def release(self) -> None:
        """Free the writer; note whether another engine is waiting for it."""
        if self._holding == self._fd:
            _set(self._fd, fcntl.F_OFD_SETLK, fcntl.F_UNLCK, WRITER)
        else:
            os.close(self._holding)  # a wait's own file description: closing it frees the writer
            self._holding = self._fd
        self._others_waiting = self.contended()

    def contended(self) -> bool:
        """Whether another engine is waiting for the writer now."""
        return _held_elsewhere(self._fd, WAITING)

    def _wait(self, deadline: float) -> bool:
        """Block until the kernel grants the writer, on a thread and a file description of its own."""
        wait = _Wait(os.open(self._path, os.O_RDWR | os.O_CLOEXEC))
        if self._waiter is None:
            self._waiter = threading.Thread(target=_serve, args=(self._waits,), name="sqlite-writer", daemon=True)
            self._waiter.start()
        self._waits.put(wait)
        wait.granted.wait(max(0.0, deadline - time.monotonic()))
        with wait.mutex:
            if not wait.granted.is_set():
                wait.abandoned = True  # ``_serve`` closes it once granted, or failed
                return False
        if wait.error is not None:
            os.close(wait.fd)
            raise wait.error
        self._holding = wait.fd
        return True

    def _let_waiters_go_first(self, until: float) -> None:
        """Wait until no other engine waits for the writer, or one of them has it, or ``until``."""
        while self.contended() and not _held_elsewhere(self._fd, WRITER) and time.monotonic() < until:
            time.sleep(POLL)


class _Wait:
    """One blocking wait for the writer; once granted, the writer is held through ``fd``."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.granted = threading.Event()
        self.mutex = threading.Lock()  # orders a grant against the caller giving up
        self.abandoned = False
        self.error: OSError | None = None


def _serve(waits: queue.SimpleQueue[_Wait | None]) -> None:
    """An engine's waiting thread: block on each wait's file description in turn."""
    while (wait := waits.get()) is not None:
        try:
            _set(wait.fd, fcntl.F_OFD_SETLKW, fcntl.F_WRLCK, WRITER)
        except OSError as error:
            wait.error = error
        with wait.mutex:
            if wait.abandoned:
                os.close(wait.fd)  # a grant nobody waits for any more: drop it
            else:
                wait.granted.set()


def _close(fd: int, waits: queue.SimpleQueue[_Wait | None]) -> None:
    waits.put(None)  # the waiting thread, if any, ends after the wait it serves
    os.close(fd)  # closing the file drops its locks


def _set(fd: int, command: int, kind: int, byte: int) -> bool:
    """Lock (``F_WRLCK``, ``F_RDLCK``) or unlock ``byte``; False if another engine holds it (``F_OFD_SETLK``)."""
    try:
        fcntl.fcntl(fd, command, _FLOCK.pack(kind, os.SEEK_SET, byte, 1, 0))
    except OSError as error:
        if error.errno in _CONFLICT:
            return False
        raise
    return True


def _held_elsewhere(fd: int, byte: int) -> bool:
    """Whether another engine holds any lock on ``byte`` now."""
    answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, byte, 1, 0))
    return bool(_FLOCK.unpack(answer)[0] != fcntl.F_UNLCK)
