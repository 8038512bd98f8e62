"""The plan readers see a growing table under an alias: plans name the alias, not the table."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, sqlite

from nexuscrm_schema.tables import WorkItem
from tests.support.plans import problems_mysql, problems_sqlite, problems_tidb, table_aliases

PREDECESSOR = WorkItem.alias("predecessor")
# A self-join as the order policy's holds write it: the alias is the table a plan names.
SELF_JOIN = sa.select(WorkItem.c.WorkId).join(PREDECESSOR, PREDECESSOR.c.ProjectionKey == WorkItem.c.ProjectionKey)


def _sql(dialect: sa.Dialect) -> str:
    return str(SELF_JOIN.compile(dialect=dialect))


def test_the_aliases_of_growing_tables_are_read_from_both_dialects_statements() -> None:
    assert table_aliases(_sql(sqlite.dialect())) == {"predecessor": "WorkItem"}
    assert table_aliases(_sql(mysql.dialect())) == {"predecessor": "WorkItem"}


def test_a_column_label_is_not_an_alias() -> None:
    labelled = sa.select(WorkItem.c.WorkId.label("id"))
    assert table_aliases(str(labelled.compile(dialect=mysql.dialect()))) == {}


def test_the_sqlite_reader_fails_a_full_scan_of_an_aliased_growing_table() -> None:
    aliases = table_aliases(_sql(sqlite.dialect()))
    assert problems_sqlite([(2, 0, 0, "SCAN predecessor")]) == []  # without the map it looks harmless
    assert problems_sqlite([(2, 0, 0, "SCAN predecessor")], aliases) == ["SCAN predecessor"]


def test_the_mysql_reader_fails_a_full_scan_of_an_aliased_growing_table() -> None:
    row = {"table": "predecessor", "type": "ALL", "Extra": "Using where", "key": None}
    assert problems_mysql([row], table_aliases(_sql(mysql.dialect()))) == ["full table scan of WorkItem"]


def test_the_tidb_reader_fails_a_full_scan_of_an_aliased_growing_table() -> None:
    plan = [
        ("TableReader_7", "10.00", "root", "", "data:TableFullScan_6"),
        ("└─TableFullScan_6", "10.00", "cop[tikv]", "table:predecessor", "keep order:false"),
    ]
    assert problems_tidb(plan, {"predecessor": "WorkItem"}) == ["TableFullScan of WorkItem"]
