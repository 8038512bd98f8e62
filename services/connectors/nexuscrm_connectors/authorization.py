"""Who may call each ConnectorsService RPC: the namespace of the pack or WorkId it names.

Claim and ListReceipts may omit the pack (every pack); only a caller of every namespace may.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Engine

from nexuscrm_runtime.authorization import Principal, Rule, require_all_namespaces
from nexuscrm_schema_catalog.namespaces import require_pack, require_work

SERVICE = "/nexuscrm.connectors.v1.ConnectorsService/"


def rules(engine: Engine) -> dict[str, Rule]:
    """The rule of every ConnectorsService method, resolving namespaces through ``engine``."""

    def by_pack(principal: Principal, request: Any) -> None:
        require_pack(engine, principal, "pack_install_id", request.pack_install_id)

    def by_work(principal: Principal, request: Any) -> None:
        require_work(engine, principal, request.work_id)

    def claim(principal: Principal, request: Any) -> None:
        if not request.pack_install_ids:
            require_all_namespaces(principal, request)
        for pack_install_id in request.pack_install_ids:
            require_pack(engine, principal, "pack_install_ids", pack_install_id)

    def list_receipts(principal: Principal, request: Any) -> None:
        if request.pack_install_id:
            by_pack(principal, request)
        else:
            require_all_namespaces(principal, request)

    by_method: dict[str, Rule] = {
        "Ingest": by_pack,
        "ExplainReceipt": by_pack,
        "ListReceipts": list_receipts,
        "Claim": claim,
        "Replay": by_work,
        "LoadInputs": by_work,
        "Heartbeat": by_work,
        "Complete": by_work,
        "Fail": by_work,
        "GetWork": by_work,
    }
    return {SERVICE + name: rule for name, rule in by_method.items()}
