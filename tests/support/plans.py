"""Reading EXPLAIN output of SQLite, MySQL/MariaDB and TiDB: what in a plan reads a growing range.

Each reader turns one engine's EXPLAIN rows into problems (empty: the plan reads index
ranges only). ``explain_problems`` EXPLAINs a captured statement on the connection's engine
and picks the reader. TiDB's format (id, estRows, task, access object, operator info) is an
operator tree drawn in the id column; ``tests/schema_catalog/unit/test_tidb_plans.py`` checks the reader on
plan shapes of TiDB's documentation for our statements.
"""

from __future__ import annotations

import dataclasses
import re
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from nexuscrm_runtime.database import is_sqlite
from nexuscrm_runtime.prerequisites import is_tidb

# Tables whose size grows with history: a full scan or a sort over one of them is a failure.
GROWING_TABLES = frozenset(
    {"Event", "EventPayload", "WorkItem", "IngressReceipt", "PrunedReceipt", "PrunedWork", "ClaimPause"}
)

# A table under an alias (`"WorkItem" AS predecessor`, or backquoted on MySQL): plans name the
# alias, so each reader maps it back to its table before judging the row.
_TABLE_ALIAS = re.compile(r'[`"](?P<table>\w+)[`"]\s+AS\s+[`"]?(?P<alias>\w+)[`"]?', re.IGNORECASE)

NO_ALIASES: Mapping[str, str] = types.MappingProxyType({})

_TIDB_SCANS = frozenset({"TableFullScan", "IndexFullScan", "TableRangeScan", "IndexRangeScan"})
_TIDB_ID = re.compile(r"^(?P<name>[A-Za-z_]+?)_\d+(?:\((?:Build|Probe)\))?$")


def table_aliases(statement: str) -> dict[str, str]:
    """The growing tables ``statement`` names under an alias: alias -> table."""
    return {
        match["alias"]: match["table"] for match in _TABLE_ALIAS.finditer(statement) if match["table"] in GROWING_TABLES
    }


def problems_mysql(rows: Iterable[Mapping[Any, Any]], aliases: Mapping[str, str] = NO_ALIASES) -> list[str]:
    """Full scans (type ALL or index) and filesorts of growing tables in a MySQL/MariaDB EXPLAIN."""
    found = []
    for row in rows:
        table, access, extra = aliases.get(row["table"], row["table"]), row["type"], row["Extra"] or ""
        if table not in GROWING_TABLES:
            continue  # derived tables, unions and small control tables
        if access in ("ALL", "index"):
            found.append(f"full {'table' if access == 'ALL' else 'index'} scan of {table}")
        if "Using filesort" in extra:
            found.append(f"filesort over {table} ({access} access on {row['key']})")
    return found


def problems_sqlite(rows: Iterable[Sequence[Any]], aliases: Mapping[str, str] = NO_ALIASES) -> list[str]:
    """Full scans, unconstrained index walks and ORDER BY sorts of growing tables in a SQLite plan.

    ``SEARCH T USING INDEX i`` with no constraint is a MIN/MAX read walking index ``i`` in
    order until a row matches the rest of the WHERE: the whole index when none does.

    A tie sort (``USE TEMP B-TREE FOR RIGHT PART OF ORDER BY``) passes: SQLite's index entries
    end with the rowid, not the primary key, so a primary-key tie-breaker sorts the rows that
    tie on the index's own order, never the table (docs/performance.md names each one).
    A sort at a level that reads only subqueries passes (it orders a subquery's rows, as a
    window function over a limited page's candidates does), like a derived table in MySQL's
    reader.
    """
    rows = list(rows)
    subqueries = {row[3].split(maxsplit=1)[1] for row in rows if row[3].startswith(("CO-ROUTINE", "MATERIALIZE"))}
    reads_a_table = {
        row[1]
        for row in rows
        if row[3].startswith(("SCAN ", "SEARCH "))
        and row[3].split()[1] not in subqueries
        and not row[3].split()[1].startswith("(subquery-")
    }
    found = []
    for row in rows:
        detail: str = row[3]
        words = detail.split()
        growing = len(words) > 1 and aliases.get(words[1], words[1]) in GROWING_TABLES
        if words[:1] == ["SCAN"] and growing:
            found.append(detail)
        if words[:1] == ["SEARCH"] and growing and "(" not in detail:
            found.append(f"{detail} (no index constraint: a MIN/MAX walk of the whole index)")
        if "TEMP B-TREE FOR ORDER BY" in detail and row[1] in reads_a_table:
            found.append(detail)
    return found


