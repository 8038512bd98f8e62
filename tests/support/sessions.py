"""The server sessions the fault tests find and kill, on every MySQL-protocol engine.

On TiDB ``information_schema.PROCESSLIST`` lists the sessions of the one TiDB instance the
query reached; ``CLUSTER_PROCESSLIST`` lists every instance's, with the same columns. ``KILL
CONNECTION`` reaches a session on any instance under global kill, on by default from v6.1
(the minimum is v8.1, docs/tidb.md), so only the list differs.
"""

from __future__ import annotations

import sqlalchemy as sa

from nexuscrm_runtime.prerequisites import is_tidb


def processlist_table(version: str) -> str:
    """The table listing every session of the server (or cluster) reporting ``version``."""
    return "information_schema.CLUSTER_PROCESSLIST" if is_tidb(version) else "information_schema.PROCESSLIST"


def processlist(connection: sa.Connection) -> str:
    """``processlist_table`` of the server ``connection`` talks to."""
    return processlist_table(connection.connection.dbapi_connection.get_server_info())
