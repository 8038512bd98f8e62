"""Every SQL statement of the product is a SQLAlchemy construct with bound parameters.

Scans the source of libs/ and services/ for SQL written as a string: ``text(...)``,
``exec_driver_sql(...)`` and ``execute(<string>)``. The only ones allowed are session settings
whose values come from our own configuration, never from a request, and the bulk INSERT whose
SQL a construct compiled; each is listed with why.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = Counter(
    {
        # SQLite pragmas (constants and the configured busy timeout), and BEGIN IMMEDIATE.
        "libs/runtime/nexuscrm_runtime/database.py": 3,
        "libs/runtime/nexuscrm_runtime/sqlite_writer.py": 1,
        # An INSERT compiled from a SQLAlchemy construct, executed with bound rows (decision 138).
        "libs/runtime/nexuscrm_runtime/bulk.py": 1,
        # The cutover's lock wait bounded by its own deadline (an integer it computed).
        "services/controlplane/nexuscrm_controlplane/cutover.py": 2,
        # VERSION() on a new raw connection, and SHOW VARIABLES (no construct exists) with the
        # names bound; the TiDB session settings are constants of the module.
        "libs/runtime/nexuscrm_runtime/prerequisites.py": 2,
        # SELECT 1, SHOW VARIABLES and SHOW STATUS, constants: whether the database can be used now,
        # and whether a Galera node is ready (readiness and a multi-host DSN's failover; decisions 182, 187).
        "libs/runtime/nexuscrm_runtime/readiness.py": 3,
        # The causal-read barrier, a constant (decision 187); wsrep_on is readiness's question.
        "libs/runtime/nexuscrm_runtime/causal.py": 1,
    }
)


def _is_string(node: ast.expr) -> bool:
    literal = isinstance(node, ast.Constant) and isinstance(node.value, str)
    return literal or isinstance(node, ast.JoinedStr | ast.BinOp)


def _sql_strings(tree: ast.AST) -> int:
    found = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name in ("text", "exec_driver_sql") or (name == "execute" and node.args and _is_string(node.args[0])):
            found += 1
    return found


def test_sql_is_only_built_from_sqlalchemy_constructs() -> None:
    found = Counter(
        {
            str(path.relative_to(ROOT)): count
            for top in ("libs", "services")
            for path in (ROOT / top).rglob("*.py")
            if (count := _sql_strings(ast.parse(path.read_text(), str(path))))
        }
    )
    assert found == ALLOWED


def test_the_scan_finds_sql_strings() -> None:
    source = 'conn.execute(sa.text("SELECT 1")); conn.exec_driver_sql("x"); cur.execute(f"SET {a}"); conn.execute(q)'
    assert _sql_strings(ast.parse(source)) == 3  # text, exec_driver_sql and the f-string; not a construct
