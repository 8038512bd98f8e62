"""Who may call each ControlplaneService RPC: the namespace it names, or of the pack or fence."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Engine

from nexuscrm_controlplane.queries import NAMESPACE_SCOPE
from nexuscrm_runtime.authorization import Principal, Rule, require_namespace
from nexuscrm_schema_catalog.namespaces import require_fence, require_pack

SERVICE = "/nexuscrm.controlplane.v1.ControlplaneService/"


def rules(engine: Engine) -> dict[str, Rule]:
    """The rule of every ControlplaneService method, resolving namespaces through ``engine``."""

    def by_pack(principal: Principal, request: Any) -> None:
        require_pack(engine, principal, "pack_install_id", request.pack_install_id)

    def by_namespace(principal: Principal, request: Any) -> None:
        require_namespace(principal, request.namespace, "namespace")

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
        "ArmFence": arm_fence,
        "DisarmFence": by_fence,
        "ListFences": by_namespace,
        "AddFenceOverride": fence_override,
        "RemoveFenceOverride": fence_override,
        "GetDrainStatus": by_pack,
        "AuditCutover": by_pack,
        "Cutover": by_pack,
    }
    return {SERVICE + name: rule for name, rule in by_method.items()}
