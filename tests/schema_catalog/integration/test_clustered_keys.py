"""Every primary key the schema catalog creates is pinned clustered for TiDB (decision 121)."""

from __future__ import annotations

import re

import sqlalchemy as sa

from nexuscrm_schema import tables, verification
from nexuscrm_schema_catalog import migrations
from tests.support.statements import capture

INVARIANTS_NOT_CHECKED = "the DDL the migrations emit: no row is written"

CLUSTERED_KEY = re.compile(r"PRIMARY KEY \([^)]*\) /\*T!\[clustered_index\] CLUSTERED \*/")


def _table_name(statement: str) -> str:
    match = re.search(r"CREATE TABLE [`\"]?(\w+)", statement)
    assert match is not None
    return match[1]


def test_the_migrations_emit_every_primary_key_clustered(empty_engine: sa.Engine) -> None:
    """The CREATE TABLE statements sent while migrating from empty, on each backend."""
    with capture(empty_engine) as sent:
        migrations.apply_schema(empty_engine)
    created = {
        _table_name(c.statement): c.statement
        for c in sent.statements
        if c.statement.lstrip().upper().startswith("CREATE TABLE")
    }
    assert set(created) == {table.name for table in tables.metadata.sorted_tables}
    for name, statement in created.items():
        if empty_engine.dialect.name == "sqlite":
            assert "clustered_index" not in statement, name
        else:
            assert len(CLUSTERED_KEY.findall(statement)) == 1, f"{name}: {statement}"
    # MariaDB ignores the comment and keeps every key: the complete schema verifies.
    assert verification.verify_schema(empty_engine, "native_projection") == []
    with empty_engine.connect() as connection:
        inspector = sa.inspect(connection)
        for table in tables.metadata.sorted_tables:
            assert inspector.get_pk_constraint(table.name)["constrained_columns"] == table.primary_key.columns.keys()
