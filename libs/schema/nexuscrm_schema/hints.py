"""Optimizer hints the runtime statements carry for TiDB; MariaDB and MySQL read them as comments.

TiDB decorrelates a correlated ``[NOT] EXISTS`` into a semi join by default, and may then run
it as a hash join that reads the inner table's whole range for the pack (a range that grows
with history) where one index probe per outer row reads a handful of rows. ``NO_DECORRELATE``
(TiDB v6.2+) keeps the subquery correlated: an Apply with an index probe per outer row. The
plan test reads TiDB's EXPLAIN format and refuses such a hash join (``tests/support/plans.py``).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

NO_DECORRELATE = "/*+ NO_DECORRELATE() */"


def probe_exists(subquery: sa.Select[Any]) -> sa.Exists:
    """``EXISTS (subquery)`` evaluated per outer row by index probe on TiDB, never as a join over a range."""
    return subquery.prefix_with(NO_DECORRELATE, dialect="mysql").exists()
