"""Connectors' SQL (SQLAlchemy Core), one module per table or concern; each function takes the caller's connection.

The one rule (decisions 133 and 139, docs/performance.md "Tuning notes formerly in
docs/decisions"): a statement on a per-call path is built once, as a module constant or by an
``lru_cache``d builder keyed by the statement's shape only, and every value is a bound
parameter (lists expanding, a LIMIT and the database clock too). Call sites import a module
by name: ``from nexuscrm_connectors.queries import claims as claims_sql`` (decision 155).
"""

from typing import Any

from sqlalchemy.engine import Row

DbRow = Row[*tuple[Any, ...]]  # a result row of any shape
