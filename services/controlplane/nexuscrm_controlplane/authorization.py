"""Who may call each ControlplaneService RPC: the namespace it names, or of the pack or fence."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Engine

from nexuscrm_controlplane import fences, queries
from nexuscrm_controlplane.errors import UnknownFence
from nexuscrm_runtime.authorization import (
    Principal,
    Rule,
    allow_any_principal,
    require_all_namespaces,
    require_namespace,
    require_visible,
)
from nexuscrm_schema.tables import NAMESPACE_SCOPE

SERVICE = "/nexuscrm.controlplane.v1.ControlplaneService/"


def require_pack(engine: Engine, principal: Principal, field: str, pack_install_id: str) -> None:
    """Refuse (NOT_FOUND) unless the pack the request's ``field`` names is in the caller's namespaces.

    A pack's namespace is fixed at install and a fence never changes namespace, so the rules may
    read them before the RPC's own transaction.
    """
    with engine.connect() as connection:
        namespace = queries.pack_namespace(connection, pack_install_id)
    require_visible(principal, namespace, field, pack_install_id)


def require_fence(engine: Engine, principal: Principal, fence_id: str) -> None:
    """Refuse (NOT_FOUND) unless the fence ``fence_id`` names guards one of the caller's namespaces.

    ``fence_id`` may be a short id (``fences.resolve_fence_id``); an ambiguous one is refused
    with INVALID_ARGUMENT before anything else.
    """
    with engine.connect() as connection:
        try:
            namespace = queries.fence_namespace(connection, fences.resolve_fence_id(connection, fence_id))
        except UnknownFence:
            namespace = None
    require_visible(principal, namespace, "fence_id", fence_id)


def rules(engine: Engine) -> dict[str, Rule]:
    """The rule of every ControlplaneService method, resolving namespaces through ``engine``."""

    def by_pack(principal: Principal, request: Any) -> None:
        require_pack(engine, principal, "pack_install_id", request.pack_install_id)

    def by_namespace(principal: Principal, request: Any) -> None:
        require_namespace(principal, request.namespace, "namespace")

    def by_namespace_or_all(principal: Principal, request: Any) -> None:
        if request.namespace:
            by_namespace(principal, request)
        else:
            require_all_namespaces(principal, request)

    def arm_fence(principal: Principal, request: Any) -> None:
        by_namespace(principal, request)
        if request.scope not in ("", NAMESPACE_SCOPE):
            require_pack(engine, principal, "scope", request.scope)

    def by_fence(principal: Principal, request: Any) -> None:
        require_fence(engine, principal, request.fence_id)

    def fence_override(principal: Principal, request: Any) -> None:
        by_fence(principal, request)
        by_pack(principal, request)

    by_method: dict[str, Rule] = {
        "InstallPack": by_namespace,
        "ActivatePack": by_pack,
        "GetProtocol": by_pack,
        "GetPack": by_pack,
        "FindPacks": by_namespace,
        "ListPacks": by_namespace_or_all,
        "ArmFence": arm_fence,
        "DisarmFence": by_fence,
        "ListFences": by_namespace,
        "AddFenceOverride": fence_override,
        "RemoveFenceOverride": fence_override,
        "GetDrainStatus": by_pack,
        "AuditCutover": by_pack,
        "Cutover": by_pack,
        "GetBuildInfo": allow_any_principal,
    }
    return {SERVICE + name: rule for name, rule in by_method.items()}
