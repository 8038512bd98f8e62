"""What a MySQL-protocol server must be and how each session is set, checked before a service serves.

The protocol's locking (docs/design.md, "Databases") needs READ COMMITTED with ``SELECT ... FOR UPDATE``
that blocks. On TiDB that holds only in pessimistic mode; ``SAVEPOINT`` (every activation and
cutover write) needs v6.2+ and in-place constraint checks; an online ``ALTER`` needs the
metadata lock (else open transactions fail at commit with 8028); the idle-transaction timeout
(v7.6+) frees the locks of a client that vanished mid-transaction. Every TiDB session is set
at connect (``session_statements``); ``verify`` reads the settings back through one seam
(``read_server``) and names every one that is wrong. ``docs/tidb.md`` lists them.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

# v8.1 is the oldest LTS with every feature above (SAVEPOINT 6.2, metadata lock on by default
# 6.5, tidb_idle_transaction_timeout 7.6).
MINIMUM_TIDB = (8, 1, 0)
ISOLATION = "READ-COMMITTED"
# Seconds a transaction may sit between statements before the server (TiDB, MariaDB) rolls it
# back and drops its locks: far longer than any gap between two statements of one of our
# transactions (Python work on rows already read), far shorter than TiDB's 1 h lock TTL.
IDLE_TRANSACTION_TIMEOUT = 60  # seconds

# Set on every TiDB session at connect; verified at start (the server may refuse or ignore them).
TIDB_SESSION_SETTINGS: dict[str, str] = {
    "tidb_txn_mode": "pessimistic",
    "tidb_constraint_check_in_place_pessimistic": "ON",
    "tidb_idle_transaction_timeout": str(IDLE_TRANSACTION_TIMEOUT),
}
# Global only: an operator sets them; verified at start.
TIDB_GLOBAL_SETTINGS: dict[str, str] = {"tidb_enable_metadata_lock": "ON"}

_TIDB_VERSION = re.compile(r"TiDB-v(\d+)\.(\d+)\.(\d+)")
# MariaDB (before 11.1) names the isolation variable tx_isolation; MySQL 8 and TiDB transaction_isolation.
_ISOLATION_NAMES = ("transaction_isolation", "tx_isolation")


class StartRefused(RuntimeError):
    """What a service found at start means it must not serve; the message is one line saying what to do.

    ``nexuscrm_runtime.server.run_service`` turns it into that one log line and exit code 3
    (the shared table's "a service did not start"); a gate above this package (the schema
    gates of ``nexuscrm_runtime.release``) raises a subclass.
    """


class PrerequisiteError(StartRefused):
    """The database server lacks a required version or setting; the message names each one."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerFacts:
    """What ``verify`` judges: the server's version string and the variables it reported."""

    version: str
    variables: Mapping[str, str]  # variable name (lower case) -> value as the server shows it


def is_tidb(version: str) -> bool:
    """Whether the server reporting ``version`` is TiDB: the one test, for the clock and the prerequisites.

    ``version`` is ``VERSION()`` or the connection handshake's server version, which TiDB
    reports alike (``8.0.11-TiDB-v8.5.0``). ``database.create_engine`` asks it on the first
    connection (the database clock then reads PD's timestamps); this module asks
    it of every session (``session_statements``) and at start (``problems``).
    """
    return "TiDB" in version


def tidb_version(version: str) -> tuple[int, int, int] | None:
    """TiDB's release from its version string (``is_tidb``); None for another engine or an unreadable release."""
    match = _TIDB_VERSION.search(version) if is_tidb(version) else None
    return None if match is None else (int(match[1]), int(match[2]), int(match[3]))


def session_statements(version: str) -> list[str]:
    """The statements that set a new session of a server reporting ``version``.

    TiDB: the settings above. MariaDB (Galera too): its own idle-transaction timeout (10.3+),
    so a client that vanished mid-transaction frees its locks as on TiDB. MySQL has none: it
    drops such a session only after ``wait_timeout``, or when TCP keepalive gives up.
    """
    if is_tidb(version):
        settings = ", ".join(f"{name} = {_literal(value)}" for name, value in TIDB_SESSION_SETTINGS.items())
        return [f"SET SESSION {settings}"]
    if "MariaDB" in version:
        return [f"SET SESSION idle_transaction_timeout = {IDLE_TRANSACTION_TIMEOUT}"]
    return []


def _literal(value: str) -> str:
    return value if value.isdigit() or value in {"ON", "OFF"} else f"'{value}'"


def install_session_settings(engine: Engine) -> None:
    """Set every new connection of ``engine`` as ``session_statements`` says, before any use."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("SELECT VERSION()")
            (version,) = cursor.fetchone()
            for statement in session_statements(str(version)):
                cursor.execute(statement)
        finally:
            cursor.close()


def read_server(connection: Connection) -> ServerFacts:
    """The version and the variables ``verify`` judges, as one session of the server sees them."""
    version = str(connection.execute(sa.select(sa.func.version())).scalar_one())
    names = [*_ISOLATION_NAMES, *TIDB_SESSION_SETTINGS, *TIDB_GLOBAL_SETTINGS]
    rows = connection.execute(
        sa.text("SHOW VARIABLES WHERE Variable_name IN :names").bindparams(sa.bindparam("names", expanding=True)),
        {"names": names},
    )
    return ServerFacts(version=version, variables={str(name).lower(): str(value) for name, value in rows})


def problems(facts: ServerFacts) -> list[str]:
    """Every unmet prerequisite of the server described by ``facts``, each naming its setting."""
    found = []
    isolation = next((facts.variables[name] for name in _ISOLATION_NAMES if name in facts.variables), None)
    if isolation is not None and isolation.upper() != ISOLATION:
        found.append(f"transaction_isolation must be {ISOLATION}, the session has {isolation}")
    if not is_tidb(facts.version):
        return found
    release = tidb_version(facts.version)
    if release is None or release < MINIMUM_TIDB:
        wanted = ".".join(map(str, MINIMUM_TIDB))
        shown = f"reports {facts.version!r}" if release is None else f"is v{'.'.join(map(str, release))}"
        found.append(f"TiDB v{wanted} (LTS) or newer is required, the server {shown}")
    for name, wanted in {**TIDB_SESSION_SETTINGS, **TIDB_GLOBAL_SETTINGS}.items():
        value = facts.variables.get(name)
        if value is None or value.upper() != wanted.upper():
            shown = "no such variable" if value is None else value
            found.append(f"{name} must be {wanted}, the server has {shown}")
    return found


def verify(engine: Engine, *, read: Callable[[Connection], ServerFacts] = read_server) -> None:
    """Refuse a MySQL-protocol server that misses a prerequisite: ``PrerequisiteError`` naming each.

    SQLite needs nothing (``BEGIN IMMEDIATE`` serializes writers). ``read`` is the seam tests
    use to present another server's answers.
    """
    if engine.dialect.name == "sqlite":
        return
    with engine.connect() as connection:
        found = problems(read(connection))
    if found:
        raise PrerequisiteError("the database does not meet the prerequisites (docs/tidb.md): " + "; ".join(found))
