"""Causal reads: a read that sees every write the database acknowledged before it started (decision 187).

Galera applies another node's write sets asynchronously: a node answers a read from what it
has applied, which may lag what the cluster already acknowledged to a client of another node.
``causal_read(connection)`` run as the first statement of a read transaction makes the node
wait until it has applied everything the cluster had ordered when the statement arrived
(``wsrep_sync_wait=1`` for that one statement: ``SET STATEMENT ... FOR SELECT 1``); under
READ COMMITTED every later statement of the read sees at least that. Galera only waits for a
statement that opens a transaction, hence "first". Elsewhere it runs nothing: one MariaDB or
MySQL server has no lag, and TiDB gives every statement of a READ COMMITTED transaction a
fresh timestamp from PD, after every commit acknowledged before it (docs/galera.md, "Causal
reads"). SQLite is one file.

Which reads are causal: those an operator, a harness or a decision acts on (queue state and
WaitQueueDrained, GetWork, ListGenerations, GetCoverage, Controlplane's drain status and the
cutover's audit). The hot path (admission, claims, payload pages) decides inside its own
transactions, whose writes Galera certifies, and stays as it is.
"""

from __future__ import annotations

import contextlib

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from nexuscrm_runtime.readiness import galera_on
from workqueue.errors import DomainError, ErrorKind

GALERA_DIALECT_FLAG = "nexuscrm_galera"
BARRIER = "SET STATEMENT wsrep_sync_wait=1 FOR SELECT 1"
WAIT_TIMED_OUT = 1205  # Galera's answer past ``repl.causal_read_timeout`` (30 s by default), worded as a lock wait


class NodeBehind(DomainError):
    """The node did not catch up with the cluster within its causal-read timeout; retry (another node may answer)."""

    kind = ErrorKind.UNAVAILABLE


def detect_galera(engine: Engine, dbapi_connection: object) -> None:
    """Record on ``engine``'s dialect whether its server runs Galera (``wsrep_on``); for a ``first_connect`` hook."""
    with contextlib.closing(dbapi_connection.cursor()) as cursor:  # type: ignore[attr-defined]
        setattr(engine.dialect, GALERA_DIALECT_FLAG, galera_on(cursor))


def is_galera(connection: Connection) -> bool:
    """Whether ``connection``'s server is a Galera node."""
    return bool(getattr(connection.dialect, GALERA_DIALECT_FLAG, False))


def causal_read(connection: Connection) -> Connection:
    """Make the reads that follow on ``connection`` see every write acknowledged before now; returns it.

    Call it first in the transaction (on Galera a barrier later in a transaction does not
    wait). Runs one statement on Galera and none elsewhere. Raises ``NodeBehind`` when the
    node did not catch up in time.
    """
    if is_galera(connection):
        try:
            connection.execute(sa.text(BARRIER))
        except sa.exc.OperationalError as error:
            if error.orig is None or error.orig.args[0] != WAIT_TIMED_OUT:
                raise
            raise NodeBehind("this database node has not caught up with the cluster; retry the request") from error
    return connection
