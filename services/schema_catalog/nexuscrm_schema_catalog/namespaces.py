"""Which namespace a row belongs to, and the visibility checks every service's rules share.

A PackInstall's namespace is fixed at install, and a WorkItem or fence never changes pack or
namespace, so a rule may resolve them before its RPC's own transaction.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from nexuscrm_runtime.authorization import Principal, require_visible
from nexuscrm_schema_catalog.tables import AdmissionFence, PackInstall, WorkItem


def _scalar(engine: Engine, statement: sa.Select[str]) -> str | None:
    with engine.connect() as connection:
        return connection.execute(statement).scalar_one_or_none()


def pack_namespace(engine: Engine, pack_install_id: str) -> str | None:
    """The namespace of the pack, None when no such pack exists."""
    return _scalar(engine, sa.select(PackInstall.c.Namespace).where(PackInstall.c.PackInstallId == pack_install_id))


def work_namespace(engine: Engine, work_id: str) -> str | None:
    """The namespace of the WorkItem's pack, None when no such WorkItem exists."""
    return _scalar(
        engine,
        sa.select(PackInstall.c.Namespace)
        .join(WorkItem, WorkItem.c.PackInstallId == PackInstall.c.PackInstallId)
        .where(WorkItem.c.WorkId == work_id),
    )


def fence_namespace(engine: Engine, fence_id: str) -> str | None:
    """The namespace the fence guards, None when no such fence exists."""
    return _scalar(engine, sa.select(AdmissionFence.c.Namespace).where(AdmissionFence.c.FenceId == fence_id))


def require_pack(engine: Engine, principal: Principal, field: str, pack_install_id: str) -> None:
    """Refuse (NOT_FOUND) unless the pack the request's ``field`` names is in the caller's namespaces."""
    require_visible(principal, pack_namespace(engine, pack_install_id), field, pack_install_id)


def require_work(engine: Engine, principal: Principal, work_id: str) -> None:
    """Refuse (NOT_FOUND) unless the WorkItem ``work_id`` names is in the caller's namespaces."""
    require_visible(principal, work_namespace(engine, work_id), "work_id", work_id)


def require_fence(engine: Engine, principal: Principal, fence_id: str) -> None:
    """Refuse (NOT_FOUND) unless the fence ``fence_id`` names guards one of the caller's namespaces."""
    require_visible(principal, fence_namespace(engine, fence_id), "fence_id", fence_id)
