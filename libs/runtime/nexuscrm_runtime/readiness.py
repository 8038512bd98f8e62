"""Readiness: whether a service's database can be used now, probed on an interval (decision 187).

A service is ready while its database answers: the probe runs ``SELECT 1`` through the
service's own engine (so a failover DSN is ready while any listed node is) and, on a Galera
node, also asks that the node be in the primary component and Synced (``wsrep_ready`` ON and
``wsrep_local_state_comment`` 'Synced', as Galera's ``clustercheck`` asks by default: a
joining, joined or donor node is not ready). TiDB and plain MySQL or MariaDB are ready when the
query answers. SQLite is embedded: it is ready while its file opens and answers the query.
A probe that does not answer within ``PROBE_TIMEOUT`` counts as not ready (a partitioned
connection waits for its socket timeout, minutes); at most ``PROBE_THREADS`` probes run at once.

``Readiness`` calls ``report(ready)`` at start and on every change; ``run_service`` points it
at the server's overall health (``RunningServer.set_serving``), probing every
``ServiceConfig.readiness_interval_ms`` (``NEXUSCRM_READINESS_INTERVAL_MS``). Liveness is separate: the
health name ``LIVENESS_NAME`` stays SERVING while the process runs (docs/operations.md).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from concurrent import futures
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

log = logging.getLogger(__name__)

PROBE_TIMEOUT = 3.0  # seconds a probe may take before the database counts as not ready
# Probes at once: one stuck on a socket (a node that accepts connections but does not answer
# while it receives a state transfer) leaves another to see the database as soon as it answers.
PROBE_THREADS = 2
LIVENESS_NAME = "liveness"  # the health name that is SERVING while the process runs
SYNCED = "Synced"


def galera_on(cursor: Any) -> bool:
    """Whether the server of a DBAPI ``cursor`` is a Galera node (``wsrep_on``)."""
    cursor.execute("SHOW GLOBAL VARIABLES LIKE 'wsrep_on'")
    row = cursor.fetchone()
    return row is not None and str(row[1]) == "ON"


def galera_state(cursor: Any) -> tuple[bool, str] | None:
    """``(wsrep_ready, wsrep_local_state_comment)`` of a Galera node on a DBAPI ``cursor``; None without Galera."""
    if not galera_on(cursor):
        return None
    cursor.execute("SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_ready', 'wsrep_local_state_comment')")
    status = {str(name): str(value) for name, value in cursor.fetchall()}
    return status.get("wsrep_ready") == "ON", status.get("wsrep_local_state_comment", "")


def database_ready(engine: Engine) -> bool:
    """Whether ``engine``'s database answers now and, on Galera, its node is ready and Synced. Never raises."""
    try:
        with engine.connect() as connection:
            connection.execute(sa.text("SELECT 1"))
            if engine.dialect.name == "sqlite":
                return True
            dbapi = connection.connection.dbapi_connection
            with contextlib.closing(dbapi.cursor()) as cursor:  # type: ignore[union-attr]
                state = galera_state(cursor)
            connection.rollback()
    except Exception as error:  # any failure means "not usable now"; the next probe asks again
        log.debug("readiness probe failed: %s", error)
        return False
    return state is None or (state[0] and state[1] == SYNCED)


class Readiness:
    """Probes ``check`` every ``interval`` seconds on a thread and reports each change through ``report``.

    ``report(ready)`` runs once when the first probe has answered and then on every change,
    as do the callbacks given to ``on_ready`` (only for a change to ready: a background loop
    waiting out a back-off resumes at once). ``timeout`` bounds one probe.
    """

    def __init__(
        self,
        check: Callable[[], bool],
        report: Callable[[bool], None],
        *,
        interval: float,
        timeout: float = PROBE_TIMEOUT,
    ) -> None:
        self._check = check
        self._report = report
        self._interval = interval
        self._timeout = timeout
        self._stop = threading.Event()
        self._listeners: list[Callable[[], None]] = []
        self._ready: bool | None = None
        self._stuck: list[futures.Future[bool]] = []
        self._probes = futures.ThreadPoolExecutor(max_workers=PROBE_THREADS, thread_name_prefix="readiness-probe")
        self._thread = threading.Thread(target=self._run, name="readiness", daemon=True)

    @property
    def ready(self) -> bool | None:
        """The last probe's answer (None before the first)."""
        return self._ready

    def on_ready(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` each time the database becomes ready again."""
        self._listeners.append(callback)

    def start(self) -> Readiness:
        """Probe once now, report it, then go on probing on the thread; returns self."""
        self._update(self._probe())
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop probing (a probe in progress is left to end by its own timeout)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._probes.shutdown(wait=False, cancel_futures=True)

    def _probe(self) -> bool:
        self._stuck = [probe for probe in self._stuck if not probe.done()]
        if len(self._stuck) >= PROBE_THREADS:
            return False  # every probe thread waits for its socket: not ready, and no more of them
        pending = self._probes.submit(self._check)
        try:
            return pending.result(timeout=self._timeout)
        except futures.TimeoutError:
            log.warning("readiness probe did not answer within %.1fs: not ready", self._timeout)
            self._stuck.append(pending)
            return False

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._update(self._probe())

    def _update(self, ready: bool) -> None:
        if ready == self._ready:
            return
        returned = ready and self._ready is False
        if self._ready is not None:
            log.warning("database %s: health %s", *(("usable", "SERVING") if ready else ("lost", "NOT_SERVING")))
        self._ready = ready
        self._report(ready)
        if returned:
            for callback in self._listeners:
                callback()
