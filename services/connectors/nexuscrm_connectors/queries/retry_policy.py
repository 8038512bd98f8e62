"""The statements of the retry policy (``operating.retry_policy``): a work type's row, read and written.

Every statement reads or writes ``WorkTypeRetryPolicy`` by its primary key (or its
PackInstallId prefix); each is built once (decision 139).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from nexuscrm_connectors.queries import DbRow
from nexuscrm_schema.tables import WorkTypeRetryPolicy

_GET = sa.select(WorkTypeRetryPolicy).where(
    WorkTypeRetryPolicy.c.PackInstallId == sa.bindparam("pack_install_id"),
    WorkTypeRetryPolicy.c.WorkType == sa.bindparam("work_type"),
)
_OF_PACK = (
    sa.select(WorkTypeRetryPolicy)
    .where(WorkTypeRetryPolicy.c.PackInstallId == sa.bindparam("pack_install_id"))
    .order_by(WorkTypeRetryPolicy.c.WorkType)
)
_UPDATE = (
    sa.update(WorkTypeRetryPolicy)
    .where(
        WorkTypeRetryPolicy.c.PackInstallId == sa.bindparam("pack_install_id"),
        WorkTypeRetryPolicy.c.WorkType == sa.bindparam("work_type"),
    )
    .values(
        {
            name: sa.bindparam(f"value_{name}", type_=WorkTypeRetryPolicy.c[name].type)
            for name in ("MaxAttempts", "RetryBaseSeconds", "RetryMaxSeconds", "SetBy", "Reason", "SetAt")
        }
    )
)


def work_type_retry_policy_get(connection: Connection, pack_install_id: str, work_type: str) -> DbRow | None:
    """The work type's WorkTypeRetryPolicy row (primary key); None: Connectors' settings apply."""
    return connection.execute(_GET, {"pack_install_id": pack_install_id, "work_type": work_type}).first()


def work_type_retry_policies_of_pack(connection: Connection, pack_install_id: str) -> list[DbRow]:
    """The pack's WorkTypeRetryPolicy rows by work type (a primary-key prefix range)."""
    return list(connection.execute(_OF_PACK, {"pack_install_id": pack_install_id}))


def work_type_retry_policy_set(connection: Connection, row: dict[str, Any], *, exists: bool) -> None:
    """Write the work type's policy row: an UPDATE of the row read under the pack lock, else an INSERT."""
    if exists:
        values = {f"value_{name}": value for name, value in row.items() if name not in ("PackInstallId", "WorkType")}
        connection.execute(_UPDATE, {"pack_install_id": row["PackInstallId"], "work_type": row["WorkType"], **values})
    else:
        connection.execute(sa.insert(WorkTypeRetryPolicy), row)
