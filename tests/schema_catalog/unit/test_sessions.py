"""The fault tests list TiDB's sessions across the cluster, every other server's on itself."""

from __future__ import annotations

import pytest

from tests.support.sessions import processlist_table


@pytest.mark.parametrize(
    ("version", "table"),
    [
        ("8.0.11-TiDB-v8.5.0", "information_schema.CLUSTER_PROCESSLIST"),
        ("5.5.5-10.11.19-MariaDB-0+deb12u1", "information_schema.PROCESSLIST"),
        ("8.0.36", "information_schema.PROCESSLIST"),
    ],
)
def test_the_session_list_is_the_cluster_s_on_tidb_only(version: str, table: str) -> None:
    assert processlist_table(version) == table
