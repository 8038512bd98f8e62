"""Node failover for a MySQL-protocol DSN that lists several servers (decision 182).

A multi-primary cluster (MariaDB Galera) is reached through any of its nodes. A DSN names
them in SQLAlchemy's multi-host form, ``mysql://USER@/DB?host=H1:P1&host=H2:P2&host=H3:P3``
(the URL's own host, if any, comes first). Each new connection tries them in that order and
keeps the first that answers and, on Galera, is in the primary component (``wsrep_ready``
ON): a node that is down refuses at once, a node cut off from the others still answers but
cannot run a query (1047), so it is passed over too. A connection already open on a node
that then dies or leaves the primary component fails its statement as UNAVAILABLE, and the
engine's disconnect handling drops the pool (``database._unavailable_on_connection_loss``):
the caller's retry connects to the next node. When the first node is back, new connections
return to it.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pymysql
from sqlalchemy import event
from sqlalchemy.engine import URL, Engine

from nexuscrm_runtime.readiness import galera_state

CANNOT_CONNECT = 2003  # the client's "cannot connect" number: the engine answers UNAVAILABLE


def split_hosts(url: URL) -> tuple[URL, list[tuple[str, int]]]:
    """``url`` without its ``host`` query, and the servers to try in order (empty: only the URL's own)."""
    listed = url.query.get("host")
    if listed is None:
        return url, []
    named = [listed] if isinstance(listed, str) else list(listed)
    hosts = [(url.host, url.port or 3306)] if url.host else []
    for entry in named:
        host, _, port = entry.partition(":")
        if not host or (port and not port.isdigit()):
            raise ValueError(f"the DSN's host={entry!r} is not HOST or HOST:PORT")
        hosts.append((host, int(port or 3306)))
    return url.difference_update_query(["host"]), hosts


def install(engine: Engine, hosts: list[tuple[str, int]]) -> None:
    """Make ``engine`` connect to the first ready server of ``hosts`` (none: the URL's own server)."""
    if not hosts:
        return

    @event.listens_for(engine, "do_connect")
    def _first_ready(dialect: Any, _record: Any, cargs: Any, cparams: dict[str, Any]) -> Any:
        refused: list[str] = []
        for host, port in hosts:
            try:
                connection = dialect.connect(*cargs, **{**cparams, "host": host, "port": port})
            except pymysql.err.OperationalError as error:
                refused.append(f"{host}:{port} ({error.args[0]})")
                continue
            if _ready(connection):
                return connection
            refused.append(f"{host}:{port} (not in the primary component)")
            with contextlib.suppress(pymysql.err.Error):
                connection.close()
        raise pymysql.err.OperationalError(CANNOT_CONNECT, f"no listed server is ready: {', '.join(refused)}")


def _ready(connection: Any) -> bool:
    """False for a Galera node outside the primary component; True for a ready node or a server without Galera."""
    with contextlib.closing(connection.cursor()) as cursor:
        state = galera_state(cursor)
    return state is None or state[0]