@dataclasses.dataclass
class TidbOperator:
    """One row of a TiDB plan: the operator, its table (if it reads one) and its children."""

    name: str  # IndexRangeScan, HashJoin, Batch_Point_Get, ...
    depth: int
    table: str | None
    info: str
    children: list[TidbOperator] = dataclasses.field(default_factory=list)

    def walk(self) -> Iterable[TidbOperator]:
        yield self
        for child in self.children:
            yield from child.walk()

    def growing_scans(self) -> list[str]:
        """The growing tables this subtree scans by range or in full."""
        return sorted({op.table for op in self.walk() if op.name in _TIDB_SCANS and op.table in GROWING_TABLES})


def parse_tidb(rows: Iterable[Sequence[Any]], aliases: Mapping[str, str] = NO_ALIASES) -> list[TidbOperator]:
    """The operator trees of TiDB EXPLAIN rows (id, estRows, task, access object, operator info)."""
    roots: list[TidbOperator] = []
    stack: list[TidbOperator] = []
    for row in rows:
        drawn = str(row[0])
        label = drawn.lstrip("│├└─ ")
        match = _TIDB_ID.match(label)
        if match is None:
            raise ValueError(f"not a TiDB plan row: {drawn!r}")
        table = re.search(r"table:(\w+)", str(row[3] or ""))
        op = TidbOperator(
            name=match["name"],
            depth=len(drawn) - len(label),
            table=aliases.get(table[1], table[1]) if table else None,
            info=str(row[4] or ""),
        )
        while stack and stack[-1].depth >= op.depth:
            stack.pop()
        (stack[-1].children if stack else roots).append(op)
        stack.append(op)
    return roots


def problems_tidb(rows: Iterable[Sequence[Any]], aliases: Mapping[str, str] = NO_ALIASES) -> list[str]:
    """What reads a growing range in a TiDB plan.

    - ``TableFullScan`` / ``IndexFullScan`` of a growing table;
    - ``Sort`` / ``TopN`` over a scan of one (an order the index does not give: on TiDB a
      non-clustered primary key as tie-breaker, for instance);
    - ``HashJoin`` / ``MergeJoin`` over a scan of one: a decorrelated ``[NOT] EXISTS`` or join
      that reads a whole range where an index probe per row would do (keep it correlated);
    - a ``GROUP BY`` aggregation over a scan of one without a ``Limit`` above it: TiDB has no
      loose index scan, so a DISTINCT over an index prefix reads every row of the range.
    """
    found: list[str] = []

    def visit(op: TidbOperator, limited: bool) -> None:
        scans = ", ".join(op.growing_scans())
        if op.name in ("TableFullScan", "IndexFullScan") and op.table in GROWING_TABLES:
            found.append(f"{op.name} of {op.table}")
        elif op.name in ("Sort", "TopN") and scans:
            found.append(f"{op.name} over {scans}")
        elif op.name in ("HashJoin", "MergeJoin") and scans:
            found.append(f"{op.name} ({op.info.split(',')[0]}) reads a range of {scans}")
        elif op.name in ("HashAgg", "StreamAgg") and "group by:" in op.info and scans and not limited:
            found.append(f"{op.name} groups a whole range of {scans} (no loose index scan)")
        for child in op.children:
            visit(child, limited or op.name in ("Limit", "TopN"))

    for root in parse_tidb(rows, aliases):
        visit(root, False)
    return found


def explain_problems(connection: sa.Connection, statement: str, parameters: Any) -> list[str]:
    """EXPLAIN ``statement`` on the connection's engine and list what in its plan reads a growing range."""
    aliases = table_aliases(statement)
    if is_sqlite(connection.engine):
        return problems_sqlite(connection.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters).all(), aliases)
    version = str(connection.execute(sa.select(sa.func.version())).scalar_one())
    result = connection.exec_driver_sql("EXPLAIN " + statement, parameters)
    if is_tidb(version):
        return problems_tidb(result.all(), aliases)
    return problems_mysql(result.mappings().all(), aliases)
